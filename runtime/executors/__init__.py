"""Executors of a Program: the plain ``interpreter`` and the ``replay`` compiled to one Python function."""
