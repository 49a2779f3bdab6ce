"""Operators: conv family."""
