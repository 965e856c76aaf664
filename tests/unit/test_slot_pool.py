"""The slot-pinned pools (smith_client/connection.py, ``cluster_key``): what ``SlotMaster`` learns from a
``CLUSTER SLOTS`` reply and from error replies (the replies below are the shapes redis.io documents, as redis-py's
parser hands them over), and the clients ``connect_redis`` / ``connect_sync_redis`` build. Against a real cluster:
tests/integration/test_redis_slot_pool.py."""

from __future__ import annotations

import pytest
import redis as sync_redis
from arq.connections import ArqRedis
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import AuthenticationError, NoPermissionError, ReadOnlyError, ResponseError
from redis.utils import HIREDIS_AVAILABLE

from smith_client import connection
from smith_client.connection import (
    SLOT_RETRIES,
    BoundedSlotPool,
    SlotConnection,
    SlotMaster,
    SlotPool,
    SlotSSLConnection,
    SyncBoundedSlotPool,
    SyncSlotConnection,
    SyncSlotPool,
    SyncSlotSSLConnection,
    connect_redis,
    connect_sync_redis,
)
from smith_client.errors import ConfigurationError
from smith_client.serialization import job_serializer

KEY = "{smith}"
SLOT = key_slot(b"smith")  # 16329
ORIGIN = ("10.0.0.9", 7000)


def node(host: str | bytes, port: int, node_id: bytes = b"id") -> list:
    return [host, port, node_id, []]


def slots_reply(*masters_and_replicas: tuple[int, int, list, list[list]]) -> list:
    """A ``CLUSTER SLOTS`` reply: ``(first, last, master, [replica, …])`` per range."""
    return [[first, last, master, *replicas] for first, last, master, replicas in masters_and_replicas]


REPLY = slots_reply(
    (0, 5460, node(b"10.0.0.1", 7000), [node(b"10.0.0.4", 7000)]),
    (5461, 10922, node(b"10.0.0.2", 7000), [node(b"10.0.0.5", 7000)]),
    (10923, 16383, node(b"10.0.0.3", 7000), [node(b"10.0.0.6", 7000)]),
)


@pytest.fixture(autouse=True)
def no_known_contacts(monkeypatch):
    """Each test starts with no node learned by earlier ones (the process-wide memory of pools)."""
    monkeypatch.setattr(connection, "_KNOWN_CONTACTS", {})


def test_a_pool_built_later_for_the_same_url_starts_from_the_nodes_learned():
    SlotMaster(KEY, ORIGIN).learn(REPLY, ORIGIN)
    later = SlotMaster(KEY, ORIGIN)  # e.g. a worker's new wake-up connection, once the URL's node is dead
    assert later.contacts[:2] == [ORIGIN, ("10.0.0.1", 7000)] and len(later.contacts) == 7
    later.failed(ORIGIN)
    assert later.contacts[-1] == ORIGIN and SlotMaster(KEY, ORIGIN).contacts[0] == ORIGIN  # not changed in place
    assert SlotMaster(KEY, ("10.0.0.99", 7000)).contacts == [("10.0.0.99", 7000)]  # another URL: its own


def test_refusals_from_every_node_asked_are_not_retried():
    master = SlotMaster(KEY, ORIGIN)
    disabled = master.none_answered([(ORIGIN, ResponseError("This instance has cluster support disabled"))])
    assert isinstance(disabled, ConfigurationError) and disabled.setting == "SMITH_REDIS_CLUSTER"
    assert "10.0.0.9:7000 is not a Redis Cluster node" in str(disabled)
    refused = master.none_answered([(ORIGIN, AuthenticationError("invalid username-password pair"))])
    assert type(refused) is AuthenticationError and "10.0.0.9:7000" in str(refused)
    noperm = master.none_answered([(ORIGIN, NoPermissionError("no permissions to run the 'cluster|slots' command"))])
    assert type(noperm) is NoPermissionError
    mixed = master.none_answered([(ORIGIN, ResponseError("x")), (("10.0.0.1", 7000), RedisConnectionError("down"))])
    assert type(mixed) is RedisConnectionError and "10.0.0.1:7000: down" in str(mixed)


