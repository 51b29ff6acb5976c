"""The SQLite driver's old import path (memory.store.driver), kept for callers: the driver
lives in memory/store/sqlite/driver.py."""

from __future__ import annotations

from speakermem.memory.store.errors import DriverUnavailable
from speakermem.memory.store.sqlite.driver import (
    Driver,
    DriverName,
    connect_sync,
    open_async,
    pick_driver,
    stdlib_can_load_extensions,
)

__all__ = [
    "Driver",
    "DriverName",
    "DriverUnavailable",
    "connect_sync",
    "open_async",
    "pick_driver",
    "stdlib_can_load_extensions",
]
