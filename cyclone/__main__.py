"""``python -m cyclone``: the console script."""

from __future__ import annotations

from cyclone.cli import main

raise SystemExit(main())
