"""Fake AITER package (reference variant) for the adapter and policy tests."""
