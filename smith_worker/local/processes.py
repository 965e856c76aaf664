"""Child processes for local runs: free ports, a private ``redis-server``, workers.

Every process started here is stopped by :meth:`ManagedProcess.stop`
(SIGTERM, then SIGKILL after ``grace`` seconds) and reaped, so nothing is
left running.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import redis as sync_redis

from smith_client.errors import ConfigurationError, SmithTimeoutError
from smith_worker.ops.redaction import redact_text


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    """True when a Redis server at ``url`` answers PING within ``timeout`` seconds; False when none does.

    Raises :class:`ConfigurationError` when one answers but refuses ``url``'s terms (a wrong password or
    user, a database index it does not have): that Redis is there, and another would not be the one meant.
    """
    try:
        client = sync_redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (sync_redis.AuthenticationError, sync_redis.ResponseError) as exc:
        raise ConfigurationError(
            f"the Redis at {redact_text(url)} refused it: {exc}", setting="SMITH_REDIS_URL"
        ) from exc
    except (sync_redis.RedisError, OSError, ValueError):
        return False


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll ``check`` until it returns True; raise :class:`SmithTimeoutError` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SmithTimeoutError(f"{what} not ready after {timeout:g} s", operation=what, budget=timeout)
        time.sleep(interval)


class ManagedProcess:
    """A child process that is always stopped and reaped.

    Output goes to ``log_path`` (or is inherited when None); ``cleanup`` runs after every
    :meth:`stop` (so it must be idempotent). Use as a context manager.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        grace: float = 10.0,
        cleanup: Callable[[], None] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.grace = grace
        self.cleanup = cleanup
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        """Start the process (its own session, so it can be stopped as a group)."""
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115 - closed in stop()
        self._log = log
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT if log else None, start_new_session=True
        )
        return self

    @property
    def pid(self) -> int:
        """The child's process id."""
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has exited (negative: the signal that ended it), else None."""
        return None if self.proc is None else self.proc.poll()

    def signal(self, signum: int) -> None:
        """Send ``signum`` if the process still runs."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signum)

    def stop(self) -> int | None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL the process group; return the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                self._kill_group()
        self._kill_group()  # children the process left behind
        code = self.proc.wait()
        if self._log:
            self._log.close()
        if self.cleanup:
            self.cleanup()
        return code

    def _kill_group(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


#: How many lines of a redis-server log :func:`start_redis_server` quotes when the server exits at start.
STARTUP_LOG_LINES = 10


def start_redis_server(
    port: int | None = None,
    log_path: Path | None = None,
    password: str | None = None,
    *,
    aof_dir: Path | None = None,
    extra_args: Sequence[str] = (),
) -> tuple[ManagedProcess, str]:
    """Start a private ``redis-server`` on 127.0.0.1, diskless unless ``aof_dir`` is given; return it and its URL.

    The server works in a fresh temporary directory of its own (its ``--dir``, where a
    replica's full sync or a SHUTDOWN SAVE would write ``dump.rdb``), removed when the
    process is stopped. Its log (redis's own lines, on its stdout, and anything it prints
    before it can log) goes to ``log_path``, opened here (relative to the caller's cwd),
    else to a file in that directory. With ``password`` the server requires it
    (``requirepass``) and the URL carries it. With ``aof_dir`` (an existing directory,
    the caller's: never removed here) the server works there instead and keeps an
    append-only file (``appendonly yes``, ``appendfsync always``: a write is on disk
    before Redis acknowledges it, so even a SIGKILL loses no acknowledged write); a
    server started again on the same directory loads it (redis.conf, "APPEND ONLY MODE").
    ``extra_args`` are more ``--name value`` options, after these (a cluster node's:
    :func:`start_redis_cluster`).

    Raises :class:`ConfigurationError` when ``redis-server`` is not installed or exits
    before it answers (the message quotes the last :data:`STARTUP_LOG_LINES` lines of
    its log, e.g. ``Address already in use``), and :class:`SmithTimeoutError` when it
    runs but does not answer PING within 10 s; either way nothing is left behind.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise ConfigurationError("redis-server is not installed (apt-get install redis-server)", setting="redis")
    port = port or free_port()
    workdir = str(aof_dir) if aof_dir else tempfile.mkdtemp(prefix="smith-redis-")
    log_file = log_path or Path(workdir, "redis.log")
    log_start = log_file.stat().st_size if log_file.exists() else 0
    persistence = ["--appendonly", "yes", "--appendfsync", "always"] if aof_dir else ["--appendonly", "no"]
    # --logfile "": log to stdout (redis.conf, "logfile"), which ManagedProcess writes to log_file
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *persistence]
    argv += ["--dir", workdir, "--loglevel", "warning", "--logfile", ""]
    if password:
        argv += ["--requirepass", password]
    argv += extra_args
    cleanup = None if aof_dir else lambda: shutil.rmtree(workdir, ignore_errors=True)
    proc = ManagedProcess(argv, log_path=log_file, grace=5.0, cleanup=cleanup).start()
    url = f"redis://{f':{password}@' if password else ''}127.0.0.1:{port}/0"

    def started() -> bool:
        answers = redis_answers(url)  # before the liveness check: another server may hold the port
        if not proc.alive():
            tail = _log_tail(log_file, log_start)  # before stop(): it removes the working directory
            raise ConfigurationError(
                f"redis-server exited at start (exit code {proc.stop()}); its log ends with:\n{tail}", setting="redis"
            )
        return answers

    try:
        wait_until(started, 10.0, "redis-server")
    except BaseException:
        proc.stop()
        raise
    return proc, url


def _log_tail(log_path: Path, start: int) -> str:
    """The last :data:`STARTUP_LOG_LINES` lines written to ``log_path`` after byte ``start``."""
    with open(log_path, "rb") as log:
        log.seek(start)
        lines = log.read().decode(errors="replace").splitlines()
    return "\n".join(lines[-STARTUP_LOG_LINES:]) or "(nothing)"


#: ``cluster-node-timeout`` of :func:`start_redis_cluster`'s nodes, ms: a master unreachable this long is failing,
#: and its replica takes over about one to two timeouts later (redis.io, "Scale with Redis Cluster", Replica election).
CLUSTER_NODE_TIMEOUT_MS = 2000
#: Seconds :func:`start_redis_cluster` waits for the new cluster to agree it is up (every slot served).
CLUSTER_START_TIMEOUT = 30.0
#: Seconds :meth:`RedisClusterRig.kill_master` waits for the killed master's replica to take over.
FAILOVER_TIMEOUT = 30.0
#: Seconds one ``redis-cli --cluster`` command (create, reshard) may run.
CLUSTER_CLI_TIMEOUT = 60.0
#: Keys :meth:`RedisClusterRig.move_slot` moves per ``MIGRATE``, and ms that ``MIGRATE`` may take (well within the
#: 2 s of :meth:`RedisClusterRig.ask`).
MIGRATE_BATCH = 100
MIGRATE_TIMEOUT_MS = 1500
#: Seconds a slot's keys may take to move (a generous ceiling: a test's slot holds a few hundred keys).
MIGRATE_CEILING = 300.0


class RedisClusterRig:
    """A Redis Cluster of private ``redis-server`` processes on 127.0.0.1 (:func:`start_redis_cluster`).

    ``ports`` lists every node's port, in start order (:meth:`masters` says which serve slots now); ``urls`` their
    ``redis://127.0.0.1:PORT/0`` URLs (any one of them is enough for a cluster client to find the rest).
    :meth:`stop` stops every node and removes their working directories; use as a context manager.
    """

    def __init__(self, nodes: dict[int, ManagedProcess]) -> None:
        self.nodes = nodes

    @property
    def ports(self) -> list[int]:
        """Every node's port, in start order."""
        return list(self.nodes)

    @property
    def urls(self) -> list[str]:
        """Every node's URL, in start order."""
        return [f"redis://127.0.0.1:{port}/0" for port in self.nodes]

    def live_ports(self) -> list[int]:
        """The ports of the nodes still running."""
        return [port for port, proc in self.nodes.items() if proc.alive()]

    def ask(self, port: int, *command: str) -> Any:
        """The reply of node ``port`` to ``command`` (strings decoded), within 2 s; redis-py's errors propagate."""
        client = sync_redis.Redis(port=port, socket_timeout=2.0, socket_connect_timeout=2.0, decode_responses=True)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def topology(self, port: int) -> list[ClusterNodeView]:
        """The cluster's nodes as node ``port`` sees them (``CLUSTER NODES``)."""
        return [ClusterNodeView.parse(line) for line in self.ask(port, "CLUSTER", "NODES").splitlines() if line]

    def masters(self) -> list[int]:
        """The ports of the live masters serving slots, as the first live node sees them."""
        live = self.live_ports()
        return [node.port for node in self.topology(live[0]) if node.serving and node.port in live]

    def node_id(self, port: int) -> str:
        """The cluster node id of node ``port`` (``CLUSTER MYID``)."""
        return str(self.ask(port, "CLUSTER", "MYID"))

    def replica_of(self, master_port: int) -> int:
        """The port of a live replica of the master on ``master_port``; :class:`ConfigurationError` if none."""
        master_id = self.node_id(master_port)
        for node in self.topology(master_port):
            if node.master_id == master_id and node.port in self.live_ports():
                return node.port
        raise ConfigurationError(f"the master on port {master_port} has no live replica", setting="redis")

    def healthy(self) -> bool:
        """True when every live node says ``cluster_state:ok`` and every live replica's link to its master is up."""
        try:
            for port in self.live_ports():
                if "cluster_state:ok" not in self.ask(port, "CLUSTER", "INFO"):
                    return False
                info = self.ask(port, "INFO", "replication")
                if info["role"] == "slave" and info.get("master_link_status") != "up":
                    return False
        except (sync_redis.RedisError, OSError):
            return False
        return True

    def kill_master(self, port: int, timeout: float = FAILOVER_TIMEOUT) -> int:
        """SIGKILL the master on ``port`` and wait until its replica has taken over; return the new master's port.

        Raises :class:`SmithTimeoutError` when the replica is not serving the slots, with every live node
        back at ``cluster_state:ok``, within ``timeout`` seconds.
        """
        replica = self.replica_of(port)
        self.nodes[port].signal(signal.SIGKILL)
        wait_until(lambda: not self.nodes[port].alive(), 5.0, f"the SIGKILLed master on port {port}")

        def promoted() -> bool:
            try:
                return self.ask(replica, "ROLE")[0] == "master" and self.healthy()
            except (sync_redis.RedisError, OSError):
                return False

        wait_until(promoted, timeout, f"failover of the master on port {port}", interval=0.2)
        return replica

    def reshard(self, source: int, target: int, slots: int) -> None:
        """Move ``slots`` hash slots from the master on port ``source`` to the master on port ``target``.

        Runs ``redis-cli --cluster reshard`` non-interactively (keys move with their slots, by MIGRATE; clients
        meet ``ASK`` then ``MOVED`` meanwhile: redis.io, "Redis cluster specification", Live resharding) and
        waits for every live node to be back at ``cluster_state:ok``. Raises :class:`ConfigurationError`
        when redis-cli fails (its output quoted), :class:`SmithTimeoutError` when it runs out of time.
        """
        _cluster_cli(
            f"127.0.0.1:{source}",
            "--cluster-from", self.node_id(source),
            "--cluster-to", self.node_id(target),
            "--cluster-slots", str(slots),
            "--cluster-yes",
            command="reshard",
        )  # fmt: skip
        wait_until(self.healthy, CLUSTER_START_TIMEOUT, "the cluster after a reshard", interval=0.2)

    def slot_owner(self, slot: int, seen_from: int | None = None) -> int:
        """The port of the master serving hash ``slot``, as node ``seen_from`` (default: the first live node) sees it.

        Raises :class:`ConfigurationError` when that node knows no master serving it.
        """
        for node in self.topology(seen_from or self.live_ports()[0]):
            if "master" in node.flags and slot in node.slots():
                return node.port
        raise ConfigurationError(f"no master serves hash slot {slot}", setting="redis")

    def move_slot(self, slot: int, target: int) -> None:
        """Move hash ``slot``, keys and all, to the master on port ``target``, while clients may go on using it.

        The procedure of redis.io, "CLUSTER SETSLOT" (Redis cluster live resharding): ``IMPORTING`` on the target,
        ``MIGRATING`` on the source, then ``CLUSTER GETKEYSINSLOT`` and ``MIGRATE … KEYS`` from the source in
        batches of :data:`MIGRATE_BATCH` until no key is left, then ``NODE`` on the target, the source and the
        other masters. Meanwhile the source answers ``ASK`` (or ``TRYAGAIN``) for keys already moved, then ``MOVED``.
        The rig's nodes have no password, so ``MIGRATE`` takes no ``AUTH``. Returns once every live node sees
        ``target`` serving the slot and the cluster is ok; raises redis-py's errors, and
        :class:`SmithTimeoutError` when the nodes do not agree within :data:`CLUSTER_START_TIMEOUT` seconds.
        """
        source = self.slot_owner(slot)
        if source == target:
            return
        number, source_id, target_id = str(slot), self.node_id(source), self.node_id(target)
        self.ask(target, "CLUSTER", "SETSLOT", number, "IMPORTING", source_id)
        self.ask(source, "CLUSTER", "SETSLOT", number, "MIGRATING", target_id)
        self._migrate_keys(slot, source, target)
        others = [port for port in self.masters() if port not in (source, target)]
        for port in (target, source, *others):
            self.ask(port, "CLUSTER", "SETSLOT", number, "NODE", target_id)

        def moved() -> bool:
            try:
                return all(self.slot_owner(slot, port) == target for port in self.live_ports()) and self.healthy()
            except (sync_redis.RedisError, OSError, ConfigurationError):
                return False

        wait_until(moved, CLUSTER_START_TIMEOUT, f"hash slot {slot} on the master on port {target}", interval=0.1)

    def _migrate_keys(self, slot: int, source: int, target: int) -> None:
        """``MIGRATE`` the keys of ``slot`` from node ``source`` to ``target`` in batches until none is left; raises
        :class:`SmithTimeoutError` saying how far it got past :data:`MIGRATE_CEILING` seconds."""
        number, started, batches, moved = str(slot), time.monotonic(), 0, 0
        while keys := self.ask(source, "CLUSTER", "GETKEYSINSLOT", number, str(MIGRATE_BATCH)):
            if time.monotonic() - started > MIGRATE_CEILING:
                left = self.ask(source, "CLUSTER", "COUNTKEYSINSLOT", number)
                raise SmithTimeoutError(
                    f"hash slot {slot}: {left} keys still on port {source} after {batches} MIGRATE batches "
                    f"({moved} keys moved) in {time.monotonic() - started:.0f} s; keys still listed: {keys[:5]}",
                    operation="MIGRATE",
                    budget=MIGRATE_CEILING,
                )
            timeout = str(MIGRATE_TIMEOUT_MS)
            reply = self.ask(source, "MIGRATE", "127.0.0.1", str(target), "", "0", timeout, "KEYS", *keys)
            batches, moved = batches + 1, moved + (len(keys) if reply == "OK" else 0)

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL) and remove its working directory."""
        for proc in self.nodes.values():
            proc.stop()

    def __enter__(self) -> RedisClusterRig:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class ClusterNodeView(NamedTuple):
    """One line of ``CLUSTER NODES`` (redis.io, "CLUSTER NODES"): a node's id, port, flags, master and slots."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slot_ranges: tuple[str, ...]

    @classmethod
    def parse(cls, line: str) -> ClusterNodeView:
        """``<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot> ...`` → a view."""
        fields = line.split()
        address = fields[1].split("@")[0]
        master = None if fields[3] == "-" else fields[3]
        return cls(
            fields[0], int(address.rpartition(":")[2]), frozenset(fields[2].split(",")), master, tuple(fields[8:])
        )

    def slots(self) -> set[int]:
        """The hash slots this node serves (its ranges, not the ``[slot->-id]`` / ``[slot-<-id]`` of a migration)."""
        served: set[int] = set()
        for part in self.slot_ranges:
            if not part.startswith("["):
                first, _, last = part.partition("-")
                served.update(range(int(first), int(last or first) + 1))
        return served

    @property
    def serving(self) -> bool:
        """True for a master that is not failing and serves at least one slot."""
        return "master" in self.flags and "fail" not in self.flags and bool(self.slot_ranges)


