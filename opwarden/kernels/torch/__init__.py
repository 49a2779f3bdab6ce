"""opwarden/kernels/torch"""
