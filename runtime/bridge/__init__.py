"""The Bridge seam between a Program and a device, sending messages by selector name, and recording."""
