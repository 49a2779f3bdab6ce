"""Operators: index family."""
