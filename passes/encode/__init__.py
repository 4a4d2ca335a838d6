"""The ``encode`` pass: a SUBMIT read into commands and command buffers (``submit``), then the message chain (``encode``)."""
