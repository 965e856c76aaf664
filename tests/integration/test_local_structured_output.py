"""Structured output from the real embedded model (SmolLM2-135M on xllamacpp, json_schema tool calling): its
server constrains the reply with the ``response_format`` JSON schema (docs/architecture.md, Structured output)."""

from __future__ import annotations

import uuid

import pytest

from smith_client import SmithClient
from smith_worker.local.llm_server import LocalModelServer
from smith_worker.testing import worker_env, worker_pair
from tests.conftest import LOGS
from tests.support.output_app import City

pytestmark = [pytest.mark.integration, pytest.mark.local_llm]


@pytest.fixture(scope="module")
async def local_output_workers(redis_url):
    LOGS.mkdir(parents=True, exist_ok=True)
    with LocalModelServer(log_path=LOGS / "local-model-output.log", startup_timeout=60.0) as server:
        prefix = f"lout{uuid.uuid4().hex[:6]}"
        env = worker_env(redis_url, prefix, server.base_url, **server.client_env())
        async with worker_pair("tests.support.output_app:app", redis_url, prefix, env, log_dir=LOGS):
            yield prefix


async def test_the_embedded_model_returns_a_valid_object(redis_url, local_output_workers):
    async with SmithClient.from_url(redis_url, prefix=local_output_workers) as client:
        turn_id = f"local-{uuid.uuid4().hex[:8]}"
        message = await client.send(
            "Name a city and its population.", conversation_id=turn_id, agent="city_local", turn_id=turn_id,
            output_type=City, sampling={"max_tokens": 60}, timeout=240,
        )
        assert isinstance(message.output, City) and message.output.name
        events = [e async for e in client.follow(turn_id, timeout=30)]
    assert events[-1].data["output"] == message.output.model_dump(mode="json")
    assert sum(1 for e in events if e.type == "message") == 2  # the user message and one valid answer: no retry
