"""Triton kernels. Importing this package imports triton; set TRITON_INTERPRET before that on CPUs."""