def test_the_reply_names_the_slots_master_and_every_node_becomes_a_contact():
    master = SlotMaster(KEY, ORIGIN)
    assert master.slot == SLOT == SlotMaster("{smith}:turn:t1:state", ORIGIN).slot
    assert master.learn(REPLY, ("10.0.0.2", 7000)) == ("10.0.0.3", 7000) == master.address
    assert master.contacts == [  # the node that answered, the reply's nodes, the URL's node last
        ("10.0.0.2", 7000),
        ("10.0.0.1", 7000),
        ("10.0.0.4", 7000),
        ("10.0.0.5", 7000),
        ("10.0.0.3", 7000),
        ("10.0.0.6", 7000),
        ORIGIN,
    ]


def test_an_empty_host_is_the_asked_nodes_and_an_unknown_one_is_no_contact():
    master = SlotMaster(KEY, ORIGIN)
    reply = slots_reply((0, 16383, node("", 7001), [node("?", 7002), node("10.0.0.7", 7003)]))
    assert master.learn(reply, ("10.0.0.8", 7000)) == ("10.0.0.8", 7001)
    assert master.contacts == [("10.0.0.8", 7000), ("10.0.0.8", 7001), ("10.0.0.7", 7003), ORIGIN]


def test_a_slot_no_master_serves_is_a_connection_error_to_retry():
    master = SlotMaster(KEY, ORIGIN)
    with pytest.raises(RedisConnectionError, match=f"no master serving hash slot {SLOT}"):
        master.learn(REPLY[:2], ORIGIN)
    assert master.address is None
    assert ("10.0.0.1", 7000) in master.contacts  # the nodes it did name are asked next time


def test_a_contact_that_did_not_answer_is_asked_last():
    master = SlotMaster(KEY, ORIGIN)
    master.learn(REPLY, ORIGIN)
    master.failed(ORIGIN)
    master.failed(("10.0.0.1", 7000))
    assert master.contacts[-2:] == [ORIGIN, ("10.0.0.1", 7000)]


def test_moved_for_the_slot_points_the_pool_at_its_target_and_is_retried():
    master = SlotMaster(KEY, ORIGIN)
    master.address = ORIGIN
    raised = master.redirected(ResponseError(f"MOVED {SLOT} 10.0.0.2:7001"), ORIGIN)
    assert isinstance(raised, RedisConnectionError) and f"MOVED {SLOT}" in str(raised)
    assert master.address == ("10.0.0.2", 7001)
    assert not master.serves_from(ORIGIN) and master.serves_from(("10.0.0.2", 7001))
    master.redirected(ResponseError(f"MOVED {SLOT} :7002"), ("10.0.0.2", 7001))  # empty host: the same node's
    assert master.address == ("10.0.0.2", 7002)


@pytest.mark.parametrize(
    "error",
    [
        ResponseError(f"ASK {SLOT} 10.0.0.2:7001"),
        ResponseError("TRYAGAIN Multiple keys request during rehashing of slot"),
        ResponseError("CLUSTERDOWN The cluster is down"),
        ResponseError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
        ReadOnlyError("You can't write against a read only replica."),  # redis-py strips READONLY
    ],
)
def test_the_other_redirections_and_refusals_are_retried_after_asking_the_nodes_again(error):
    master = SlotMaster(KEY, ORIGIN)
    master.address = ORIGIN
    assert isinstance(master.redirected(error, ORIGIN), RedisConnectionError)
    assert master.address is None


