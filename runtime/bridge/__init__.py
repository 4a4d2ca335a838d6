"""The Bridge seam between a Program and a device (``bridge``), sending messages by selector name (``messenger``),
recording them (``recording``: RecordingBridge and its FakeDevice), and the host memory of in-process devices
(``memory``)."""
