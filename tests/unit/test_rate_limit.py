"""Fleet-wide model rate limits (smith_worker/llm/rate_limit.py, lua/rate_limit.lua; docs/architecture.md, Model
rate limits): the GCRA script on the session's real redis-server, the gate's waits and errors, the client's
fleet-wide pause on a 429 with Retry-After, MCP sampling through the same gates, the settings, and the scripted
server's enforced limit."""

from __future__ import annotations

import asyncio
import email.utils
import io
import time
import uuid
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from smith_client.cli import StreamPrinter
from smith_client.eventlog import EventLog
from smith_client.errors import LlmApiError, SmithTimeoutError
from smith_client.events import DATA_MODELS, LLM_WAITING, Event, LlmWaitingData
from smith_client.keys import Keys
from smith_client.messages import UserMessage
from smith_client.overrides import TurnOverrides
from smith_worker.agent.overrides import for_turn
from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.hooks import Hooks
from smith_worker.llm.client import LlmClient
from smith_worker.llm.rate_limit import RATE_LIMIT, WAIT_OPERATION, RateLimits, endpoint_id, estimate_tokens
from smith_worker.llm.types import LlmClientConfig, LlmRequest
from smith_worker.mcp.config import ServerConfig
from smith_worker.mcp.requests import ClientRequests
from smith_worker.testing import Reply, RequestLimit, ScriptedLlmServer, scenario_marker
from smith_worker.tools.function import ToolContext
from smith_worker.tools.source import SourceContext

URL = "http://127.0.0.1:9/v1"


@pytest.fixture
async def redis(redis_url):
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def key() -> str:
    return Keys(f"rl{uuid.uuid4().hex[:8]}").llm_rate_limit("endpoint")


async def take(redis: Redis, key: str, rpm: int = 0, tpm: int = 0, burst: float = 60.0, tokens: int = 0,
               correction: int = 0) -> tuple[float, str]:  # fmt: skip
    """One ``take``: (seconds to wait, reason); (0, "") when taken."""
    wait_ms, reason = await RATE_LIMIT(redis, [key], ["take", rpm, tpm, int(burst * 1000), tokens, correction])
    return wait_ms / 1000, reason.decode()


# -- the script -----------------------------------------------------------------------


async def test_requests_burst_the_whole_minute_then_one_per_interval(redis, key):
    for _ in range(6):  # 6 per minute, a burst of 60 s: all six at once
        assert await take(redis, key, rpm=6) == (0, "")
    wait, reason = await take(redis, key, rpm=6)
    assert reason == "rate_limit" and 9.0 < wait <= 10.0  # the next one after one interval (10 s)
    assert await take(redis, key, rpm=6) == (pytest.approx(wait, abs=0.5), "rate_limit")  # a refusal takes nothing
    ttl = await redis.pttl(key)
    assert 50_000 < ttl <= 60_000  # the key lives until its TAT (6 x 10 s from the first take)


async def test_a_burst_of_zero_spaces_requests_evenly(redis, key):
    assert await take(redis, key, rpm=60, burst=0) == (0, "")
    wait, reason = await take(redis, key, rpm=60, burst=0)
    assert reason == "rate_limit" and 0.5 < wait <= 1.0


async def test_tokens_per_minute_and_a_request_over_the_burst(redis, key):
    assert await take(redis, key, tpm=600, tokens=500) == (0, "")  # 0.1 s per token, a burst of 600
    wait, _ = await take(redis, key, tpm=600, tokens=200)
    assert 9.0 < wait <= 10.0  # 100 tokens over the burst: 10 s
    other = key + "-big"
    assert await take(redis, other, tpm=600, tokens=1000) == (0, "")  # more than the minute's: alone, at once
    wait, _ = await take(redis, other, tpm=600, tokens=1)
    assert 39.0 < wait <= 40.1  # 100 s of TAT minus the 59.9 s a 1-token request may sit ahead


async def test_both_limits_must_allow_and_a_refusal_takes_neither(redis, key):
    assert await take(redis, key, rpm=100, tpm=600, tokens=600) == (0, "")
    wait, _ = await take(redis, key, rpm=100, tpm=600, tokens=100)
    assert wait > 9.0  # requests allow it, tokens do not
    requests_before = await redis.hget(key, "requests")
    await take(redis, key, rpm=100, tpm=600, tokens=100)
    assert await redis.hget(key, "requests") == requests_before