def test_an_error_from_a_connection_elsewhere_keeps_the_address_learned_since():
    master = SlotMaster(KEY, ORIGIN)
    master.address = ("10.0.0.2", 7001)  # learned from a MOVED meanwhile
    master.redirected(ResponseError("CLUSTERDOWN The cluster is down"), ORIGIN)
    master.forget(ORIGIN)
    assert master.address == ("10.0.0.2", 7001)
    master.forget(("10.0.0.2", 7001))
    assert master.address is None


def test_a_redirection_for_another_slot_is_a_key_without_the_tag():
    master = SlotMaster(KEY, ORIGIN)
    master.address = ORIGIN
    for reply in ("MOVED 866 10.0.0.1:7000", "ASK 866 10.0.0.1:7000"):
        raised = master.redirected(ResponseError(reply), ORIGIN)
        assert type(raised) is ResponseError and "hash tag" in str(raised) and reply in str(raised)
    assert master.address == ORIGIN


@pytest.mark.parametrize("error", [ResponseError("WRONGTYPE Operation against a key holding the wrong kind"),
                                   ResponseError("NOSCRIPT No matching script. Please use EVAL.")])  # fmt: skip
def test_other_error_replies_are_the_callers(error):
    master = SlotMaster(KEY, ORIGIN)
    master.address = ORIGIN
    assert master.redirected(error, ORIGIN) is error and master.address == ORIGIN


@pytest.mark.parametrize(("options", "pool_class"), [({}, SlotPool), ({"max_connections": 6}, BoundedSlotPool)])
def test_connect_redis_with_a_cluster_key_builds_an_arq_client_on_a_pinned_pool(options, pool_class):
    redis = connect_redis("redis://u:p@10.0.0.9:7000/0", cluster_key=KEY, socket_timeout=2.5, **options)  # lazy
    assert isinstance(redis, ArqRedis) and redis.job_serializer is job_serializer
    pool = redis.connection_pool
    assert type(pool) is pool_class and pool.slot_master.slot == SLOT and pool.slot_master.contacts == [ORIGIN]
    made = pool.make_connection()
    assert isinstance(made, SlotConnection) and not isinstance(made, SlotSSLConnection)
    assert (made.username, made.password, made.socket_timeout, made.socket_connect_timeout) == ("u", "p", 2.5, 2.5)
    assert made.retry._retries == SLOT_RETRIES and made.health_check_interval == connection.HEALTH_CHECK_INTERVAL
    assert issubclass(pool.connection_class, connection._HiredisPacking) == HIREDIS_AVAILABLE


def test_a_capped_pinned_pool_waits_its_pool_timeout():
    redis = connect_redis("redis://10.0.0.9:7000/0", cluster_key=KEY, max_connections=6, pool_timeout=0.5)
    pool = redis.connection_pool
    assert (pool.max_connections, pool.timeout) == (6, 0.5)
    pool = connect_sync_redis("redis://10.0.0.9:7000/0", cluster_key=KEY, max_connections=6).connection_pool
    assert type(pool) is SyncBoundedSlotPool and (pool.max_connections, pool.timeout) == (6, 5.0)


def test_tls_urls_give_tls_pinned_connections():
    made = connect_redis("rediss://10.0.0.9:7000/0", cluster_key=KEY).connection_pool.make_connection()
    assert isinstance(made, SlotSSLConnection)
    made = connect_sync_redis("rediss://10.0.0.9:7000/0", cluster_key=KEY).connection_pool.make_connection()
    assert isinstance(made, SyncSlotSSLConnection)


def test_connect_sync_redis_with_a_cluster_key_builds_a_blocking_client_on_a_pinned_pool():
    redis = connect_sync_redis("redis://10.0.0.9:7000/0", cluster_key=KEY)
    assert type(redis) is sync_redis.Redis and type(redis.connection_pool) is SyncSlotPool
    made = redis.connection_pool.make_connection()
    assert type(made) is SyncSlotConnection and made.retry._retries == SLOT_RETRIES
    assert redis.connection_pool.slot_master.contacts == [ORIGIN]
