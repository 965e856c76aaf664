"""``smith-worker MODULE:APP --queue turns|tools`` runs an arq worker; ``smith-worker --check [--ready]
--queue Q`` is the liveness (readiness) probe (:mod:`smith_worker.health`). Both read every ``SMITH_*``
variable first (:class:`~smith_worker.config.Settings`): a bad one is one line on stderr and exit code 1.

The client commands (``smith ask|chat|keys|status``) are :mod:`smith_client.cli`, so they work with the
base install.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import importlib.metadata
import logging
import os
import re
import sys
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from smith_client import SmithError
from smith_client.cli import fail

if TYPE_CHECKING:  # imported when used: on a base install the worker's modules cannot load
    from smith_worker.app import SmithApp

#: The distribution and its extra that ``smith-worker`` needs (pyproject.toml).
DISTRIBUTION, WORKER_EXTRA = "agent-smith", "worker"


def load_app(spec: str) -> SmithApp:
    """Import ``package.module:attribute`` and return the :class:`SmithApp` there.

    Raises ``SystemExit`` with a clear message when it cannot.
    """
    from smith_worker.app import SmithApp

    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"smith-worker: cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr or "app", None)
    if not isinstance(app, SmithApp):
        raise SystemExit(f"smith-worker: {spec!r} is not a SmithApp")
    return app


def missing_worker_libraries() -> list[str]:
    """The distributions of the ``worker`` extra that are not installed (``[]`` when all are, or when
    this code does not run from an installed ``agent-smith``: then there is no declared extra to check)."""
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    extra = re.compile(rf"""extra\s*==\s*["']{WORKER_EXTRA}["']""")
    missing = []
    for requirement in requirements:  # PEP 508: the project name leads, the marker follows ";"
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        if name is None or not extra.search(requirement.partition(";")[2]):
            continue
        project = name.group()
        try:
            importlib.metadata.distribution(project)
        except importlib.metadata.PackageNotFoundError:
            missing.append(project)
    return missing


def worker_main(argv: list[str] | None = None) -> None:
    """Entry point of ``smith-worker``: a configuration or Redis error is one line on stderr and exit code 1,
    and so is a base install (no ``worker`` extra), before any of the worker's modules is imported."""
    missing = missing_worker_libraries()
    if missing:
        raise SystemExit(
            f"smith-worker: the worker needs the {WORKER_EXTRA!r} extra (missing: {', '.join(missing)}): "
            f"pip install '{DISTRIBUTION}[{WORKER_EXTRA}]'"
        )
    try:
        _worker_main(argv)
    except (SmithError, RedisError) as exc:
        raise SystemExit(fail("smith-worker", exc)) from None


def _worker_main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="smith-worker", description="Run an Agent Smith worker.")
    parser.add_argument("app", nargs="?", help="the app to serve, as package.module:attribute")
    parser.add_argument("--queue", choices=["turns", "tools"])
    parser.add_argument(
        "--log-level", type=_log_level, help="DEBUG, INFO, WARNING, ... (default SMITH_LOG_LEVEL, INFO)"
    )
    parser.add_argument(
        "--log-jobs",
        action="store_true",
        default=None,
        help="log every job's start and end and every model request at INFO too (SMITH_LOG_JOBS=1); "
        "otherwise only at --log-level DEBUG",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="liveness probe: exit 0 when this host's worker on --queue touched its heartbeat "
        "file (SMITH_HEARTBEAT_FILE) in the last 15 s; Redis is not asked. Needs --queue or "
        "SMITH_HEARTBEAT_FILE",
    )
    parser.add_argument("--ready", action="store_true", help="with --check: also require Redis to answer PING")
    args = parser.parse_args(argv)
    from smith_worker.config import Settings  # imported late: keeps `smith-worker --help` light

    settings = Settings.from_env()  # every SMITH_* variable, checked before anything starts
    if args.check:
        from smith_worker.health import run_check

        raise SystemExit(run_check(settings, args.queue, args.ready))
    if not args.app or not args.queue:
        parser.error("the app and --queue are required to run a worker")
    if len(settings.each_shard()) > 1:
        from smith_worker.shard_processes import ShardProcesses

        configure_logging(args.log_level or settings.log_level)
        raise SystemExit(ShardProcesses(settings.each_shard()).run())
    configure_logging(args.log_level or settings.log_level, log_jobs=args.log_jobs or settings.log_jobs)
    from smith_worker.ops.open_files import raise_open_files_limit
    from smith_worker.queue.worker import build_worker

    raise_open_files_limit()  # a socket per model request in flight (SMITH_TURN_MAX_JOBS, SMITH_LLM_MAX_CONNECTIONS)
    worker = build_worker(load_app(args.app), args.queue)
    worker.run()
    runtime = worker.ctx["runtime"]
    runtime.check_id_kept()
    if runtime.restart_requested and not worker.terminated:
        restart_process()
    exit_past_overrunning_threads(runtime.role.threads_left())


