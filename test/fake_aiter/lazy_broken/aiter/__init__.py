"""Fake AITER package (lazy_broken variant) for the adapter and policy tests."""
