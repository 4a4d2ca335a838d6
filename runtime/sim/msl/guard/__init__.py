"""Bounds checks the translator adds to every buffer and array access of a kernel."""
