"""Tenants (docs/architecture.md, Tenants): ``send(..., tenant=)`` and the client's default, checked and carried on
the turn's job; the bounded ``tenant`` metrics label; the ``<tenant>/<agent>:<kind>`` usage fields, written and
read per tenant; the ``smith.tenant`` span attribute."""

from __future__ import annotations

import time

import fakeredis
import pytest

from smith_client import AgentUsage, InvalidRequestError, SmithClient, TenantLimits, TokenUsage
from smith_client import cli as smith_cli
from smith_client.connection import connect_redis
from smith_client.events import TurnStartedData
from smith_client.jobs import TurnJob
from smith_client.keys import Keys
from smith_client.messages import UserMessage
from smith_client.roundtrip import RoundTrip
from smith_client.sync_client import SyncSmithClient
from smith_client.turns import fingerprint
from smith_client.usage import bucket_of, parse_field, usage, usage_by_tenant, usage_field
from smith_client.validation import build_turn_request, check_tenant
from smith_worker.config import Settings
from smith_worker.ops import tracing
from smith_worker.ops.metrics import OTHER_TENANTS, TenantLabels, WorkerMetrics
from smith_worker.ops.usage import queue_count

NOW = 1_800_000_030.0
HOUR = 3600


def calls(n: int, prompt: int, completion: int) -> AgentUsage:
    return AgentUsage(requests=n, prompt=prompt, completion=completion, total=prompt + completion)


def test_a_tenant_is_an_id_without_a_colon_and_none_means_none():
    assert check_tenant(None) is None
    assert check_tenant("acme.eu-1@x_y") == "acme.eu-1@x_y"
    for bad in ("", "a/b", "a:b", "a b", "x" * 201, 3, b"acme"):
        with pytest.raises(InvalidRequestError) as err:
            check_tenant(bad)
        assert err.value.fields["field"] == "tenant"
    job, _, _ = build_turn_request("hi", {"conversation_id": "c", "tenant": "acme"})
    assert job.tenant == "acme"
    assert build_turn_request("hi", {"conversation_id": "c"})[0].tenant is None
    with pytest.raises(InvalidRequestError):
        build_turn_request("hi", {"conversation_id": "c", "tenant": "a/b"})


def test_the_tenant_is_part_of_the_fingerprint_and_no_tenant_keeps_the_old_one():
    job = TurnJob(turn_id="t", conversation_id="c", message=UserMessage(content="hi"))
    acme = job.model_copy(update={"tenant": "acme"})
    assert fingerprint(acme) != fingerprint(job) != fingerprint(job.model_copy(update={"tenant": "other"}))
    assert fingerprint(acme) == fingerprint(acme.model_copy(update={"submitted_at": 5.0}))
    # a job without a tenant digests as before the field existed (a retried send across an upgrade still attaches)
    before = job.model_dump(mode="json")
    del before["tenant"]
    assert "tenant" not in TurnJob.model_validate(before).model_dump(exclude_defaults=True)
    assert TurnJob.model_validate_json(acme.model_dump_json()).tenant == "acme"  # stored with the job


async def test_the_clients_tenant_is_the_default_of_its_sends_and_a_different_tenant_conflicts():
    redis = fakeredis.FakeAsyncRedis()
    client = SmithClient(redis, prefix="t", tenant="acme")
    assert client.with_tenant({"conversation_id": "c"})["tenant"] == "acme"
    assert client.with_tenant({"conversation_id": "c", "tenant": "beta"})["tenant"] == "beta"
    assert "tenant" not in SmithClient(redis, prefix="t").with_tenant({"conversation_id": "c"})
    with pytest.raises(InvalidRequestError):
        SmithClient(redis, prefix="t", tenant="a:b")
    with pytest.raises(InvalidRequestError):
        SmithClient.from_url("redis://127.0.0.1:1/0", tenant="a/b")
    assert SyncSmithClient(fakeredis.FakeRedis(), prefix="t", tenant="acme").tenant == "acme"


def test_turn_started_carries_the_tenant_or_none():
    assert TurnStartedData(conversation_id="c", agent="a", tenant="acme").to_wire()["tenant"] == "acme"
    assert TurnStartedData(conversation_id="c", agent="a").to_wire()["tenant"] is None


def test_tenant_labels_keep_the_first_n_tenants_then_count_the_rest_as_other():
    labels = TenantLabels(2)
    assert [labels(t) for t in (None, "a", "b", "c", "a", "b", "d", "")] == ["", "a", "b", OTHER_TENANTS, "a", "b",
                                                                             OTHER_TENANTS, ""]  # fmt: skip
    assert Settings.model_fields["tenant_labels_max"].default == 100


async def test_metrics_label_turns_and_model_calls_with_the_capped_tenant():
    class Reply:
        class message:  # noqa: N801 (the shape of an LlmResponse)
            usage = TokenUsage(prompt=10, completion=5, total=15)

    async def answer() -> Reply:
        return Reply()

    metrics = WorkerMetrics(tenant_labels_max=1)
    await metrics.count_llm_request(answer(), "default", "acme")
    await metrics.count_llm_request(answer(), "default", "beta")  # past the cap
    await metrics.count_llm_request(answer(), "default")
    metrics.record_turn("default", "completed", 0.1, "acme")
    metrics.record_turn("default", "completed", 0.1, "gamma")
    sample = metrics.registry.get_sample_value
    for tenant in ("acme", OTHER_TENANTS, ""):
        assert sample("smith_llm_tokens_total", {"agent": "default", "kind": "prompt", "tenant": tenant}) == 10
        assert sample("smith_llm_requests_total", {"agent": "default", "status": "ok", "tenant": tenant}) == 1
    assert sample("smith_llm_tokens_total", {"agent": "default", "kind": "prompt", "tenant": "beta"}) is None
    assert sample("smith_turns_total", {"agent": "default", "status": "completed", "tenant": "acme"}) == 1
    assert sample("smith_turns_total", {"agent": "default", "status": "completed", "tenant": OTHER_TENANTS}) == 1


