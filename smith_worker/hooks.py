"""Worker-side hooks (docs/architecture.md, Hooks and logs).

Hooks are best-effort observers registered on the app (all agents) or on one
agent. Every call goes through :func:`invoke_hook`, which awaits async hooks,
catches and logs any exception and never lets a hook fail a turn. The same
facts also reach the caller as stream events.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("agent_smith")

Hook = Callable[[Any], Any] | None


@dataclass
class Hooks:
    """Optional callbacks; each takes one argument (a message, tool call, event or error)."""

    on_message: Hook = None
    on_tool_call: Hook = None
    on_tool_result: Hook = None
    on_stream_event: Hook = None
    on_mcp_event: Hook = None
    on_error: Hook = None


async def invoke_hook(hook: Hook, arg: Any) -> None:
    """Call ``hook(arg)`` (awaiting it if async); log and swallow any exception."""
    if hook is None:
        return
    try:
        result = hook(arg)
        if inspect.isawaitable(result):
            await result
    except Exception:  # hooks are observers: a failing hook never fails the turn
        logger.warning("hook %r raised; ignored", getattr(hook, "__name__", hook), exc_info=True)


async def fire(name: str, arg: Any, *hook_sets: Hooks) -> None:
    """Invoke hook ``name`` of every hook set given (app-level first, then agent-level)."""
    for hooks in hook_sets:
        await invoke_hook(getattr(hooks, name), arg)
