"""Payloads of the two arq job functions: ``run_turn`` and ``run_tool``.

Both are JSON (see :mod:`smith_client.serialization`) and carry no secrets:
workers read API keys from their own configuration (DESIGN.md §9).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from smith_client.messages import ToolCall, UserMessage

RUN_TURN = "run_turn"
RUN_TOOL = "run_tool"

TurnStatus = Literal["queued", "running", "completed", "failed"]


class TurnJob(BaseModel):
    """The ``run_turn`` payload: one user message for one conversation.

    ``sampling`` is a dict of the worker's ``SamplingParams`` fields (temperature,
    top_p, max_tokens, stop, response_format, extra); ``stream`` overrides the
    agent's streaming default for this turn (seed §15.1 ``AgentRequest``).
    ``submitted_at`` is epoch seconds.
    """

    turn_id: str
    conversation_id: str
    agent: str = "default"
    message: UserMessage
    sampling: dict[str, Any] | None = None
    stream: bool | None = None
    submitted_at: float = 0.0


class ToolJob(BaseModel):
    """The ``run_tool`` payload: one tool call of one step of a turn.

    ``timeout`` is the tool's budget in seconds; ``reply_channel`` is the pub/sub
    channel of the waiting turn worker; ``result_key`` where the result is
    stored; ``result_max_bytes`` the agent's cap on the content (UTF-8 bytes);
    ``idempotent`` whether the call may be re-run when its tool worker died.
    """

    turn_id: str
    conversation_id: str
    agent: str
    agent_path: list[str] = Field(default_factory=list)
    step: int
    index: int
    call: ToolCall
    timeout: float
    reply_channel: str
    result_key: str
    result_max_bytes: int = 64 * 1024
    idempotent: bool = False


class ToolOutcome(BaseModel):
    """A finished tool call as stored under ``result_key``.

    ``worker`` is the id of the process that ran it (None when the turn worker
    produced the outcome itself, e.g. on a timeout while the job was queued).
    """

    content: str
    is_error: bool = False
    structured: Any = None
    worker: str | None = None
