"""Helpers for tests of HTTP servers started as processes."""

from __future__ import annotations

import httpx


def serves(url: str) -> bool:
    """True when ``GET url`` answers 200 (False while the server is still starting)."""
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
