"""Real Metal: the Bridge over libobjc (``bridge``) and how values cross into C through ctypes (``marshal``)."""
