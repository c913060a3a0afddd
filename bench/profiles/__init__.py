"""The profiles of ``python -m bench.profile``, one module per question."""
