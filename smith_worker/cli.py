"""``smith-worker MODULE:APP --queue turns|tools`` runs an arq worker; ``smith-worker --check [--ready]
--queue Q`` is the liveness (readiness) probe (:mod:`smith_worker.health`). It reads ``SMITH_REDIS_URL``,
``SMITH_PREFIX`` and the Sentinel variables.

The client commands (``smith ask|chat|keys|status``) are :mod:`smith_client.cli`, so they work with the
base install.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from smith_worker.app import SmithApp


def load_app(spec: str) -> SmithApp:
    """Import ``package.module:attribute`` and return the :class:`SmithApp` there.

    Raises ``SystemExit`` with a clear message when it cannot.
    """
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"smith-worker: cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr or "app", None)
    if not isinstance(app, SmithApp):
        raise SystemExit(f"smith-worker: {spec!r} is not a SmithApp")
    return app


def worker_main(argv: list[str] | None = None) -> None:
    """Entry point of ``smith-worker``."""
    parser = argparse.ArgumentParser(prog="smith-worker", description="Run an Agent Smith worker.")
    parser.add_argument("app", nargs="?", help="the app to serve, as package.module:attribute")
    parser.add_argument("--queue", choices=["turns", "tools"])
    parser.add_argument("--log-level", default=os.environ.get("SMITH_LOG_LEVEL", "INFO"))
    parser.add_argument(
        "--check",
        action="store_true",
        help="liveness probe: exit 0 when this host's worker on --queue touched its heartbeat "
        "file (SMITH_HEARTBEAT_FILE) in the last 15 s; Redis is not asked",
    )
    parser.add_argument("--ready", action="store_true", help="with --check: also require Redis to answer PING")
    args = parser.parse_args(argv)
    if args.check:
        from smith_worker.config import Settings
        from smith_worker.health import run_check

        raise SystemExit(run_check(Settings.from_env(), args.queue, args.ready))
    if not args.app or not args.queue:
        parser.error("the app and --queue are required to run a worker")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from smith_worker.worker import build_worker  # imported late: keeps `smith --help` light

    worker = build_worker(load_app(args.app), args.queue)
    worker.run()
    if worker.ctx["runtime"].restart_requested:
        restart_process()


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
