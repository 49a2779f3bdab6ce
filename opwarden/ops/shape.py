"""Operators: shape family."""
