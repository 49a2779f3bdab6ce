"""Operators: transformer family."""
