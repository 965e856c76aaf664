"""Fleet-wide model rate limits (docs/architecture.md, Model rate limits): four real turn-worker processes share
one endpoint's limit and its Retry-After pauses through Redis, against a scripted model that enforces a limit.

The fleet runs at ``SMITH_LLM_RPM=60`` with ``SMITH_LLM_RATE_BURST=0`` (one request a second, evenly spaced):
the scripted server enforces 60 requests in any sliding 60 s window, answering 429 with Retry-After past it,
which a token bucket's burst would overrun (a burst of B seconds lets ``60 + B`` requests into a 60 s window).
More turns than the window allows are sent, so the test runs for over a minute.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from smith_client import SmithClient
from smith_client.events import LLM_WAITING, Event, LlmWaitingData
from smith_worker.testing import (
    RecordedRequest,
    Reply,
    RequestLimit,
    ScriptedLlmServer,
    scenario_marker,
)
from tests.support.fleets import turn_workers

WORKERS = 4
#: The scripted server's sliding window (seconds) and its requests: 60 a minute, as the fleet's limit.
WINDOW = 60.0
LIMIT = 60
#: Turns sent at once: more than the window allows.
TURNS = 72
#: Seconds the turns may take here: ~5 times the ~TURNS seconds the limit spreads them over.
CEILING = 5 * TURNS


@pytest.fixture(scope="module")
def model():
    with ScriptedLlmServer() as server:
        yield server


@pytest.fixture(scope="module")
async def fleet(redis_url, model):
    """Four turn workers of a private prefix, limited to 60 requests a minute to the scripted model, evenly."""
    limits = {"SMITH_LLM_RPM": "60", "SMITH_LLM_RATE_BURST": "0"}
    async with turn_workers(redis_url, model.base_url, WORKERS, "rl", **limits) as prefix:
        yield prefix


async def run_turns(client: SmithClient, key: str, count: int) -> list[list[Event]]:
    """``count`` single-step turns of scenario ``key`` at once; each one's events."""

    async def one(index: int) -> list[Event]:
        text = f"{scenario_marker(key)} turn {index}"
        return [event async for event in client.stream(text, agent="plain", conversation_id=f"{key}-{index}")]

    return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(count))), CEILING)


def waits(events: list[Event]) -> list[LlmWaitingData]:
    return [event.payload for event in events if event.type == LLM_WAITING]  # type: ignore[misc]


def most_in_a_window(requests: list[RecordedRequest], window: float) -> int:
    """The most requests the server received within any ``window`` seconds (refused ones included)."""
    times = sorted(request.received_at for request in requests)
    return max(sum(1 for t in times if start <= t < start + window) for start in times)


@pytest.mark.timeout(CEILING + 60)
async def test_the_fleet_keeps_to_the_limit_and_every_turn_completes(redis_url, fleet, model):
    model.limit = RequestLimit(requests=LIMIT, window=WINDOW)
    key = uuid.uuid4().hex[:12]
    model.add_scenario(key, Reply.text("ok"))
    async with SmithClient.from_url(redis_url, prefix=fleet) as client:
        streams = await run_turns(client, key, TURNS)
    assert [events[-1].type for events in streams] == ["turn.completed"] * TURNS
    requests = model.requests_for(key)
    assert most_in_a_window(requests, WINDOW) <= LIMIT + WORKERS  # ± one request per worker
    waited = [wait for events in streams for wait in waits(events)]
    assert sum(1 for events in streams if waits(events)) >= TURNS - LIMIT  # the turns past the window waited
    assert all(wait.reason in ("rate_limit", "retry_after") and wait.wait_s > 0 for wait in waited)
    assert waited[0].endpoint == f"{model.base_url}/chat/completions" and waited[0].model == "scripted"


async def test_a_retry_after_pauses_every_worker(redis_url, fleet, model):
    """The third request is answered 429 with Retry-After: 2 (a provider whose limit is lower than the
    fleet's): no worker sends another request until the pause ends, then every turn completes."""
    model.limit = None
    key = uuid.uuid4().hex[:12]
    refused = Reply.error(429, headers={"Retry-After": "2"})
    model.add_scenario(key, Reply.sequence(Reply.text("ok"), Reply.text("ok"), refused, Reply.text("ok")))
    async with SmithClient.from_url(redis_url, prefix=fleet) as client:
        streams = await run_turns(client, key, 8)
    assert [events[-1].type for events in streams] == ["turn.completed"] * 8
    requests = model.requests_for(key)
    (refusal,) = [request for request in requests if request.attempt == 3]
    # a request already let through when the pause was stored may still arrive just after the 429; none later
    during = [r.received_at - refusal.received_at for r in requests if 0.5 < r.received_at - refusal.received_at < 1.8]
    assert during == []
    assert len(requests) == 9  # eight turns and the one retry
    paused = [events for events in streams if any(wait.reason == "retry_after" for wait in waits(events))]
    assert len(paused) >= 2  # the refused turn's retry and the turns queued behind it waited for the pause
