"""The Program (the product of the ``linearize`` pass, the input of the executors) in one module per idea:
``instructions`` (the instruction set, one record per opcode), ``payloads`` (placeholder payloads and the message
lists graph nodes carry), ``program`` (``Program`` itself: registers, constants, listings)."""
