"""link: a Program's placeholders become device objects once (``link``, ``kinds``, ``state``), held by ``Linked``."""
