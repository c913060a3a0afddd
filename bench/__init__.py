"""cyclone's benchmark suite: run by hand with ``python -m bench.run``; never part of the tests."""

from __future__ import annotations
