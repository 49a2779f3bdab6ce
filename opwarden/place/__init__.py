"""opwarden/place"""
