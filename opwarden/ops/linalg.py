"""Operators: linalg family."""
