"""The ``encode`` pass: a SUBMIT read into commands and command buffers (``submit``), its link-time placeholders
and per-submit patches (``placeholders``), the message nodes (``messages``), the message chain (``encode``)."""
