"""Tenant limits and token quotas (docs/tenants.md): the limits model and its hash, the client's and ``smith tenant``'s
commands, the quota counter the workers' usage script keeps, the submit script's refusal and the worker's check.
The scripts run on a real redis-server (the ``redis_url`` fixture)."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from smith_client import InvalidRequestError, QuotaExceededError, SmithClient, TenantLimits
from smith_client import cli as smith_cli
from smith_client.connection import connect_redis
from smith_client.errors import error_from_payload
from smith_client.jobs import TurnJob
from smith_client.keys import QUOTA_TTL_MARGIN, TENANT_LIMITS_SUFFIX, Keys
from smith_client.messages import UserMessage
from smith_client.roundtrip import RoundTrip
from smith_client.tenants import (
    DEFAULT_QUOTA_WINDOW,
    MAX_QUOTA_WINDOW,
    MAX_RUNNING,
    MAX_TOKEN_QUOTA,
    MAX_WEIGHT,
    MIN_WEIGHT,
    checked_limits,
)
from smith_client.turns import submit_turn
from smith_client.usage import AgentUsage
from smith_worker.agent.quota import TurnQuota
from smith_worker.ops.usage import queue_count


def used(prompt: int, completion: int) -> AgentUsage:
    return AgentUsage(requests=1, prompt=prompt, completion=completion, total=prompt + completion)


def window_start(now: float, window: int) -> int:
    return math.floor(now / window) * window


@pytest.fixture
async def client(redis_url):
    redis = connect_redis(redis_url)
    client = SmithClient(redis, prefix=f"q{time.time_ns()}")
    yield client
    found = await redis.keys(f"{client.keys.prefix}:*") + await redis.keys(f"arq:*:{client.keys.prefix}:*")
    if found:
        await redis.delete(*found)
    await redis.aclose()


def test_limits_default_to_none_and_refuse_values_out_of_range():
    assert TenantLimits() == TenantLimits(weight=1.0, max_running=None, token_quota=None, quota_window_seconds=86400)
    assert TenantLimits().to_fields() == {"weight": "1.0"}  # stored: it overrides SMITH_TENANT_WEIGHTS
    limits = TenantLimits(weight=2.5, max_running=3, token_quota=1_000_000, quota_window_seconds=3600)
    assert limits.to_fields() == {"weight": "2.5", "max_running": "3", "token_quota": "1000000",
                                  "quota_window_seconds": "3600"}  # fmt: skip
    assert TenantLimits.from_fields({k.encode(): v.encode() for k, v in limits.to_fields().items()}) == limits
    assert TenantLimits.from_fields({b"token_quota": b"5", b"later_field": b"x"}) == TenantLimits(token_quota=5)
    for field, bad in (("weight", 0), ("weight", -1), ("weight", 1e-320), ("weight", float("inf")),
                       ("weight", float("nan")), ("max_running", 0), ("token_quota", 0), ("token_quota", True), ("token_quota", 1.5),
                       ("quota_window_seconds", 59), ("nope", 1), ("weight", 1e308), ("weight", MAX_WEIGHT * 2),
                       ("max_running", MAX_RUNNING + 1), ("token_quota", MAX_TOKEN_QUOTA + 1),
                       ("token_quota", 2**63 - 1), ("quota_window_seconds", MAX_QUOTA_WINDOW + 1)):  # fmt: skip
        for build in (checked_limits, TenantLimits, lambda **given: TenantLimits.model_validate(given)):
            with pytest.raises(InvalidRequestError) as err:  # built directly too: the client's error, not pydantic's
                build(**{field: bad})
            assert err.value.fields["field"] == field and err.value.message.startswith(f"tenant limits: {field} ")


def test_the_limits_key_is_built_from_its_prefix_and_the_quota_counter_from_the_window():
    keys = Keys("p")
    assert keys.tenant_limits("acme") == "p:tenant:acme:limits"
    assert keys.tenant_limits_prefix + "acme" + TENANT_LIMITS_SUFFIX == keys.tenant_limits("acme")
    assert keys.tenant_quota("acme", 1_800_000_000) == keys.tenant_quota_prefix("acme") + "1800000000"
    assert keys.tenant_quota("acme", 1_800_000_000) == "p:tenant:acme:quota:1800000000"


def test_a_quota_error_survives_the_wire_with_its_reset_time():
    error = QuotaExceededError("over", tenant="acme", used=120, quota=100, reset_at=1_800_003_600.0)
    rebuilt = error_from_payload(error.to_payload())
    assert isinstance(rebuilt, QuotaExceededError) and rebuilt.kind == "QuotaExceededError"
    assert (rebuilt.tenant, rebuilt.used, rebuilt.quota, rebuilt.reset_at) == ("acme", 120, 100, 1_800_003_600.0)


async def test_limits_are_set_read_and_cleared_and_have_no_ttl(client):
    assert await client.tenant_limits("acme") == TenantLimits()
    await client.set_tenant_limits("acme", TenantLimits(token_quota=500, quota_window_seconds=600, weight=2))
    assert await client.tenant_limits("acme") == TenantLimits(token_quota=500, quota_window_seconds=600, weight=2)
    assert await client.redis.ttl(client.keys.tenant_limits("acme")) == -1  # configuration: an owner, no TTL
    await client.set_tenant_limits("acme", TenantLimits(weight=3))  # replaces: the quota is gone
    assert await client.tenant_limits("acme") == TenantLimits(weight=3)
    assert await client.clear_tenant_limits("acme") is True
    assert await client.clear_tenant_limits("acme") is False
    assert not await client.redis.exists(client.keys.tenant_limits("acme"))
    for bad in (None, "a/b", "a:b"):
        with pytest.raises(InvalidRequestError) as err:
            await client.tenant_limits(bad)
        assert err.value.fields["field"] == "tenant"


async def test_a_tenants_tokens_count_in_its_current_window_with_the_windows_ttl(client):
    keys, now = client.keys, 1_800_000_030.0

    async def count(tenant: str | None, usage: AgentUsage, at: float = now) -> None:
        rt = RoundTrip()
        queue_count(rt, keys, "default", usage, now=at, tenant=tenant)
        await rt.run(client.redis)

    await count("acme", used(10, 5))
    await count("acme", used(7, 0))
    await count(None, used(100, 100))  # no tenant: no quota counter
    day = keys.tenant_quota("acme", window_start(now, DEFAULT_QUOTA_WINDOW))
    assert await client.redis.get(day) == b"22"  # prompt + completion
    assert DEFAULT_QUOTA_WINDOW < await client.redis.ttl(day) <= DEFAULT_QUOTA_WINDOW + QUOTA_TTL_MARGIN
    assert await client.redis.keys(f"{keys.prefix}:tenant:*") == [day.encode()]
    await client.set_tenant_limits("acme", TenantLimits(token_quota=30, quota_window_seconds=60))
    await count("acme", used(3, 3))  # the window of the limits: a minute
    minute = keys.tenant_quota("acme", window_start(now, 60))
    assert await client.redis.get(minute) == b"6" and 60 < await client.redis.ttl(minute) <= 60 + QUOTA_TTL_MARGIN
    status = await client.runner.run(client._op_tenant_quota("acme"))
    assert status.quota == 30 and status.window_seconds == 60 and status.reset_at > time.time() - 60


async def test_the_submit_script_refuses_a_tenant_at_its_quota_and_writes_nothing(client):
    keys = client.keys
    now = time.time()

    def job(tenant: str | None, n: int) -> TurnJob:
        return TurnJob(turn_id=f"t-{tenant}-{n}", conversation_id=f"c-{tenant}-{n}", tenant=tenant,
                       message=UserMessage(content="hi"))  # fmt: skip

    async def submit(turn: TurnJob) -> str:
        return (await client.runner.run(submit_turn(keys, turn, "enqueue"))).outcome

    await client.set_tenant_limits("acme", TenantLimits(token_quota=20))
    rt = RoundTrip()
    queue_count(rt, keys, "default", used(10, 9), now=now, tenant="acme")
    await rt.run(client.redis)
    assert await submit(job("acme", 1)) == "new"  # 19 of 20: still under
    rt = RoundTrip()
    queue_count(rt, keys, "default", used(1, 0), now=now, tenant="acme")
    await rt.run(client.redis)
    with pytest.raises(QuotaExceededError) as refused:
        await submit(job("acme", 2))
    error = refused.value
    assert (error.tenant, error.used, error.quota) == ("acme", 20, 20)
    assert error.reset_at == window_start(now, DEFAULT_QUOTA_WINDOW) + DEFAULT_QUOTA_WINDOW
    assert not await client.redis.exists(keys.turn_state("t-acme-2"), keys.conversation_turns("c-acme-2"))
    assert await submit(job("acme", 1)) == "attach"  # the turn sent before the quota ran out is still followed
    assert await submit(job("beta", 1)) == "new"  # another tenant, and the turns with none, are unaffected
    assert await submit(job(None, 1)) == "new"
    await client.set_tenant_limits("acme", TenantLimits(token_quota=21))  # a raised quota applies at once
    assert await submit(job("acme", 2)) == "new"


async def test_the_worker_reads_the_quota_only_for_a_tenant_with_one_and_raises_past_it(client):
    keys = client.keys

    async def read(quota: TurnQuota) -> None:
        rt = RoundTrip()
        pending = quota.queue_read(rt)
        if len(rt):
            await rt.run(client.redis)
        quota.check(pending)

    none = TurnQuota(keys, None)
    assert none.queue_read(RoundTrip()) is None
    unlimited = TurnQuota(keys, "beta")
    await read(unlimited)  # read once: no quota, so never again this attempt
    assert unlimited.queue_read(RoundTrip()) is None
    await client.set_tenant_limits("acme", TenantLimits(token_quota=10))
    limited = TurnQuota(keys, "acme")
    await read(limited)
    rt = RoundTrip()
    queue_count(rt, keys, "default", used(6, 4), tenant="acme")
    await rt.run(client.redis)
    with pytest.raises(QuotaExceededError) as over:
        await read(limited)
    assert over.value.used == 10 and over.value.quota == 10


def test_the_bounds_keep_a_quota_exact_in_a_lua_double():
    assert float(MAX_TOKEN_QUOTA) == MAX_TOKEN_QUOTA and float(MAX_TOKEN_QUOTA + 1) == MAX_TOKEN_QUOTA  # 2**53
    assert checked_limits(token_quota=MAX_TOKEN_QUOTA, quota_window_seconds=MAX_QUOTA_WINDOW, weight=MAX_WEIGHT,
                          max_running=MAX_RUNNING).token_quota == MAX_TOKEN_QUOTA  # fmt: skip


#: A tenant's limits as an older version, or a hand, may have stored them: each out of its range.
OUT_OF_RANGE = {"token_quota": "9223372036854775807", "quota_window_seconds": "99999999999999999999",
                "weight": "1e308", "max_running": "99999999999999999999999"}  # fmt: skip


async def test_stored_limits_out_of_range_are_read_as_their_bounds_by_the_client_and_the_scripts(client):
    keys = client.keys
    await client.redis.hset(keys.tenant_limits("q2"), mapping=OUT_OF_RANGE)
    bounded = TenantLimits(token_quota=MAX_TOKEN_QUOTA, quota_window_seconds=MAX_QUOTA_WINDOW, weight=MAX_WEIGHT,
                           max_running=MAX_RUNNING)  # fmt: skip
    assert await client.tenant_limits("q2") == bounded
    status = await client.tenant_quota("q2")
    assert (status.used, status.quota, status.window_seconds) == (0, MAX_TOKEN_QUOTA, MAX_QUOTA_WINDOW)
    assert 0 < status.reset_at <= time.time() + MAX_QUOTA_WINDOW
    rt = RoundTrip()
    queue_count(rt, keys, "default", used(6, 4), tenant="q2")  # the count's EXPIRE: window + margin, a valid TTL
    await rt.run(client.redis)
    counter = keys.tenant_quota("q2", window_start(time.time(), MAX_QUOTA_WINDOW))
    assert await client.redis.get(counter) == b"10"
    assert MAX_QUOTA_WINDOW < await client.redis.ttl(counter) <= MAX_QUOTA_WINDOW + QUOTA_TTL_MARGIN
    turn = TurnJob(turn_id="t-q2", conversation_id="c-q2", tenant="q2", message=UserMessage(content="hi"))
    assert (await client.runner.run(submit_turn(keys, turn, "enqueue"))).outcome == "new"  # under its quota
    quota = TurnQuota(keys, "q2")
    rt = RoundTrip()
    pending = quota.queue_read(rt)
    await rt.run(client.redis)
    quota.check(pending)  # the worker's check: under the quota, no error
    await client.redis.hset(keys.tenant_limits("q2"), mapping={"quota_window_seconds": "0", "token_quota": "-5",
                                                               "weight": "-1", "max_running": "0"})  # fmt: skip
    low = TenantLimits(token_quota=1, quota_window_seconds=60, weight=MIN_WEIGHT, max_running=1)
    assert await client.tenant_limits("q2") == low
    status = await client.tenant_quota("q2")
    assert (status.quota, status.window_seconds) == (1, 60)


async def test_a_hand_edited_counter_or_limits_key_of_another_type_reads_as_none(client):
    """A quota counter that holds no integer reads as 0 and is counted afresh; a limits key that is no hash reads
    as no limits: the tenant's turns are sent and started, not refused with a script error (nor, for a counter
    the worker could not parse, run again and again)."""
    keys, now = client.keys, time.time()
    counter = keys.tenant_quota("hand", window_start(now, DEFAULT_QUOTA_WINDOW))
    await client.redis.set(counter, "abc")
    await client.set_tenant_limits("hand", TenantLimits(token_quota=100))
    status = await client.tenant_quota("hand")
    assert (status.used, status.quota) == (0, 100)
    rt = RoundTrip()
    queue_count(rt, keys, "default", used(6, 4), now=now, tenant="hand")
    await rt.run(client.redis)
    assert await client.redis.get(counter) == b"10"
    await client.redis.delete(keys.tenant_limits("odd"))
    await client.redis.set(keys.tenant_limits("odd"), "oops")
    status = await client.tenant_quota("odd")
    assert (status.used, status.quota, status.window_seconds) == (0, None, DEFAULT_QUOTA_WINDOW)
    turn = TurnJob(turn_id="t-odd", conversation_id="c-odd", tenant="odd", message=UserMessage(content="hi"))
    assert (await client.runner.run(submit_turn(keys, turn, "enqueue"))).outcome == "new"


async def test_smith_tenant_and_usage_show_stored_limits_out_of_range_as_their_bounds(client, monkeypatch, capsys):
    prefix = client.keys.prefix
    monkeypatch.setattr(smith_cli, "_connect", lambda args: SmithClient(client.redis, prefix=args.prefix))
    await client.redis.hset(client.keys.tenant_limits("q2"), mapping=OUT_OF_RANGE)
    assert await smith_cli._run_tenant(smith_cli.parse_args(["tenant", "show", "q2", "--prefix", prefix])) == 0
    out = capsys.readouterr().out
    assert f"token_quota            {MAX_TOKEN_QUOTA}" in out and "quota_window_seconds   31622400" in out
    assert await smith_cli._run_usage(smith_cli.parse_args(["usage", "--tenant", "q2", "--prefix", prefix])) == 0
    assert f"token quota: 0 of {MAX_TOKEN_QUOTA} tokens used in the current 31622400 s window" in capsys.readouterr().out


async def test_an_update_changes_only_the_fields_given_and_concurrent_ones_all_stand(client):
    await client.update_tenant_limits("acme", token_quota=500)
    assert await client.redis.hgetall(client.keys.tenant_limits("acme")) == {b"weight": b"1.0", b"token_quota": b"500"}
    await client.set_tenant_limits("acme", TenantLimits(weight=2, token_quota=500, quota_window_seconds=600))
    await client.update_tenant_limits("acme", token_quota=None, max_running=3)  # None: back to no quota
    assert await client.tenant_limits("acme") == TenantLimits(weight=2, max_running=3, quota_window_seconds=600)
    await client.update_tenant_limits("acme", quota_window_seconds=DEFAULT_QUOTA_WINDOW)  # its default: not stored
    assert await client.redis.hgetall(client.keys.tenant_limits("acme")) == {b"weight": b"2.0", b"max_running": b"3"}
    for bad in ({}, {"max_running": 0}, {"nope": 1}):
        with pytest.raises(InvalidRequestError):
            await client.update_tenant_limits("acme", **bad)
    assert await client.tenant_limits("acme") == TenantLimits(weight=2, max_running=3)


async def test_concurrent_smith_tenant_sets_of_different_fields_both_stand(client, monkeypatch, capsys):
    prefix = client.keys.prefix
    monkeypatch.setattr(smith_cli, "_connect", lambda args: SmithClient(client.redis, prefix=args.prefix))

    async def smith(*argv: str) -> int:
        return await smith_cli._run_tenant(smith_cli.parse_args(["tenant", "set", "acme", *argv, "--prefix", prefix]))

    assert await asyncio.gather(smith("--token-quota", "1000"), smith("--max-running", "4")) == [0, 0]
    assert await client.tenant_limits("acme") == TenantLimits(token_quota=1000, max_running=4)


def test_smith_tenant_parses_its_action_and_limits():
    args = smith_cli.parse_args(["tenant", "set", "acme", "--token-quota", "1000", "--window", "3600"])
    assert (args.action, args.tenant, args.limits) == ("set", "acme", {"token_quota": 1000,
                                                                      "quota_window_seconds": 3600})  # fmt: skip
    assert smith_cli.parse_args(["tenant", "set", "acme", "--weight", "0.5", "--max-running", "4"]).limits == {
        "weight": 0.5, "max_running": 4}  # fmt: skip
    assert smith_cli.parse_args(["tenant", "show", "acme"]).limits == {}
    for argv in (["tenant", "set", "acme"], ["tenant", "show", "acme", "--weight", "2"],
                 ["tenant", "set", "acme", "--token-quota", "x"], ["tenant", "drop", "acme"]):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:  # malformed: argparse's usage error
            smith_cli.parse_args(argv)
        assert exit_.value.code == 2, argv


@pytest.mark.parametrize("argv", [
    ["set", "acme", "--weight", "0"], ["set", "acme", "--window", "59"], ["set", "a/b", "--weight", "1"],
    ["set", "a:b", "--weight", "1"], ["show", "a:b"], ["clear", "a:b"],
    ["set", "q2", "--token-quota", "9223372036854775807"], ["set", "q2", "--window", "99999999999999999999"],
    ["set", "q2", "--weight", "1e308"], ["set", "q2", "--max-running", "99999999999999999999999"],
])  # fmt: skip
def test_smith_tenant_refuses_a_bad_name_or_limit_as_ask_refuses_a_bad_tenant(argv, monkeypatch, capsys):
    """Checked by the client's rules before any connection: one InvalidRequestError line, exit code 1."""
    monkeypatch.setenv("SMITH_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing answers: refused before connecting
    with pytest.raises(SystemExit) as exit_:
        smith_cli.smith_main(["tenant", *argv])
    assert exit_.value.code == 1
    assert capsys.readouterr().err.startswith("smith: InvalidRequestError: ")


async def test_smith_tenant_sets_shows_and_clears(client, monkeypatch, capsys):
    prefix = client.keys.prefix
    monkeypatch.setattr(smith_cli, "_connect", lambda args: SmithClient(client.redis, prefix=args.prefix))

    errors: list[str] = []

    async def smith(*argv: str) -> list[str]:
        assert await smith_cli._run_tenant(smith_cli.parse_args(["tenant", *argv, "--prefix", prefix])) == 0
        out, err = capsys.readouterr()
        errors.append(err)
        return out.splitlines()

    await smith("set", "acme", "--token-quota", "1000")
    lines = await smith("set", "acme", "--window", "3600")  # changes the limits given, keeps the others
    assert await client.tenant_limits("acme") == TenantLimits(token_quota=1000, quota_window_seconds=3600)
    assert lines[0] == f"tenant 'acme', prefix {prefix!r}:"
    assert [line.split() for line in lines[1:5]] == [["weight", "1"], ["max_running", "-"], ["token_quota", "1000"],
                                                     ["quota_window_seconds", "3600"]]  # fmt: skip
    assert lines[5].split()[:3] == ["used", "0", "tokens"] and lines[6].split()[:2] == ["resets", "at"]
    assert await smith("show", "acme") == lines
    assert await smith("clear", "acme") == []
    assert await client.tenant_limits("acme") == TenantLimits()
    assert await smith("clear", "acme") == [] and "tenant 'acme' has no limits" in errors[-1]
