"""The ``encode`` pass: a SUBMIT's commands read and checked (``submit``) into records (``commands``), its events
checked (``events``), cut into command buffers (``spans``), its link-time placeholders and per-submit patches
(``placeholders``), the message nodes (``messages``), the message chain (``encode``)."""
