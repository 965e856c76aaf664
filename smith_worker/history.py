"""Conversation history in Redis (full memory, seed §13.2 ``FullMemory``).

One Redis list per conversation holds the stored form of every message, so
any worker can run the conversation's next turn. The list lives until the
conversation has been idle ``smith_client.keys.DEFAULT_HISTORY_TTL`` seconds (30 days,
DESIGN.md §8): every write (:mod:`smith_worker.turn_state`) refreshes the TTL.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from smith_client.keys import Keys
from smith_client.messages import SystemMessage, messages_from_json_list


class ConversationStore:
    """Read one conversation's messages. Turns write them through their fenced
    :class:`~smith_worker.turn_state.TurnAttempt`, so a stale attempt cannot.

    ``key`` reads another message list instead (a sub-agent's history, :mod:`smith_worker.subagents`).
    """

    def __init__(self, redis: Redis, keys: Keys, conversation_id: str, *, key: str | None = None) -> None:
        self._redis = redis
        self._key = key or keys.history(conversation_id)

    async def messages(self) -> list[Any]:
        """All stored messages, oldest first."""
        return messages_from_json_list(await self._redis.lrange(self._key, 0, -1))

    async def snapshot(self, system_prompt: str) -> list[Any]:
        """The messages to send to the model: the system prompt (if any), then the history (seed §13.1)."""
        history = await self.messages()
        return ([SystemMessage(content=system_prompt)] if system_prompt else []) + history
