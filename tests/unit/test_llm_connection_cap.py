"""The model's HTTP client opens at most ``max_connections`` connections to one endpoint
(``SMITH_LLM_MAX_CONNECTIONS``, smith_worker/llm/http.py); requests beyond them wait for one."""

from __future__ import annotations

import asyncio

import pytest

from smith_worker.config import Settings
from smith_worker.llm.http import model_http_client
from smith_worker.llm.types import DEFAULT_MAX_CONNECTIONS
from smith_worker.testing import Reply, ScriptedLlmServer, scenario_marker


async def _post_all(base_url: str, max_connections: int, count: int) -> None:
    client = model_http_client(max_connections)
    body = {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": scenario_marker("slow")}]}
    try:

        async def one() -> None:
            async with client.stream("POST", f"{base_url}/chat/completions", json=body) as response:
                assert response.status_code == 200
                await response.aread()

        await asyncio.gather(*(one() for _ in range(count)))
    finally:
        await client.aclose()


@pytest.mark.parametrize("cap", [2, 6])
async def test_requests_share_at_most_the_cap_of_connections(cap):
    with ScriptedLlmServer() as server:
        server.add_scenario("slow", Reply.text("a b c", chunk_size=2, delay=0.05))
        await _post_all(server.base_url, cap, 6)
        peers = {request.peer for request in server.requests}
    assert len(server.requests) == 6
    assert len(peers) == cap  # six requests at once: as many connections as the cap allows, no more


def test_the_cap_is_a_setting(monkeypatch):
    monkeypatch.delenv("SMITH_LLM_MAX_CONNECTIONS", raising=False)
    assert Settings.from_env().llm_max_connections == DEFAULT_MAX_CONNECTIONS == 100
    monkeypatch.setenv("SMITH_LLM_MAX_CONNECTIONS", "10000")
    assert Settings.from_env().llm_max_connections == 10_000


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        model_http_client(0)
