"""``RollingWindowMemory``: the most recent messages that fit every configured limit."""

from __future__ import annotations

import math
from typing import Any

import orjson

from smith_client.errors import ConfigurationError, ContextOverflowError
from smith_client.messages import UserMessage
from smith_client.roundtrip import RoundTrip
from smith_worker.llm.wire import to_openai
from smith_worker.memory.base import Memory, MemoryContext

#: Bytes per token in token estimates (about 4 per token, counted in UTF-8 bytes; docs/architecture.md, Memory).
BYTES_PER_TOKEN = 4


def wire_size(message: Any) -> int:
    """UTF-8 bytes of ``message`` as OpenAI wire JSON (tool arguments and ids included)."""
    return len(orjson.dumps(to_openai(message)))


def _check_limit(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"RollingWindowMemory {name} must be a positive int or None, got {value!r}", setting=name
        )
    return value


class RollingWindowMemory(Memory):
    """Keeps the newest whole messages within every configured limit.

    * ``max_messages``: messages in the view;
    * ``max_chars``: UTF-8 bytes of the view's messages as OpenAI wire JSON (see :func:`wire_size`);
    * ``max_tokens``: estimated tokens, :data:`BYTES_PER_TOKEN` bytes each.

    The agent's system prompt is not counted. Older messages are dropped
    oldest first; the current turn's messages are always kept, and when they
    alone exceed a limit the step raises :class:`ContextOverflowError`. The
    view starts at a user message, as strict chat templates require. Each
    step reads the current turn plus the window from Redis, in pages of
    ``max_messages`` (or 64) messages from the newest back, never the whole
    history. Raises :class:`ConfigurationError` for a limit that is not a
    positive int, or when no limit is given.
    """

    page = 64

    def __init__(
        self, max_messages: int | None = None, max_chars: int | None = None, max_tokens: int | None = None
    ) -> None:
        self.max_messages = _check_limit("max_messages", max_messages)
        self.max_chars = _check_limit("max_chars", max_chars)
        self.max_tokens = _check_limit("max_tokens", max_tokens)
        if max_messages is None and max_chars is None and max_tokens is None:
            raise ConfigurationError(
                "RollingWindowMemory needs max_messages, max_chars or max_tokens", setting="memory"
            )

    def __repr__(self) -> str:
        return (
            f"RollingWindowMemory(max_messages={self.max_messages}, max_chars={self.max_chars}, "
            f"max_tokens={self.max_tokens})"
        )

    def _over(self, count: int, size: int) -> tuple[str, int, int] | None:
        """The first limit that ``count`` messages of ``size`` bytes exceed: ``(name, budget, size)``."""
        if self.max_messages is not None and count > self.max_messages:
            return "max_messages", self.max_messages, count
        if self.max_chars is not None and size > self.max_chars:
            return "max_chars", self.max_chars, size
        tokens = math.ceil(size / BYTES_PER_TOKEN)
        if self.max_tokens is not None and tokens > self.max_tokens:
            return "max_tokens", self.max_tokens, tokens
        return None

    def prefetch(self, ctx: MemoryContext, rt: RoundTrip) -> MemoryContext:
        """The current turn and the newest page before it, read with the step's other reads."""
        return ctx.reading(rt, ctx.turn_start - self._page_size)

    @property
    def _page_size(self) -> int:
        return self.max_messages or self.page

    async def select(self, ctx: MemoryContext) -> list[Any]:
        """The current turn plus as many older messages as fit, starting at a user message."""
        page = self._page_size
        chunk = await ctx.store.read(ctx.turn_start - page)
        split = max(ctx.turn_start - chunk.first, 0)
        older, turn = chunk.messages[:split], chunk.messages[split:]
        count, size = len(turn), sum(map(wire_size, turn))
        over = self._over(count, size)
        if over is not None:
            name, budget, used = over
            raise ContextOverflowError(
                f"the current turn alone exceeds {name}={budget} (it has {used})", limit=name, budget=budget, size=used
            )
        kept: list[Any] = []  # older messages that fit, newest first
        first = chunk.first
        while older:
            for message in reversed(older):
                grown = size + wire_size(message)
                if self._over(count + 1, grown) is not None:
                    return _from_first_user(kept[::-1] + turn)
                kept.append(message)
                count, size = count + 1, grown
            if first <= chunk.stored_first:
                break
            more = await ctx.store.read(first - page, first)
            older, first = more.messages, more.first
        return _from_first_user(kept[::-1] + turn)


def _from_first_user(messages: list[Any]) -> list[Any]:
    """``messages`` from the first user message on (all of them when there is none)."""
    for index, message in enumerate(messages):
        if isinstance(message, UserMessage):
            return messages[index:]
    return messages
