"""mtlir."""
