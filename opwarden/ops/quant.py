"""Operators: quant family."""