def _log_level(value: str) -> str:
    """``--log-level``'s value as a level name (:func:`~smith_worker.config.log_level_name`); argparse's
    one-line usage error otherwise."""
    from smith_worker.config import LOG_LEVELS, log_level_name

    try:
        return log_level_name(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {LOG_LEVELS}, got {value!r}") from None


#: INFO records written for every job (arq: its start and its end) and every HTTP request (httpx,
#: httpx2 under MCP): formatting, redacting and writing them cost a busy worker a few % of its CPU.
PER_JOB_LINES = {"arq.worker": frozenset({"%6.2fs → %s(%s)%s", "%6.2fs ← %s ● %s"})}
PER_REQUEST_LOGGERS = ("httpx", "httpx2")


class _DropLines(logging.Filter):
    """Drops the records whose format string is one of ``formats``; passes every other record."""

    def __init__(self, formats: frozenset[str]) -> None:
        super().__init__()
        self.formats = formats

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in self.formats


def configure_logging(level: str, *, log_jobs: bool = False) -> None:
    """The worker program's logging: the root at ``level`` (a name, any case) with one stderr handler.

    Above DEBUG, and unless ``log_jobs``, the per-job and per-request INFO lines (:data:`PER_JOB_LINES`,
    :data:`PER_REQUEST_LOGGERS`) are left out; arq's other INFO lines (start-up, retries, aborts) stay.
    Raises ``ValueError`` for an unknown level name.
    """
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if log_jobs or logging.getLogger().isEnabledFor(logging.DEBUG):
        return
    for name, formats in PER_JOB_LINES.items():
        logging.getLogger(name).addFilter(_DropLines(formats))
    for name in PER_REQUEST_LOGGERS:  # their only INFO line is the per-request one
        logging.getLogger(name).setLevel(logging.WARNING)


def exit_past_overrunning_threads(overrunning: int) -> None:
    """End the process now (code 0) when ``overrunning`` sync-tool threads still run after the graceful stop.

    The interpreter joins a ThreadPoolExecutor's threads at exit, so one tool sleeping past its
    timeout would keep a stopped worker alive until SIGKILL. The exit handlers (log flushing,
    coverage) still run; only the join of those threads is skipped.
    """
    if overrunning <= 0:
        return
    logging.getLogger("agent_smith.worker").warning(
        "exiting with %d overrunning sync-tool threads still running (abandoned)", overrunning
    )
    atexit._run_exitfuncs()  # what a normal exit runs after joining threads: logging.shutdown, coverage
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def restart_process() -> None:
    """Replace this process with a fresh run of the same command (same pid, so supervisors see no exit).

    Used by a tool worker that drained because sync-tool threads overran
    their timeouts: exec is the only way to get rid of threads Python cannot stop.
    """
    logging.getLogger("agent_smith.worker").warning("re-executing %s", " ".join(sys.orig_argv))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
