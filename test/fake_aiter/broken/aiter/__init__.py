"""Fake AITER package (broken variant) for the adapter and policy tests."""
