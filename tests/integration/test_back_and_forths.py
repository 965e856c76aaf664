"""One turn's walk from ``send`` to ``turn.completed`` in back-and-forths (docs/architecture.md, One turn's
path), counted on the wire: the client and a turn worker and a tool worker of their own talk to the
test's redis-server through :class:`~tests.support.request_counter.RequestCounter`, which counts each
request a process waits on (a command, a pipeline or a transaction counts once), and the scripted model
counts its requests. The fewest over a few turns is taken: a worker's timers (lease renewal,
registration) may land inside one turn's window."""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import urlsplit

import pytest

from smith_client import SmithClient
from smith_worker.testing import Reply, Script, worker_env, worker_pair
from tests.conftest import LOGS
from tests.support.request_counter import RequestCounter

pytestmark = [pytest.mark.integration]

TURNS = 4
#: Seconds for the steps that follow a turn's completion (arq's finish, the next claim) to end.
SETTLE = 0.3
#: docs/architecture.md, One turn's path: a text turn in 8 (7 with Redis, 1 with the model), a one-tool
#: turn in 16 (14 with Redis, 2 with the model).
TEXT_TURN_REDIS = 7
TOOL_TURN_REDIS = 14


@pytest.fixture(scope="module")
async def counted(redis_url, scripted_llm):
    """A client and a worker pair of their own prefix, all talking to Redis through one counter."""
    target = urlsplit(redis_url)
    async with RequestCounter((target.hostname or "127.0.0.1", target.port or 6379)) as counter:
        url = f"redis://127.0.0.1:{counter.port}"
        prefix = f"bf{uuid.uuid4().hex[:6]}"
        env = worker_env(url, prefix, scripted_llm.base_url)
        async with worker_pair("tests.support.app:app", url, prefix, env, log_dir=LOGS):
            async with SmithClient.from_url(url, prefix=prefix) as client:
                yield counter, client


async def fewest_round_trips(counted, scenario, scripted_llm, script: Script) -> tuple[list[str], int]:
    """The Redis requests of the turn that needed fewest of them (with its model requests)."""
    counter, client = counted
    key, marker = scenario(Script(Reply.text("done")))
    await client.send(f"{marker} warm up", conversation_id=f"warm-{key}", timeout=60)
    walks = []
    for _ in range(TURNS):
        key, marker = scenario(script)
        await asyncio.sleep(SETTLE)  # the workers' steps after the last turn's completion
        counter.start()
        reply = await client.send(f"{marker} go", conversation_id=f"bf-{key}", timeout=60)
        assert reply.content == "done"
        assert not counter.counting, "turn.completed was not seen on the wire"
        walks.append((list(counter.requests), len(scripted_llm.requests_for(key))))
    return min(walks, key=lambda walk: len(walk[0]))


def without_tool_worker_after_steps(requests: list[str]) -> list[str]:
    """``requests`` less the tool worker's steps once it stored the outcome, which the turn does not wait
    for: arq's finish of the tool job (``MULTI … SET`` result) and the worker's next claim."""
    stored = requests.index("EVALSHA store_tool_result.lua") + 1
    after = requests[stored:]
    for step in ("MULTI SET", "EVALSHA claim.lua"):
        if step in after:
            after.remove(step)
    return requests[:stored] + after


async def test_a_text_turn_takes_eight_back_and_forths(counted, scenario, scripted_llm):
    requests, model = await fewest_round_trips(counted, scenario, scripted_llm, Script(Reply.text("done")))
    assert model == 1
    assert len(requests) <= TEXT_TURN_REDIS, " | ".join(requests)


async def test_a_one_tool_turn_takes_sixteen_back_and_forths(counted, scenario, scripted_llm):
    script = Script(Reply.tool_calls([("add", {"a": 1, "b": 1})]), Reply.text("done"))
    requests, model = await fewest_round_trips(counted, scenario, scripted_llm, script)
    assert model == 2
    requests = without_tool_worker_after_steps(requests)
    assert len(requests) <= TOOL_TURN_REDIS, " | ".join(requests)
