"""Operators: image family."""
