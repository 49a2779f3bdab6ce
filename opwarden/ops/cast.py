"""Operators: cast family."""
