"""Where HiSpec's files live: the repository's assets and the user's cache."""

from __future__ import annotations

import os
from pathlib import Path

# assets/ beside the package: trained exit heads, the default-ee adapter, benchmark records
ASSETS = Path(__file__).resolve().parent.parent / "assets"


def cache_root() -> Path:
    """The user's HiSpec cache (converted default model, trained heads): $HISPEC_CACHE or ~/.cache/hispec."""
    return Path(os.environ.get("HISPEC_CACHE", Path.home() / ".cache" / "hispec"))
