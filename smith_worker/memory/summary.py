"""``SummaryMemory``: older messages replaced by one summary kept in Redis (docs/architecture.md, Memory).

State: the hash ``{p}:conv:{c}:summary`` holds ``text`` and ``covers`` (the
absolute position of the first message the summary does *not* cover). It is
written by one script, both fields at once, and only forward (a larger
``covers``), so a summary written by a crashed or stale attempt is either
complete and used, or absent. Every turn of the
conversation, on any worker, reads it; each read refreshes its TTL to the
history's, so it lives while the conversation is active.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from smith_client.errors import ConfigurationError, ContextOverflowError, ParseError, error_from_exception
from smith_client.events import MemorySummaryFailedData
from smith_client.messages import AssistantMessage, SystemMessage, ToolMessage, UserMessage
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.scripts import LuaScript
from smith_worker.memory.base import Memory, MemoryContext
from smith_worker.memory.window import RollingWindowMemory

#: The script of this module, in ``lua/`` beside it.
SUMMARY_SAVE = LuaScript("summary_save", __package__)

logger = logging.getLogger("agent_smith.agent")

DEFAULT_SUMMARY_PROMPT = (
    "You summarise conversations between a user and an AI assistant. Write a concise summary of the "
    "conversation below that keeps every fact, decision, name, number, open question and tool result a "
    "later reply may need. Reply with the summary only."
)
#: Heading of the system message that stands for the summarised messages in the model's view.
SUMMARY_HEADING = "Summary of the earlier conversation:"


def _positive(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"SummaryMemory {name} must be an int >= {minimum}, got {value!r}", setting=name)
    return value


class SummaryMemory(Memory):
    """Summarises what is older than the last messages once the view grows past ``threshold``.

    When the view (summary message included) would exceed ``threshold``
    messages, everything older than the last ``keep_recent`` messages (moved
    back to a tool-call group boundary) is represented by one system message
    holding a summary, written by a non-streaming call of the agent's model
    with ``summary_prompt`` (default :data:`DEFAULT_SUMMARY_PROMPT`). A new
    summary covers the previous summary plus the messages since, so a step
    reads only the messages after the stored coverage, and the summary call
    is made once per threshold crossing, not once per turn.

    If the summary call fails, that step uses ``window`` (default
    ``RollingWindowMemory(max_messages=threshold)``), logs a warning and
    publishes ``memory.summary_failed``: a turn never fails because of memory.
    Raises :class:`ConfigurationError` for ``threshold < 2``, ``keep_recent``
    outside ``0 .. threshold - 1`` or a ``window`` that is not a :class:`Memory`.
    """

    def __init__(
        self,
        threshold: int = 40,
        keep_recent: int = 10,
        summary_prompt: str | None = None,
        window: Memory | None = None,
    ) -> None:
        self.threshold = _positive("threshold", threshold, 2)
        self.keep_recent = _positive("keep_recent", keep_recent, 0)
        if keep_recent >= threshold:
            raise ConfigurationError(
                f"SummaryMemory keep_recent ({keep_recent}) must be below threshold ({threshold})",
                setting="keep_recent",
            )
        if window is not None and not isinstance(window, Memory):
            raise ConfigurationError(f"SummaryMemory window must be a Memory, got {window!r}", setting="window")
        self.summary_prompt = summary_prompt or DEFAULT_SUMMARY_PROMPT
        self.window = window if window is not None else RollingWindowMemory(max_messages=threshold)

    def __repr__(self) -> str:
        return f"SummaryMemory(threshold={self.threshold}, keep_recent={self.keep_recent}, window={self.window!r})"

    async def select(self, ctx: MemoryContext) -> list[Any]:
        """The summary (if any) and the messages after it; summarises first when that is over ``threshold``."""
        key = ctx.keys.conversation_summary(ctx.conversation_id)
        rt = RoundTrip()
        saved: Pending[list[bytes | None]] = rt.call("hmget", key, "text", "covers")
        rt.call("expire", key, ctx.history_ttl)  # in use: it lives as long as the conversation is active
        await rt.run(ctx.redis)
        text, covers = saved.value
        old = text.decode() if text is not None else ""
        chunk = await ctx.store.read(int(covers) if covers is not None else 0)
        messages = chunk.messages
        head = [summary_message(old)] if old else []
        if len(head) + len(messages) <= self.threshold:
            return head + messages
        cut = _group_boundary(messages, len(messages) - self.keep_recent)
        if cut <= 0:
            return head + messages
        try:
            new = await self._summarise(ctx, old, messages[:cut])
        except Exception as exc:  # any failure of the summary call: this step uses the window
            return await self._fallback(ctx, exc)
        await SUMMARY_SAVE(ctx.redis, [key], [new, chunk.first + cut, ctx.history_ttl])
        return [summary_message(new)] + messages[cut:]

    async def _summarise(self, ctx: MemoryContext, old: str, messages: list[Any]) -> str:
        text = (await ctx.summarize(summary_request(self.summary_prompt, old, messages))).strip()
        if not text:
            raise ParseError("the summary call returned no text")
        return text

    async def _fallback(self, ctx: MemoryContext, exc: Exception) -> list[Any]:
        error = error_from_exception(exc)
        logger.warning(
            "conversation %s: summary call failed (%r); this step uses %r", ctx.conversation_id, error, self.window
        )
        await ctx.publish(MemorySummaryFailedData.model_validate({"error": error.to_payload()}))
        try:
            return await self.window.select(ctx)
        except ContextOverflowError:  # memory never fails a turn: send the current turn alone
            return (await ctx.store.read(ctx.turn_start)).messages


def _group_boundary(messages: list[Any], index: int) -> int:
    """``index`` moved back until ``messages[index]`` opens a group (is not a tool message)."""
    while 0 < index < len(messages) and isinstance(messages[index], ToolMessage):
        index -= 1
    return index


def summary_message(text: str) -> SystemMessage:
    """The system message standing for the summarised part of the conversation in the model's view."""
    return SystemMessage(content=f"{SUMMARY_HEADING}\n{text}")


def summary_request(prompt: str, old: str, messages: list[Any]) -> list[Any]:
    """The messages of a summary call: the instructions, then the old summary and the new messages as text."""
    parts = [f"Summary so far:\n{old}\n"] if old else []
    parts.append("Conversation:")
    parts += [_transcript_line(m) for m in messages]
    return [SystemMessage(content=prompt), UserMessage(content="\n".join(parts))]


def _transcript_line(message: Any) -> str:
    if isinstance(message, AssistantMessage):
        calls = "".join(f" [called {c.name}({orjson.dumps(c.arguments).decode()})]" for c in message.tool_calls)
        return f"assistant: {message.content}{calls}"
    if isinstance(message, ToolMessage):
        return f"tool {message.name} result: {message.content}"
    return f"{message.role}: {message.content}"
