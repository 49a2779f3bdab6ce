"""Operators: signal family."""
