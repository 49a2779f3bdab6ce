"""Operators: rnn family."""