async def test_a_correction_gives_back_overestimated_tokens(redis, key):
    assert await take(redis, key, tpm=600, tokens=600) == (0, "")
    assert (await take(redis, key, tpm=600, tokens=10))[0] > 0
    assert await take(redis, key, tpm=600, tokens=10, correction=-300) == (0, "")  # the reply used 300 fewer
    wait, _ = await take(redis, key, tpm=600, tokens=10, correction=300)  # ... or more: added back
    assert 1.0 < wait <= 2.0  # TAT 31 s + 30 s ahead, 59 s allowed for 10 tokens


async def test_a_pause_holds_every_take_until_it_ends(redis, key):
    wait_ms, reason = await RATE_LIMIT(redis, [key], ["pause", 2000])
    assert (wait_ms, reason) == (2000, b"retry_after")
    await RATE_LIMIT(redis, [key], ["pause", 500])  # a shorter pause does not shorten it
    wait, reason = await take(redis, key, rpm=1000)
    assert reason == "retry_after" and 1.5 < wait <= 2.0
    assert 1500 < await redis.pttl(key) <= 2000
    await asyncio.sleep(wait)
    assert await take(redis, key, rpm=1000) == (0, "")


async def test_a_wait_the_caller_accepts_is_reserved_and_the_next_caller_waits_behind_it(redis, key):
    assert await take(redis, key, rpm=60, burst=0) == (0, "")
    wait_ms, reason, reserved = await RATE_LIMIT(redis, [key], ["take", 60, 0, 0, 0, 0, 5000])
    assert reason == b"rate_limit" and reserved == 1 and 500 < wait_ms <= 1000
    wait_ms, _, reserved = await RATE_LIMIT(redis, [key], ["take", 60, 0, 0, 0, 0, 5000])
    assert reserved == 1 and 1500 < wait_ms <= 2000  # behind the first reservation
    refused = await RATE_LIMIT(redis, [key], ["take", 60, 0, 0, 0, 0, 1000])  # a wait over what it accepts
    assert len(refused) == 2 and 2500 < refused[0] <= 3000  # not reserved: nothing taken
    assert len(await RATE_LIMIT(redis, [key], ["take", 60, 0, 0, 0, 0, 5000])) == 3


# -- the gate ----------------------------------------------------------------------------


def config(**fields: Any) -> LlmClientConfig:
    return LlmClientConfig(**{"base_url": URL, "model": "m", **fields})


class Recorder:
    """The gate's surroundings: published ``llm.waiting`` events, postponed seconds."""

    def __init__(self) -> None:
        self.events: list[LlmWaitingData] = []
        self.postponed: list[float] = []

    async def publish(self, data: LlmWaitingData) -> int:
        self.events.append(data)
        return len(self.events)


def limits(redis: Redis, keys: Keys | None = None) -> RateLimits:
    return RateLimits(redis, keys or Keys(f"rl{uuid.uuid4().hex[:8]}"))


async def test_no_limit_no_gate(redis):
    assert limits(redis).gate(config(), Recorder().publish, lambda: None) is None


async def test_the_gate_waits_announces_once_and_postpones(redis):
    seen = Recorder()
    gate = limits(redis).gate(config(rpm=60, rate_burst=0), seen.publish, lambda: None)
    assert gate is not None
    started = time.monotonic()
    for _ in range(3):
        await gate.admit(1, seen.postponed.append)
    assert 1.5 < time.monotonic() - started < 10  # 1 s apart
    assert [event.reason for event in seen.events] == ["rate_limit", "rate_limit"]  # one per admit that waited
    assert seen.events[0].endpoint == f"{URL}/chat/completions" and seen.events[0].model == "m"
    assert 0 < seen.events[0].wait_s <= 1.0 and len(seen.postponed) >= 2


async def test_waiting_requests_go_in_the_order_they_asked_each_told_its_real_wait(redis):
    shared, seen = limits(redis), Recorder()
    gates = [shared.gate(config(rpm=60, rate_burst=0), seen.publish, lambda: None) for _ in range(4)]
    waited: dict[int, float] = {}

    async def ask(index: int) -> None:
        gate = gates[index]
        assert gate is not None
        started = time.monotonic()
        await gate.admit(1, lambda _: None)
        waited[index] = time.monotonic() - started

    tasks = []
    for index in range(4):  # they ask in this order, 50 ms apart
        tasks.append(asyncio.create_task(ask(index)))
        await asyncio.sleep(0.05)
    await asyncio.gather(*tasks)
    assert sorted(waited, key=waited.__getitem__) == [0, 1, 2, 3]  # served in the order they asked
    announced = [event.wait_s for event in seen.events]
    assert len(announced) == 3  # the first went at once
    for told, index in zip(announced, (1, 2, 3), strict=True):
        assert told == pytest.approx(waited[index], abs=0.3)  # the wait announced is the wait there was


