"""Operators: contrib family."""