async def test_a_tenants_counts_go_in_front_of_the_agent_and_are_read_per_tenant(redis_url):
    """The workers' count (a Lua script: a real redis-server), read whole, per tenant and grouped."""
    redis, keys = connect_redis(redis_url), Keys(f"t{time.time_ns()}")

    async def count_now(used: AgentUsage, tenant: str | None) -> None:
        rt = RoundTrip()
        queue_count(rt, keys, "default", used, now=NOW, tenant=tenant)
        await rt.run(redis)

    try:
        await count_now(calls(1, 10, 5), "acme")
        await count_now(calls(2, 20, 10), None)
        await count_now(calls(1, 1, 1), "beta")
        fields = await redis.hgetall(keys.usage_bucket(bucket_of(NOW)))
        assert fields[b"acme/default:prompt"] == b"10" and fields[b"default:prompt"] == b"20"
        assert parse_field(usage_field("default", "total", "acme")) == ("acme", "default", "total")
        client = SmithClient(redis, prefix=keys.prefix)
        assert await client.runner.run(usage(client.keys, HOUR, now=NOW)) == {"default": calls(4, 31, 16)}
        assert await client.runner.run(usage(client.keys, HOUR, now=NOW, tenant="acme")) == {
            "default": calls(1, 10, 5)}  # fmt: skip
        assert await client.runner.run(usage(client.keys, HOUR, now=NOW, tenant="nobody")) == {}
        grouped = await client.runner.run(usage_by_tenant(client.keys, HOUR, now=NOW))
        assert grouped == {"": {"default": calls(2, 20, 10)}, "acme": {"default": calls(1, 10, 5)},
                           "beta": {"default": calls(1, 1, 1)}}  # fmt: skip
        with pytest.raises(InvalidRequestError) as err:
            await client.usage(tenant="a/b")
        assert err.value.fields["field"] == "tenant"
    finally:
        await redis.delete(*await redis.keys(f"{keys.prefix}:*"))
        await redis.aclose()


async def test_smith_usage_filters_by_tenant_and_groups_by_tenant(monkeypatch, capsys, redis_url):
    """Counted by the workers' script (a real redis-server); with --tenant, the tenant's quota line when it has one."""
    redis, prefix = connect_redis(redis_url), f"u{time.time_ns()}"
    monkeypatch.setattr(smith_cli, "_connect", lambda args: SmithClient(redis, prefix=args.prefix))
    rt = RoundTrip()
    for tenant, used in (("acme", calls(1, 10, 5)), (None, calls(2, 20, 10)), ("-", calls(4, 1, 1))):
        queue_count(rt, Keys(prefix), "default", used, tenant=tenant)
    await rt.run(redis)
    try:
        usage_of = ["usage", "--prefix", prefix, "--tenant", "acme"]
        assert await smith_cli._run_usage(smith_cli.parse_args(usage_of)) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].endswith(f"prefix {prefix!r}, tenant 'acme':")  # no quota: no quota line
        assert [line.split() for line in lines[1:]] == [
            ["agent", "requests", "prompt", "completion", "total"], ["default", "1", "10", "5", "15"]]  # fmt: skip
        await SmithClient(redis, prefix=prefix).set_tenant_limits("acme", TenantLimits(token_quota=100))
        assert await smith_cli._run_usage(smith_cli.parse_args(usage_of)) == 0
        quota_line = capsys.readouterr().out.splitlines()[0]
        assert quota_line.startswith("token quota: 15 of 100 tokens used in the current 86400 s window; resets at ")
        assert await smith_cli._run_usage(smith_cli.parse_args(["usage", "--prefix", prefix, "--by-tenant"])) == 0
        assert [line.split() for line in capsys.readouterr().out.splitlines()[1:]] == [
            ["tenant", "agent", "requests", "prompt", "completion", "total"],
            ["(none)", "default", "2", "20", "10", "30"],
            ["-", "default", "4", "1", "1", "2"],  # a tenant named "-": its own row, not the turns with none
            ["acme", "default", "1", "10", "5", "15"],
            ["(all)", "7", "31", "16", "47"],
        ]
        zed = ["usage", "--prefix", prefix, "--tenant", "zed"]
        assert await smith_cli._run_usage(smith_cli.parse_args(zed)) == 0
        assert "no model calls of any agent of tenant 'zed' counted" in capsys.readouterr().err
    finally:
        await redis.delete(*await redis.keys(f"{prefix}:*"))
        await redis.aclose()


def test_the_attempt_span_carries_the_tenant_when_set(monkeypatch):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    job = TurnJob(turn_id="t", conversation_id="c", message=UserMessage(content="hi"))
    assert tracing.attempt_span(job.model_copy(update={"tenant": "acme"}), 1) is tracing.NO_SPAN  # off: no-op
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for name in ("_tracer", "ENABLED", "_capture", "_otel"):
        monkeypatch.setattr(tracing, name, getattr(tracing, name) if name != "_otel" else {})
    tracing.use_provider(provider)
    try:
        with tracing.attempt_span(job.model_copy(update={"tenant": "acme"}), 1):
            pass
        with tracing.attempt_span(job, 1):
            pass
        tenanted, plain = exporter.get_finished_spans()
        assert tenanted.attributes["smith.tenant"] == "acme"
        assert "smith.tenant" not in plain.attributes
    finally:
        provider.shutdown()
