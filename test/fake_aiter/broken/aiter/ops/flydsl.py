"""Fake ``aiter.ops.flydsl`` whose import fails, as it does when the ROCm runtime is broken."""

raise RuntimeError("fake aiter: HIP runtime failed to initialise")
