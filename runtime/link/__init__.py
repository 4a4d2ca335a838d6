"""link: a Program's placeholders become device objects once: the driver (``link``), the state of one run
(``state``), one builder per kind (``kinds``), the threadgroup checks (``threadgroups``); ``Linked`` holds them."""
