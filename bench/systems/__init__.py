"""The systems ``python -m bench.peers`` measures: raw and cyclone, and the peers a user
would pick instead, each through its own documented API with its defaults."""

from __future__ import annotations

from bench.systems.async_peers import Chancy, ChancyEager, Oban, PgQueuer
from bench.systems.baseline import Cyclone, Raw
from bench.systems.sync_peers import Dbos, Procrastinate
from bench.systems.system import AsyncSystem, System

SYSTEMS: dict[str, type[System]] = {
    cls.name: cls
    for cls in (Raw, Cyclone, Procrastinate, Dbos, PgQueuer, Chancy, ChancyEager, Oban)
}
"""Every system by its name, in the table's order."""

__all__ = ["SYSTEMS", "AsyncSystem", "System"]