async def test_a_wait_past_the_deadline_fails_at_once(redis):
    seen = Recorder()
    gate = limits(redis).gate(config(rpm=1), seen.publish, lambda: time.monotonic() + 5)
    assert gate is not None
    await gate.admit(1, seen.postponed.append)
    with pytest.raises(SmithTimeoutError) as info:
        await gate.admit(1, seen.postponed.append)  # the next request in 60 s; the turn has 5
    assert info.value.fields["operation"] == WAIT_OPERATION and 0 < info.value.fields["budget"] <= 5
    assert not seen.events


async def test_a_pause_over_max_retry_after_fails_as_the_429(redis):
    seen = Recorder()
    gate = limits(redis).gate(config(rpm=100, max_retry_after=1), seen.publish, lambda: None)
    assert gate is not None
    await gate.pause(30)
    with pytest.raises(LlmApiError) as info:
        await gate.admit(1, seen.postponed.append)
    assert info.value.http_status == 429


async def test_the_endpoints_limit_is_shared_by_every_gate_of_it(redis):
    shared = limits(redis)
    first = shared.gate(config(rpm=2, rate_burst=60), Recorder().publish, lambda: None)
    second = shared.gate(config(rpm=2, rate_burst=60, max_retries=0), Recorder().publish, lambda: None)
    other = shared.gate(config(rpm=2, model="other"), Recorder().publish, lambda: None)
    assert first is not None and second is not None and other is not None
    await first.admit(1, lambda _: None)
    await second.admit(1, lambda _: None)
    third = shared.gate(config(rpm=2, response_timeout=5), Recorder().publish, lambda: None)
    assert third is not None
    with pytest.raises(SmithTimeoutError):  # the third request in a minute; response_timeout bounds the wait
        await third.admit(1, lambda _: None)
    await other.admit(1, lambda _: None)  # another model: another endpoint
    assert endpoint_id(config()) != endpoint_id(config(model="other"))


def test_estimate_is_a_quarter_of_the_body_plus_max_tokens():
    assert estimate_tokens(b"x" * 400, 50) == 150
    assert estimate_tokens(b"x" * 400, None) == 100


def test_llm_waiting_has_a_data_model_and_a_status_line():
    assert DATA_MODELS[LLM_WAITING] is LlmWaitingData
    data = {"endpoint": f"{URL}/chat/completions", "model": "m", "reason": "retry_after", "wait_s": 2.0}
    event = Event(turn_id="t", seq=1, ts=time.time(), agent_path=["lead"], type=LLM_WAITING, data=data)
    assert event.payload == LlmWaitingData(**data) and not event.terminal
    out, err = io.StringIO(), io.StringIO()
    StreamPrinter(out, err)(event)
    assert err.getvalue() == "[model request waits 2.0 s: the endpoint's Retry-After]\n" and not out.getvalue()


# -- the client: a 429 with Retry-After pauses the fleet ------------------------------------


@pytest.mark.parametrize("header", ["1", "date"])
async def test_a_429_with_retry_after_pauses_the_endpoint_for_every_worker(redis, header):
    retry_after = "1"
    if header == "date":  # an HTTP date 2 s ahead (whole seconds): 1-2 s from now
        retry_after = email.utils.formatdate(time.time() + 2, usegmt=True)
    keys = Keys(f"rl{uuid.uuid4().hex[:8]}")
    shared = limits(redis, keys)
    seen, elsewhere = Recorder(), Recorder()
    with ScriptedLlmServer() as server:
        key = uuid.uuid4().hex[:12]
        refused = Reply.error(429, headers={"Retry-After": retry_after})
        server.add_scenario(key, Reply.sequence(refused, Reply.text("ok")))
        settings = config(base_url=server.base_url, rpm=1000)
        gate = shared.gate(settings, seen.publish, lambda: None)
        other = limits(redis, keys).gate(settings, elsewhere.publish, lambda: None)  # as in another process
        assert gate is not None and other is not None
        async with LlmClient(settings, gate=gate) as client:
            request = LlmRequest(messages=[UserMessage(content=f"{scenario_marker(key)} hi")])
            started = time.monotonic()
            call = asyncio.create_task(client.complete(request))
            assert await server.wait_until_async(lambda: server.attempts(key) == 1)
            await asyncio.sleep(0.2)  # the 429 reached the client, which stored the pause
            await other.admit(1, elsewhere.postponed.append)  # waits for the pause too
            reply = await call
        assert reply.message.content == "ok" and time.monotonic() - started >= 0.5
        assert [event.reason for event in seen.events] == ["retry_after"] and seen.events[0].wait_s <= 2.0
        assert [event.reason for event in elsewhere.events] == ["retry_after"]
        assert server.attempts(key) == 2


