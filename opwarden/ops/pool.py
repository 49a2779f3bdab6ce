"""Operators: pool family."""
