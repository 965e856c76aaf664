"""The raw floor of a turn: the same model requests made directly with one ``httpx.AsyncClient``.

Imports only httpx, so both the project's benchmark and the anchors' venv
(``bench/sdk_anchor.py``) measure it in their own process, interleaved with their turns.
"""

from __future__ import annotations

from typing import Any

import httpx

INSTRUCTIONS = "You are a terse assistant."
ADD_SCHEMA = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


class Floor:
    """The same model requests as a turn, made directly with one ``httpx.AsyncClient``."""

    def __init__(self, base_url: str, prompts: dict[str, str]) -> None:
        """``prompts``: bench/llm_server.py's ``PROMPTS`` (``text`` and ``tool`` are used)."""
        self.http = httpx.AsyncClient(base_url=base_url, headers={"authorization": "Bearer x"})
        self.prompts = prompts

    async def _post(self, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any] | None:
        body: dict[str, Any] = {"model": "scripted", "messages": messages, "tools": [ADD_SCHEMA]}
        if not stream:
            response = await self.http.post("/chat/completions", json=body)
            return dict(response.json())
        body.update(stream=True, stream_options={"include_usage": True})
        async with self.http.stream("POST", "/chat/completions", json=body) as response:
            async for _ in response.aiter_bytes():
                pass
        return None

    async def turn(self, name: str, stream: bool) -> None:
        """The model requests of turn ``name`` (``text``: one; ``tool``: the call, then its result)."""
        messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": self.prompts[name]}]
        await self._post(messages, stream)
        if name == "tool":  # the second request replays the call and its result, as the SDK does
            call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
            await self._post(messages, stream)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()
