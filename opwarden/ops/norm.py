"""Operators: norm family."""
