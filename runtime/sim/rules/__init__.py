"""Metal's rules (METAL.md §3) as data (``rule``) and the checks that look at more than one call (``checks``)."""
