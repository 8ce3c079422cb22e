"""Fake aiter.ops."""
