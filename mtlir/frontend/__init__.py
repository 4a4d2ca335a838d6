"""The front end: queue graphs built from Python (``queue``) or imported from a recorded trace (``trace``)."""
