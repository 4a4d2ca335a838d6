"""Running Metal kernels for real: the OpenCL kernel ``runner`` and a Python one for tests (``pyrunner``)."""
