"""Operators: loss family."""
