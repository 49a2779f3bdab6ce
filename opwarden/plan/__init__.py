"""opwarden/plan"""
