"""Conversation history in Redis (full memory, seed §13.2 ``FullMemory``).

One Redis list per conversation holds the stored form of every message, so
any worker can run the conversation's next turn. The list lives until the
conversation is cleared or has been idle ``ttl`` seconds (30 days by default,
DESIGN.md §8): every write refreshes the TTL.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from redis.asyncio import Redis

from smith_client.keys import Keys
from smith_client.messages import SystemMessage, message_to_json, messages_from_json_list

#: Idle lifetime of a conversation's history, in seconds (30 days).
DEFAULT_HISTORY_TTL = 30 * 24 * 3600


class ConversationStore:
    """Append and read one conversation's messages."""

    def __init__(self, redis: Redis, keys: Keys, conversation_id: str, ttl: int = DEFAULT_HISTORY_TTL) -> None:
        self._redis = redis
        self._key = keys.history(conversation_id)
        self._ttl = ttl

    async def append(self, *messages: BaseModel) -> None:
        """Append messages atomically, in order, and refresh the TTL."""
        if not messages:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.rpush(self._key, *(message_to_json(m) for m in messages))
            pipe.expire(self._key, self._ttl)
            await pipe.execute()

    async def messages(self) -> list[Any]:
        """All stored messages, oldest first."""
        return messages_from_json_list(await self._redis.lrange(self._key, 0, -1))

    async def snapshot(self, system_prompt: str) -> list[Any]:
        """The messages to send to the model: the system prompt (if any), then the history (seed §13.1)."""
        history = await self.messages()
        return ([SystemMessage(content=system_prompt)] if system_prompt else []) + history

    async def clear(self) -> None:
        await self._redis.delete(self._key)
