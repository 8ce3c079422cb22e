"""Fake AITER package (missing variant) for the adapter and policy tests."""
