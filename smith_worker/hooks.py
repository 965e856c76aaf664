"""Worker-side hooks (docs/architecture.md, Hooks and logs).

Hooks are best-effort observers registered on the app (all agents) or on one
agent. Every call goes through :func:`invoke_hook`, which awaits async hooks,
catches and logs any exception and never lets a hook fail a turn. The same
facts also reach the caller as stream events.

A hook taking two positional parameters is called ``hook(arg, ctx)``: ``ctx`` is the
:class:`HookContext` of the turn the hook fires in (its caller context as ``ctx.context``,
docs/architecture.md, Caller context), or None outside a turn (an MCP server's event).
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("agent_smith")

Hook = Callable[..., Any] | None


@dataclass(frozen=True)
class HookContext:
    """The turn a hook fires in: ``turn_id`` (the root turn's), ``conversation_id``, ``agent`` (the root
    turn's agent) and ``context``, its caller context as tools get it (``ToolContext.context``)."""

    turn_id: str
    conversation_id: str
    agent: str
    context: Any = None


#: The turn the running task serves (set by the turn lifecycle as an attempt starts; sub-agents and the
#: tasks a turn starts inherit it).
current_turn: contextvars.ContextVar[HookContext | None] = contextvars.ContextVar("smith_hook_turn", default=None)


def _wants_context(hook: Callable[..., Any]) -> bool:
    """Whether ``hook`` takes a second positional parameter (the :class:`HookContext`)."""
    try:
        parameters = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2


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
    """Call ``hook(arg)``, or ``hook(arg, ctx)`` for a hook taking two positional parameters (``ctx``: the
    :data:`current_turn`), awaiting it if async; log and swallow any exception."""
    if hook is None:
        return
    try:
        result = hook(arg, current_turn.get()) if _wants_context(hook) else hook(arg)
        if inspect.isawaitable(result):
            await result
    except Exception:  # hooks are observers: a failing hook never fails the turn
        logger.warning("hook %r raised; ignored", getattr(hook, "__name__", hook), exc_info=True)


async def fire(name: str, arg: Any, *hook_sets: Hooks) -> None:
    """Invoke hook ``name`` of every hook set given (app-level first, then agent-level)."""
    for hooks in hook_sets:
        await invoke_hook(getattr(hooks, name), arg)
