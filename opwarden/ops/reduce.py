"""Operators: reduce family."""
