"""The command line ``mtlir`` (``main``): ``lower`` and ``run``, their steps and their errors."""