def start_redis_cluster(masters: int = 3, log_dir: Path | None = None) -> RedisClusterRig:
    """Start a Redis Cluster of ``masters`` masters, each with one replica, on 127.0.0.1; return it once it is up.

    Each node is a :func:`start_redis_server` (diskless, its own temporary ``--dir``, a free port) with
    ``cluster-enabled yes``, its ``nodes.conf`` in that directory, a free cluster bus port and a
    ``cluster-node-timeout`` of :data:`CLUSTER_NODE_TIMEOUT_MS`; ``redis-cli --cluster create …
    --cluster-replicas 1 --cluster-yes`` then assigns the 16384 slots evenly to the masters. Returns when
    every node says ``cluster_state:ok`` and every replica is linked to its master. Each node logs to
    ``log_dir/redis-cluster-PORT.log`` when ``log_dir`` is given (else into its directory).

    redis-cli refuses fewer than 3 masters, so 1 or 2 are joined by hand (:func:`_join_small_cluster`), for
    benchmarks: such a cluster cannot fail over, a replica's promotion needing the votes of a majority of the
    masters (redis.io, "Redis cluster specification", Replica election and promotion).

    Raises :class:`ConfigurationError` when ``masters`` < 1, when a node exits at start or when redis-cli
    fails, and :class:`SmithTimeoutError` when the cluster is not up within :data:`CLUSTER_START_TIMEOUT`
    seconds; either way every node started is stopped.
    """
    if masters < 1:
        raise ConfigurationError(f"a Redis Cluster needs at least 1 master, got {masters}", setting="redis")
    options = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
    options += ["--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS)]
    rig = RedisClusterRig({})
    buses: dict[int, int] = {}
    try:
        for _ in range(2 * masters):
            port, buses[port] = free_port(), free_port()  # the bus port: else PORT + 10000, maybe taken or past 65535
            log = log_dir / f"redis-cluster-{port}.log" if log_dir else None
            rig.nodes[port] = start_redis_server(port, log, extra_args=[*options, "--cluster-port", str(buses[port])])[
                0
            ]
        if masters < 3:
            _join_small_cluster(rig, masters, buses)
        else:
            addresses = [f"127.0.0.1:{port}" for port in rig.ports]
            _cluster_cli(*addresses, "--cluster-replicas", "1", "--cluster-yes", command="create")
        wait_until(rig.healthy, CLUSTER_START_TIMEOUT, "Redis Cluster", interval=0.2)
    except BaseException:
        rig.stop()
        raise
    return rig


def _join_small_cluster(rig: RedisClusterRig, masters: int, buses: dict[int, int]) -> None:
    """Make the rig's first ``masters`` nodes masters sharing the 16384 slots evenly, the others their replicas.

    What ``redis-cli --cluster create`` does, by hand (redis.io, "CLUSTER ADDSLOTSRANGE", "CLUSTER MEET",
    "CLUSTER REPLICATE"; Redis 7.0 for the first and for MEET's bus port, ``buses``: node port → bus port):
    each master takes its slot range, the first node meets every other, and once every node knows all of them
    (gossip) each replica follows its master. Raises redis-py's errors, and :class:`SmithTimeoutError` when the
    nodes do not all know each other within :data:`CLUSTER_START_TIMEOUT` seconds.
    """
    ports = rig.ports
    for index, port in enumerate(ports[:masters]):
        first, end = index * 16384 // masters, (index + 1) * 16384 // masters
        rig.ask(port, "CLUSTER", "ADDSLOTSRANGE", str(first), str(end - 1))
    for port in ports[1:]:
        rig.ask(ports[0], "CLUSTER", "MEET", "127.0.0.1", str(port), str(buses[port]))

    def met() -> bool:
        known = [[node for node in rig.topology(port) if "handshake" not in node.flags] for port in ports]
        return all(len(nodes) == len(ports) for nodes in known)

    wait_until(met, CLUSTER_START_TIMEOUT, "Redis Cluster nodes meeting", interval=0.1)
    for replica, master in zip(ports[masters:], ports[:masters], strict=True):
        rig.ask(replica, "CLUSTER", "REPLICATE", rig.node_id(master))


def _cluster_cli(*args: str, command: str) -> None:
    """Run ``redis-cli --cluster COMMAND ARGS``; raise :class:`ConfigurationError` quoting its output if it fails."""
    binary = shutil.which("redis-cli")
    if binary is None:
        raise ConfigurationError("redis-cli is not installed (apt-get install redis-tools)", setting="redis")
    try:
        done = subprocess.run(
            [binary, "--cluster", command, *args], capture_output=True, timeout=CLUSTER_CLI_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise SmithTimeoutError(
            f"redis-cli --cluster {command} still running after {CLUSTER_CLI_TIMEOUT:g} s",
            operation=f"redis-cli --cluster {command}",
            budget=CLUSTER_CLI_TIMEOUT,
        ) from exc
    if done.returncode != 0:
        tail = "\n".join(done.stdout.decode(errors="replace").splitlines()[-STARTUP_LOG_LINES:])
        raise ConfigurationError(
            f"redis-cli --cluster {command} failed (exit code {done.returncode}):\n{tail}", setting="redis"
        )


def worker_argv(app: str, queue: str) -> list[str]:
    """The command line of a worker process for ``app`` on ``queue`` (same interpreter)."""
    return [sys.executable, "-m", "smith_worker", app, "--queue", queue]
