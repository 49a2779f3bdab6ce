"""Operators: string family."""
