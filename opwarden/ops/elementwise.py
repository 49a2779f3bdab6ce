"""Operators: elementwise family."""
