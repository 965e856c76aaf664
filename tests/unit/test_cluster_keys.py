"""Redis Cluster, one hash slot (docs/cluster.md): with ``Keys(cluster=True)`` every name the runtime builds, arq's
per-job keys and the names the Lua scripts assemble from a prefix hash to the slot of the prefix's tag."""

import inspect

import pytest
from redis.cluster import key_slot

from smith_client.keys import Keys

#: Sample values of every parameter a name method of Keys takes (a new parameter name fails the test below).
SAMPLES = {
    "turn_id": "t1",
    "root_turn_id": "t1",
    "conversation_id": "c1",
    "step": 2,
    "index": 0,
    "position": "1.0",
    "worker_id": "host:1:turns:ab",
    "alias": "lab",
    "minute": 29_000_000,
    "tenant": "acme",
    "window_start": 0,
    "endpoint": "e1",
    "capset": "d1",
    "digest": "d1",
    "attempt": 1,
    "at_ms": 1,
    "request_id": "r1",
}
#: Methods that return something other than key or channel names (arq_abort_set: arq's name, which the runtime
#: never uses).
NOT_NAMES = {"turn_id_of_state", "subagent_memory_scope", "turn_patterns", "arq_abort_set", "moved"}


def every_name(keys: Keys) -> dict[str, list[str]]:
    """What each public member of ``keys`` builds, as a list of names (prefixes completed with a sample)."""
    names: dict[str, list[str]] = {}
    for member, value in inspect.getmembers(type(keys)):
        if member.startswith("_") or member in NOT_NAMES or member in {"prefix", "cluster", "turn_ttl", "history_ttl"}:
            continue
        if isinstance(value, property):
            built = getattr(keys, member)
        elif callable(value):
            method = getattr(keys, member)
            params = inspect.signature(method).parameters
            context = {"queue_name": keys.turns_queue, "job_id": keys.turn_job_id("t1")}
            args = {name: context[name] if name in context else SAMPLES[name] for name in params}
            built = method(**args)
        else:
            continue
        if member == "tenant_limits_affixes":  # a prefix and a suffix, with a tenant between them
            built = "acme".join(built)
        if isinstance(built, dict):  # kinds of keys → their patterns (smith_client.migration)
            built = [pattern for patterns in built.values() for pattern in patterns]
        names[member] = built if isinstance(built, list) else [built]
    return names


def test_every_name_shares_the_tags_slot():
    keys = Keys("acme-prod", cluster=True)
    slot = key_slot(keys.key_prefix.encode())
    job = keys.turn_job_id("t1")
    assert keys.cluster_slot_key == "{acme-prod}"
    names = every_name(keys)
    assert len(names) > 60  # the scan found the name methods
    for member, built in names.items():
        for name in built:
            if name is None or member in {"acl_patterns", "key_patterns", "all_pattern", "arq_pattern"}:
                continue
            # a prefix (capability sets, tenants, arq's claim keys) is completed by the scripts with a digest,
            # a tenant or a job id: the tag comes first in the prefix, or with the job id
            complete = name + job if member == "arq_claim_prefixes" else name
            assert key_slot(complete.encode()) == slot, (member, name)


def test_arq_per_job_keys_land_in_the_slot():
    keys = Keys("smith", cluster=True)
    slot = key_slot(b"smith")
    for job in (keys.turn_job_id("t"), keys.tool_job_id("t", 1, 0, "1.0"), keys.turn_rerun_job_id("t", 2)):
        for name in (keys.arq_job(job), keys.arq_in_progress(job), keys.arq_result(job), keys.arq_retry(job)):
            assert key_slot(name.encode()) == slot


@pytest.mark.parametrize("prefix", ["smith", "t0a1b2c3:x", "a@b.c"])
def test_without_cluster_the_names_are_unchanged(prefix):
    plain, tagged = Keys(prefix), Keys(prefix, cluster=True)
    assert plain.key_prefix == prefix and plain.cluster_slot_key is None
    assert plain.turn_state("t") == f"{prefix}:turn:t:state"
    assert tagged.turn_state("t") == f"{{{prefix}}}:turn:t:state"
    assert tagged.all_pattern == f"{{{prefix}}}:*"
