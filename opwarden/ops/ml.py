"""Operators: ml family."""
