"""Operators: control family."""
