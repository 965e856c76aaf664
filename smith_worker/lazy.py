"""Lazy package exports: a package's names import their module on first use (PEP 562 ``__getattr__``).

Used by the subpackages whose modules need optional libraries (``llm`` needs
httpx, ``mcp`` the MCP SDK's companions), so importing one light module of
them (``smith_worker.llm.types``) does not load the rest.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps each public name to its submodule
    (relative to ``package``). An unknown name raises ``AttributeError`` as usual."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
