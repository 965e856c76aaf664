"""Tenant isolation by prefix: the Redis ACL rules of a user that may serve or use one prefix only.

Give each tenant its own ``SMITH_PREFIX`` and a Redis user created with
:func:`tenant_acl_rules` (``ACL SETUSER <user> <rules…>``); its workers and
clients connect with ``redis://<user>:<password>@host/db``. That user can
touch only the keys and channels of :attr:`Keys.acl_patterns` and run only
:data:`TENANT_COMMANDS`, the commands the runtime (and arq) send; everything
else, another prefix's history included, answers ``NOPERM``. Keyless
commands that list or wipe the database (``KEYS``, ``SCAN``, ``FLUSHDB``…)
are not granted, so ``smith keys`` needs an administrator's credentials, as
``smith migrate-to-cluster`` does (it also sends :data:`OPERATOR_COMMANDS`).

Rules: https://redis.io/docs/latest/operate/oss_and_stack/management/security/acl/

Run ``python -m smith_client.acl PREFIX [--cluster]`` to print the ``ACL SETUSER`` line.
"""

from __future__ import annotations

import sys

from smith_client.keys import Keys

#: Every command the client, the workers and arq send (Lua scripts' inner calls included).
TENANT_COMMANDS = (
    "ping",
    "info",
    "dbsize",
    "select",  # arq logs INFO and DBSIZE at start-up
    "get",
    "set",
    "mget",
    "del",
    "exists",
    "expire",
    "pexpire",
    "ttl",
    "pttl",  # a worker id's claim (lua/register.lua)
    "type",
    "incr",
    "incrby",
    "psetex",
    "setex",
    "hget",
    "hset",
    "hsetnx",
    "hgetall",
    "hincrby",
    "hdel",
    "hexists",
    "hkeys",
    "hlen",
    "hmget",  # e.g. the tree's sampled tokens, read with each step (smith_worker/agent/loop.py)
    "sadd",  # capability sets (smith_worker/ops/registration.py) and their reads in scripts
    "sismember",
    "srem",  # a turn worker's running turns (Keys.worker_turns)
    "scard",
    "smembers",
    "lrange",
    "lindex",
    "lpos",
    "lrem",
    "rpush",
    "llen",
    "lpop",
    "ltrim",
    "blpop",  # the wake-up wait of workers (smith_worker/queue/pickup.py)
    "zadd",
    "zincrby",
    "zrem",
    "zcard",
    "zcount",
    "zscore",
    "zmscore",
    "zrange",
    "zrangebyscore",
    "zremrangebyscore",
    "xadd",
    "xrange",
    "xlen",
    "publish",
    "time",  # an event's ts, from the server's clock (lua/lib.lua's event_head)
    "subscribe",
    "unsubscribe",
    "eval",
    "evalsha",
    "script|load",
    "script|exists",
    "multi",
    "exec",
    "discard",
    "watch",
    "unwatch",
)

#: Commands only an operator's tools send, never granted to a tenant: ``smith migrate-to-cluster`` copies a deployment
#: with them (smith_client/migration.py), with the ``SCAN`` a tenant has not either; ``RESTORE`` writes a value from a
#: serialized payload, which Redis checks in depth only with ``sanitize-dump-payload``.
OPERATOR_COMMANDS = ("dump", "restore")


#: What a Redis Cluster client sends besides: the slot-pinned pools ask a node where the slot's master is
#: (smith_client/connection.py, ``SlotMaster``).
CLUSTER_COMMANDS = ("cluster|slots",)


def tenant_acl_rules(prefix: str, password: str, cluster: bool = False) -> list[str]:
    """The arguments after ``ACL SETUSER <user>`` for a tenant confined to ``prefix``.

    ``password`` is the user's password (sent as ``>password``). With ``cluster`` (the deployment runs on Redis
    Cluster, ``SMITH_REDIS_CLUSTER``) the patterns are those of its tagged names (``{prefix}:…``) and
    :data:`CLUSTER_COMMANDS` are granted too; ``ACL SETUSER`` is per node, so run it on every node of the
    cluster (docs/cluster.md, ACL users).
    """
    commands = TENANT_COMMANDS + (CLUSTER_COMMANDS if cluster else ())
    patterns = Keys(prefix, cluster=cluster).acl_patterns
    return ["reset", "on", f">{password}", *patterns, "-@all", *(f"+{c}" for c in commands)]


if __name__ == "__main__":  # pragma: no cover - a printing helper for operators
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit("usage: python -m smith_client.acl [PREFIX] [--cluster]: print the ACL SETUSER line of a tenant user")
    name = next((arg for arg in sys.argv[1:] if arg != "--cluster"), "smith")
    print("ACL SETUSER", name, " ".join(tenant_acl_rules(name, "PASSWORD", "--cluster" in sys.argv[1:])))
