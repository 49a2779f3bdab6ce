"""opwarden/execute"""
