"""Payloads of the two arq job functions: ``run_turn`` and ``run_tool``.

Both are JSON (see :mod:`smith_client.serialization`) and carry no secrets:
workers read API keys from their own configuration (docs/architecture.md, Limits and defaults).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from smith_client.messages import ToolCall, UserMessage
from smith_client.overrides import TurnOverrides

RUN_TURN = "run_turn"
RUN_TOOL = "run_tool"

#: Largest outcome JSON (bytes) a tool worker's reply carries; a larger one is read from its result key.
REPLY_INLINE_MAX = 64 * 1024


#: Request fields the framework owns; ``Sampling.extra`` may not set them (docs/architecture.md, Model requests).
RESERVED_REQUEST_KEYS = frozenset({"model", "messages", "tools", "tool_choice", "stream"})


class Sampling(BaseModel):
    """Per-turn model options (the worker's ``SamplingParams``); ``None`` / empty means "the server decides".

    ``temperature`` in [0, 2], ``top_p`` in [0, 1], ``max_tokens`` ≥ 1 (tokens),
    ``stop`` up to 16 strings, ``response_format`` passed through, ``extra``
    provider-specific fields merged last (JSON values; no reserved key, see
    :data:`RESERVED_REQUEST_KEYS`: the client refuses them before a turn is
    enqueued, the worker's LLM client with a ``ConfigurationError``).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: list[str] = Field(default_factory=list, max_length=16)
    response_format: dict[str, Any] | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    def reserved_keys(self) -> list[str]:
        """Reserved request fields that ``extra`` tries to set (refused, docs/architecture.md, Model requests)."""
        return sorted(RESERVED_REQUEST_KEYS & self.extra.keys())


class TurnJob(BaseModel):
    """The ``run_turn`` payload: one user message for one conversation.

    ``sampling`` is a dict of the worker's ``SamplingParams`` fields (temperature,
    top_p, max_tokens, stop, response_format, extra); ``stream`` overrides the
    agent's streaming default for this turn.
    ``submitted_at`` is epoch seconds. ``has_context``: the caller gave a context, stored apart
    (:meth:`~smith_client.keys.Keys.turn_context`, never in this payload: docs/architecture.md, Caller context).
    ``agent_given`` is False when the caller named no agent: the worker then runs the conversation's current
    agent (a handoff's, docs/architecture.md, Handoffs) if there is one, else ``agent``; ``overrides`` are the
    turn's :class:`~smith_client.overrides.TurnOverrides` (docs/architecture.md, Per-turn overrides).
    ``trace`` is the W3C trace context (``traceparent``, ``tracestate``) of the span that sent the turn, None
    when the sender does not trace; it is stored with the job in the turn's state (``job``), so every attempt
    of the turn continues the same trace (docs/architecture.md, Tracing). It is not part of the request's
    fingerprint. ``tenant`` is who the turn is for (docs/architecture.md, Tenants; None: no tenant), which its
    sub-agents share: it labels its events, metrics, usage counts and spans.
    """

    turn_id: str
    conversation_id: str
    agent: str = "default"
    message: UserMessage
    sampling: dict[str, Any] | None = None
    stream: bool | None = None
    submitted_at: float = 0.0
    has_context: bool = False
    agent_given: bool = True
    overrides: TurnOverrides | None = None
    trace: dict[str, str] | None = None
    tenant: str | None = None


class ToolJob(BaseModel):
    """The ``run_tool`` payload: one tool call of one step of a turn.

    ``timeout`` is the tool's budget in seconds; ``reply_channel`` is the pub/sub
    channel of the waiting turn worker; ``result_key`` where the result is
    stored; ``result_max_bytes`` the agent's cap on the content (UTF-8 bytes);
    ``idempotent`` whether the call may be re-run when its tool worker died;
    ``source`` the id of the tool source that runs the call (``app``,
    ``source:<alias>``, ``skill:<name>``), which the tool worker runs it
    through; ``skill`` the declared name of the skill offering the tool (""
    for the agent's own tools), what tool workers older than ``source`` find
    it by. A job without ``source`` (enqueued by a worker older than it) is
    resolved by its tool's name and ``skill``, as those workers did; ``position``
    the calling agent's place in the sub-agent tree (``""`` for the root agent,
    see :func:`smith_client.keys.tree_position`), part of the call's job id and keys; ``call_path``
    the calling agent's ``call_path`` for the ``tool.result`` event (see :mod:`smith_client.events`);
    ``retry`` how many corrections in a row the tool asked of the model before this call and
    ``tool_retries`` how many the agent allows (docs/architecture.md, Tool calls; 0 from turn workers older
    than these fields, which do not count them: none allowed); ``trace`` the W3C trace context of the calling
    agent's span (None when the turn worker does not trace; docs/architecture.md, Tracing); ``tenant`` the
    turn's (:class:`TurnJob`; None: none), whose usage buckets count the MCP sampling the call serves.
    """

    turn_id: str
    conversation_id: str
    agent: str
    agent_path: list[str] = Field(default_factory=list)
    call_path: list[str] = Field(default_factory=list)
    position: str = ""
    step: int
    index: int
    call: ToolCall
    timeout: float
    reply_channel: str
    result_key: str
    result_max_bytes: int = 64 * 1024
    idempotent: bool = False
    source: str = ""
    skill: str = ""
    retry: int = Field(default=0, ge=0)
    tool_retries: int = Field(default=0, ge=0)
    trace: dict[str, str] | None = None
    tenant: str | None = None


class ToolOutcome(BaseModel):
    """A finished tool call as stored under ``result_key``.

    ``worker`` is the id of the process that ran it (None when the turn worker
    produced the outcome itself, e.g. on a timeout while the job was queued);
    ``retry_requested`` whether the tool asked the model for a correction (docs/architecture.md, Tool calls).
    """

    content: str
    is_error: bool = False
    structured: Any = None
    worker: str | None = None
    retry_requested: bool = False


def parse_reply(data: bytes) -> tuple[str, bytes | None]:
    """Split a message of a turn worker's reply channel into ``(result key, outcome JSON or None)``.

    The tool worker (``lua/store_tool_result.lua``) sends the result key, a newline and the outcome JSON once the
    outcome is stored, or the bare result key when the JSON is over :data:`REPLY_INLINE_MAX` bytes
    (the waiter then reads the key). A key never holds a newline (ids are ``[A-Za-z0-9_.:@-]``).
    """
    key, _, outcome = data.partition(b"\n")
    return key.decode(), outcome or None
