"""Process-local liveness and Redis readiness of a worker (``smith-worker --check [--ready]``).

Liveness must not depend on Redis: when the broker blips, a probe that asks
Redis fails every pod at once (Celery's ``inspect ping`` crash-loops fleets;
arq's ``--check`` key is shared per queue and deleted when any worker
closes). So each worker touches a
heartbeat file from its event loop every :data:`HEARTBEAT_INTERVAL` seconds,
and the check passes while the file is younger than :data:`HEARTBEAT_MAX_AGE`:
a frozen or blocked event loop fails it, a Redis outage does not.
Readiness (``--ready``) additionally needs Redis to answer PING.

The file is ``SMITH_HEARTBEAT_FILE`` when set (set it in a pod so the probe
and the worker agree on one path), else
``<temp dir>/smith-<prefix>-<queue>-<pid>.heartbeat``; a check without the
variable looks at the files of that prefix and queue whose process still
runs, and passes when one of them is fresh. A check needs to know whose
heartbeat it judges: ``--queue`` or ``SMITH_HEARTBEAT_FILE``, else it is a
:class:`ConfigurationError` (a probe that passed on any queue's worker would keep a
pod whose own worker hung alive).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from pathlib import Path

from smith_client.errors import ConfigurationError
from smith_worker.config import Settings

logger = logging.getLogger("agent_smith.worker")

#: Seconds between touches of the heartbeat file.
HEARTBEAT_INTERVAL = 5.0
#: A heartbeat older than this (seconds) fails the liveness check: three missed touches.
HEARTBEAT_MAX_AGE = 15.0
#: Seconds ``--ready`` waits for Redis to answer PING.
READY_TIMEOUT = 3.0


def heartbeat_path(settings: Settings, queue: str, pid: int | None = None) -> Path:
    """The heartbeat file of the worker ``pid`` (default: this process) on ``queue``."""
    if settings.heartbeat_file:
        return Path(settings.heartbeat_file)
    return Path(tempfile.gettempdir()) / f"smith-{settings.keys().prefix}-{queue}-{pid or os.getpid()}.heartbeat"


async def heartbeat_forever(path: Path, interval: float = HEARTBEAT_INTERVAL) -> None:
    """Touch ``path`` every ``interval`` seconds, from the event loop, until cancelled."""
    while True:
        try:
            # on the event loop on purpose: a fresh file proves the loop runs (a local touch is microseconds)
            path.touch()  # noqa: ASYNC240
        except OSError:  # a full or read-only disk: the probe will say so; keep serving
            logger.warning("heartbeat file %s could not be touched", path, exc_info=True)
        await asyncio.sleep(interval)


def remove_heartbeat(path: Path) -> None:
    """Delete the heartbeat file at shutdown (a stopped worker is not alive)."""
    with contextlib.suppress(OSError):
        path.unlink()


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def candidate_files(settings: Settings, queue: str | None) -> list[Path]:
    """The heartbeat files a check looks at: the configured one, or those of ``queue``'s running workers.

    Raises :class:`ConfigurationError` with neither ``SMITH_HEARTBEAT_FILE`` nor ``queue``.
    """
    if settings.heartbeat_file:
        return [Path(settings.heartbeat_file)]
    if not queue:
        raise ConfigurationError(
            "--check needs --queue turns|tools (or SMITH_HEARTBEAT_FILE): whose heartbeat?", setting="--queue"
        )
    return live_heartbeats(settings, queue)


def live_heartbeats(settings: Settings, queue: str) -> list[Path]:
    """The default-named heartbeat files of ``queue``'s workers whose process runs; those of processes that
    are gone (a worker killed with SIGKILL never removes its own) are deleted on the way."""
    pattern = f"smith-{settings.keys().prefix}-{queue}-*.heartbeat"
    files = []
    for path in Path(tempfile.gettempdir()).glob(pattern):
        pid = path.stem.rsplit("-", 1)[-1]
        if pid.isdigit() and _pid_runs(int(pid)):
            files.append(path)
        else:
            remove_heartbeat(path)
    return files


def check_alive(settings: Settings, queue: str | None, max_age: float = HEARTBEAT_MAX_AGE) -> tuple[bool, str]:
    """(passes, why): True when a heartbeat file of ``queue`` is younger than ``max_age`` seconds."""
    files = candidate_files(settings, queue)
    if not files:
        return False, "no heartbeat file of a running worker (is SMITH_HEARTBEAT_FILE the same for worker and probe?)"
    ages = []
    for path in files:
        with contextlib.suppress(OSError):
            ages.append((time.time() - path.stat().st_mtime, path))
    fresh = [(age, path) for age, path in ages if age < max_age]
    if fresh:
        age, path = min(fresh)
        return True, f"alive: {path} touched {age:.1f} s ago"
    return False, f"no heartbeat younger than {max_age:g} s in {[str(p) for p in files]}"


async def check_ready(settings: Settings, timeout: float = READY_TIMEOUT) -> tuple[bool, str]:
    """(passes, why): True when Redis answers PING within ``timeout`` seconds."""
    redis = settings.connect_redis()
    try:
        async with asyncio.timeout(timeout):
            await redis.ping()
        return True, "redis answers"
    except Exception as exc:  # any failure to answer means not ready
        return False, f"redis does not answer: {exc!r}"
    finally:
        with contextlib.suppress(Exception):
            await redis.aclose(close_connection_pool=True)


def run_check(settings: Settings, queue: str | None, ready: bool) -> int:
    """The exit code of ``smith-worker --check [--ready]``: 0 passes, 1 fails (the reasons go to stdout). Serving every
    shard (``SMITH_SHARDS`` > 1, no ``SMITH_SHARD``), it passes when each shard's worker does."""
    passed = True
    for shard in settings.each_shard():
        ok, why = check_alive(shard, queue)
        if ok and ready:
            ok, redis_why = asyncio.run(check_ready(shard))
            why = f"{why}; {redis_why}"
        print(why)
        passed = passed and ok
    return 0 if passed else 1
