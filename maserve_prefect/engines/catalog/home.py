"""Where user catalog entries live: `$MASERVE_HOME` (default `~/.maserve`)."""

from __future__ import annotations

import os
from pathlib import Path


def maserve_home() -> Path:
    """`$MASERVE_HOME`, else `~/.maserve`."""
    env = os.environ.get("MASERVE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".maserve"


def user_devices_dir() -> Path:
    return maserve_home() / "devices"


def user_models_dir() -> Path:
    return maserve_home() / "models"
