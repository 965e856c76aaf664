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
    port: int | None = None, log_path: Path | None = None, password: str | None = None, *, aof_dir: Path | None = None
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


def worker_argv(app: str, queue: str) -> list[str]:
    """The command line of a worker process for ``app`` on ``queue`` (same interpreter)."""
    return [sys.executable, "-m", "smith_worker", app, "--queue", queue]