async def test_without_a_gate_the_retry_sleeps_on_its_own():
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    with ScriptedLlmServer() as server:
        key = uuid.uuid4().hex[:12]
        server.add_scenario(key, Reply.sequence(Reply.error(429, headers={"Retry-After": "3"}), Reply.text("ok")))
        async with LlmClient(config(base_url=server.base_url), sleep=sleep) as client:
            await client.complete(LlmRequest(messages=[UserMessage(content=f"{scenario_marker(key)} hi")]))
    assert sleeps == [3.0]


# -- MCP sampling: a model call of the calling agent's endpoint, through the same gates ---------------------


class Sampling:
    """A tool call of turn ``turn_id`` in flight on MCP server ``lab`` (``sampling=True``) of a process whose gates
    are ``shared``, its model ``settings``: :meth:`sample` answers the server's ``sampling/createMessage``
    (smith_worker/mcp/requests.py) as the tool worker does."""

    def __init__(self, redis: Redis, keys: Keys, shared: RateLimits, settings: LlmClientConfig, deadline: float):
        self.events = EventLog(redis, keys)
        context = SourceContext(redis, keys, self.events, "w1", Hooks(), {}, llm_config=lambda _: settings,
                                rate_limits=shared)  # fmt: skip
        self.requests = ClientRequests(ServerConfig("lab", command="lab-server", sampling=True), lambda: context)
        self.turn_id = f"turn-{uuid.uuid4().hex[:8]}"
        self.call = ToolContext(call_id="c1", tool_name="mcp_lab__write", turn_id=self.turn_id, agent="a",
                                agent_path=["a"], deadline=deadline)  # fmt: skip

    async def sample(self, text: str) -> Any:
        import mcp_types as types

        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=text))
        with self.requests.inflight.track(self.call, {}):
            return await self.requests.sample(None, types.CreateMessageRequestParams(messages=[message], maxTokens=8))


async def test_an_mcp_sampling_waits_for_its_endpoints_limit_as_a_loops_call_does(redis):
    """The sampling takes its request from the endpoint's limit through the process's gates (``rate_limits`` of
    its SourceContext): with the second's one request taken by an agent loop, it waits for the next, announced as
    ``llm.waiting`` on the calling agent's turn, then asks the model."""
    import mcp_types as types

    keys = Keys(f"rl{uuid.uuid4().hex[:8]}")
    shared = limits(redis, keys)
    with ScriptedLlmServer() as server:
        key = uuid.uuid4().hex[:12]
        server.add_scenario(key, Reply.text("sampled"))
        settings = config(base_url=server.base_url, rpm=60, rate_burst=0)  # one request a second
        sampling = Sampling(redis, keys, shared, settings, time.monotonic() + 30)
        await redis.hset(keys.turn_state(sampling.turn_id), "status", "running")  # its events' fence: it runs
        loop_gate = shared.gate(settings, Recorder().publish, lambda: None)
        assert loop_gate is not None
        await loop_gate.admit(1, lambda _: None)  # an agent loop's model call
        started = time.monotonic()
        result = await sampling.sample(f"{scenario_marker(key)} hi")
        waited = time.monotonic() - started
        assert server.attempts(key) == 1
    assert isinstance(result, types.CreateMessageResult) and result.content.text == "sampled"
    assert 0.5 < waited < 10
    events = await sampling.events.read(sampling.turn_id)
    assert [(e.type, e.agent_path, e.data["reason"]) for e in events] == [(LLM_WAITING, ["a"], "rate_limit")]


