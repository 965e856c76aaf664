"""Per-turn overrides of an agent's settings (docs/architecture.md, Per-turn overrides).

``send(..., instructions=..., tool_choice=..., max_iterations=..., max_tokens=..., tools=[...], model=...)``
changes the model requests of that one turn, never the next turn's. The client checks each value's
shape here, before anything reaches Redis (:func:`check_overrides` raises
:class:`~smith_client.errors.InvalidRequestError` naming the field); what only the worker knows (the
agent's tools, its caps, the configured model names) is checked by the worker as the turn starts, which
fails the turn with a typed error naming the field (``smith_worker/agent/overrides.py``).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from smith_client.errors import InvalidRequestError

#: The chat-completions ``tool_choice`` keywords; any other ``tool_choice`` names one tool.
TOOL_CHOICE_KEYWORDS = ("auto", "none", "required")
#: A tool name as chat-completions servers accept it (the worker's tool-name rule).
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: Largest ``max_iterations`` a caller may ask (the agent's own cap applies too, at the worker).
MAX_ITERATIONS = 10_000
#: Largest ``max_tokens``: a Redis integer (the turn's token counters are INCRBY'd, https://redis.io/docs/latest/commands/incrby/).
MAX_TOKENS = 2**63 - 1
#: Largest ``instructions`` accepted, in UTF-8 bytes.
MAX_INSTRUCTIONS_BYTES = 100_000
#: Longest ``model`` name accepted, in characters.
MAX_MODEL_NAME = 256
#: Most ``tools`` names accepted.
MAX_TOOLS = 512


class TurnOverrides(BaseModel):
    """The overrides of one turn, as its ``run_turn`` job carries them (every field None: not overridden).

    ``instructions``: text appended to the agent's system prompt; ``tool_choice``: ``auto``, ``none``,
    ``required`` or one tool's name; ``max_iterations``: model calls of the turn (≤ the agent's
    ``max_iterations``); ``max_tokens``: the turn's budget of reported tokens (≤ the agent's
    ``max_total_tokens`` when it has one); ``tools``: the names of the agent's tools this turn may offer and
    call (a subset); ``model``: the name of another configured model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    instructions: str | None = None
    tool_choice: str | None = None
    max_iterations: int | None = None
    max_tokens: int | None = None
    tools: list[str] | None = None
    model: str | None = None


def _positive_int(value: Any, field: str, most: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (most is not None and value > most):
        bound = f" of at most {most}" if most is not None else ""
        raise InvalidRequestError(f"{field} must be a positive integer{bound}, got {value!r:.80}", field=field)
    return value


def _tool_name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not TOOL_NAME.match(value):
        raise InvalidRequestError(
            f"{field} must name a tool ({TOOL_NAME.pattern}) or be one of {TOOL_CHOICE_KEYWORDS}, got {value!r:.80}",
            field=field,
        )
    return value


def _check_instructions(instructions: Any) -> None:
    if not isinstance(instructions, str) or not instructions.strip():
        raise InvalidRequestError("instructions must be a non-blank string", field="instructions")
    try:
        size = len(instructions.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidRequestError("instructions is not valid Unicode", field="instructions") from exc
    if size > MAX_INSTRUCTIONS_BYTES:
        raise InvalidRequestError(
            f"instructions is larger than {MAX_INSTRUCTIONS_BYTES} bytes (UTF-8)", field="instructions"
        )


def _check_tools(tools: Any) -> list[str]:
    if not isinstance(tools, (list, tuple)) or len(tools) > MAX_TOOLS:
        raise InvalidRequestError(f"tools must be a list of at most {MAX_TOOLS} tool names", field="tools")
    for name in tools:
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise InvalidRequestError(f"tools: {name!r:.80} is not a tool name ({TOOL_NAME.pattern})", field="tools")
    if len(set(tools)) != len(tools):
        raise InvalidRequestError("tools must not name a tool twice", field="tools")
    return list(tools)


def check_overrides(
    instructions: Any = None,
    tool_choice: Any = None,
    max_iterations: Any = None,
    max_tokens: Any = None,
    tools: Any = None,
    model: Any = None,
) -> TurnOverrides | None:
    """The checked overrides of a turn request, None when none is given.

    Shapes (docs/architecture.md, Per-turn overrides): ``instructions`` a non-blank string of at most
    :data:`MAX_INSTRUCTIONS_BYTES` UTF-8 bytes; ``tool_choice`` one of :data:`TOOL_CHOICE_KEYWORDS` or a
    tool name (one of ``tools`` when both are given); ``max_iterations`` an integer in [1,
    :data:`MAX_ITERATIONS`]; ``max_tokens`` an integer in [1, :data:`MAX_TOKENS`]; ``tools`` a list of
    distinct tool names (at most :data:`MAX_TOOLS`; empty: no tools this turn); ``model`` a non-blank name of at most
    :data:`MAX_MODEL_NAME` characters. Raises :class:`InvalidRequestError` naming the field.
    """
    if instructions is not None:
        _check_instructions(instructions)
    if max_iterations is not None:
        _positive_int(max_iterations, "max_iterations", MAX_ITERATIONS)
    if max_tokens is not None:
        _positive_int(max_tokens, "max_tokens", MAX_TOKENS)
    if tools is not None:
        tools = _check_tools(tools)
    if tool_choice is not None and tool_choice not in TOOL_CHOICE_KEYWORDS:
        _tool_name(tool_choice, "tool_choice")
        if tools is not None and tool_choice not in tools:
            raise InvalidRequestError(f"tool_choice {tool_choice!r} is not one of tools", field="tool_choice")
    if model is not None and (not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_NAME):
        raise InvalidRequestError(
            f"model must be a non-blank name of at most {MAX_MODEL_NAME} characters, got {model!r:.80}", field="model"
        )
    given = {
        "instructions": instructions,
        "tool_choice": tool_choice,
        "max_iterations": max_iterations,
        "max_tokens": max_tokens,
        "tools": tools,
        "model": model,
    }
    if all(value is None for value in given.values()):
        return None
    return TurnOverrides(**given)