async def test_a_workers_tool_sources_get_the_processs_gates(redis):
    """One set of gates per process (``WorkerRuntime.rate_limits``: the turn role's loops use it too), given to the
    tool sources, whose MCP sampling goes through it."""
    from smith_worker.runtime import WorkerRuntime
    from smith_worker.tool_worker.role import ToolRole

    runtime = WorkerRuntime(app=SmithApp(), role=ToolRole(), settings=Settings.from_env(), redis=redis)
    assert isinstance(runtime.rate_limits, RateLimits) and runtime.source_context().rate_limits is runtime.rate_limits


async def test_an_mcp_sampling_whose_wait_would_pass_its_tool_calls_deadline_fails_at_once(redis):
    """A wait past the tool call's deadline is not slept: the server gets the gate's error at once, and the model
    is not asked."""
    import mcp_types as types

    keys = Keys(f"rl{uuid.uuid4().hex[:8]}")
    shared = limits(redis, keys)
    with ScriptedLlmServer() as server:
        key = uuid.uuid4().hex[:12]
        server.add_scenario(key, Reply.text("never"))
        settings = config(base_url=server.base_url, rpm=1)  # the minute's one request
        gate = shared.gate(settings, Recorder().publish, lambda: None)
        assert gate is not None
        await gate.admit(1, lambda _: None)
        sampling = Sampling(redis, keys, shared, settings, time.monotonic() + 5)
        started = time.monotonic()
        result = await sampling.sample(f"{scenario_marker(key)} hi")
        assert server.attempts(key) == 0
    assert isinstance(result, types.ErrorData) and "would wait" in result.message
    assert time.monotonic() - started < 2


# -- settings -----------------------------------------------------------------------------


def test_settings_limit_the_environments_endpoint_only(monkeypatch):
    monkeypatch.setenv("SMITH_LLM_RPM", "60")
    monkeypatch.setenv("SMITH_LLM_TPM", "100000")
    monkeypatch.setenv("SMITH_LLM_RATE_BURST", "0")
    settings = Settings.from_env()
    own = settings.llm_config()
    assert (own.rpm, own.tpm, own.rate_burst) == (60, 100_000, 0.0) and own.rate_limited
    assert settings.llm_config({"max_retries": 1}).rpm == 60
    other = settings.llm_config({"base_url": "http://other:1/v1"})
    assert (other.rpm, other.tpm, other.rate_burst) == (None, None, 60.0) and not other.rate_limited
    assert settings.llm_config({"model": "big", "rpm": 5}).rpm == 5


def test_a_turn_naming_another_model_gets_that_models_limits():
    app = SmithApp()
    app.agent("default")
    app.agent("big", llm={"model": "big", "base_url": "http://big:1/v1", "rpm": 5})
    settings = Settings.from_env({"SMITH_LLM_RPM": "60"})
    spec = app.agents["default"]
    assert for_turn(app, settings, spec, None).llm.rpm == 60
    reached = for_turn(app, settings, spec, TurnOverrides(model="big")).llm
    assert (reached.model, reached.base_url, reached.rpm, reached.tpm) == ("big", "http://big:1/v1", 5, None)


def test_unset_settings_mean_no_limit(monkeypatch):
    for name in ("SMITH_LLM_RPM", "SMITH_LLM_TPM", "SMITH_LLM_RATE_BURST"):
        monkeypatch.delenv(name, raising=False)
    assert not Settings.from_env().llm_config().rate_limited


# -- the scripted server's enforced limit ------------------------------------------------------


def test_the_scripted_server_enforces_a_sliding_window():
    with ScriptedLlmServer(limit=RequestLimit(requests=2, window=1.0)) as server:
        key = uuid.uuid4().hex[:12]
        server.add_scenario(key, Reply.text("ok"))
        body = {"model": "m", "messages": [{"role": "user", "content": scenario_marker(key)}]}
        url = f"{server.base_url}/chat/completions"
        statuses = [httpx.post(url, json=body) for _ in range(3)]
        assert [r.status_code for r in statuses] == [200, 200, 429]
        assert statuses[2].headers["retry-after"] == "1"
        assert [r.limited for r in server.requests] == [False, False, True]
        time.sleep(1.05)
        assert httpx.post(url, json=body).status_code == 200
    with ScriptedLlmServer(limit=RequestLimit(requests=0, retry_after=2)) as server:
        server.add_scenario(key, Reply.text("ok"))
        refused = httpx.post(f"{server.base_url}/chat/completions", json=body)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
