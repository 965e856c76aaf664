"""Command-line entry points.

* ``smith-worker MODULE:APP --queue turns|tools`` runs an arq worker.
* ``smith ask "question"`` runs one turn; ``smith chat`` is a REPL. Tokens go
  to stdout as they arrive; one status line per tool call and result goes to
  stderr (seed §19).
* ``smith --conversation ID keys`` lists that conversation's Redis keys and TTLs.
* ``smith status`` prints queue lengths, running turns and live workers per queue.
* ``smith-worker --check [--ready] --queue Q`` is the liveness (readiness) probe (:mod:`smith_worker.health`).
* Both read ``SMITH_REDIS_URL``, ``SMITH_PREFIX`` and the Sentinel variables.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import importlib
import logging
import os
import sys
from typing import Any, TextIO

import orjson
from redis.exceptions import RedisError

from smith_client import SmithClient, SmithError
from smith_client.errors import error_from_redis
from smith_client.hygiene import conversation_keys
from smith_client.registry import fleet_status
from smith_client.events import TOKEN, TOOL_CALL_COMPLETED, TOOL_RESULT, TURN_COMPLETED, TURN_FAILED, Event
from smith_worker.app import SmithApp
from smith_worker.repl import ChatRepl, run_turn


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


def fail(prog: str, exc: BaseException) -> int:
    """Print a typed error as one ``PROG: Kind: message`` line on stderr (no traceback); returns exit code 1.

    A Redis failure (``RedisError``) is printed as the :class:`TransportError` it means.
    """
    error = exc if isinstance(exc, SmithError) else error_from_redis(exc)
    print(f"{prog}: {error.kind}: {error.message}", file=sys.stderr)
    return 1


def worker_main(argv: list[str] | None = None) -> None:
    """Entry point of ``smith-worker``: a configuration or Redis error is one line on stderr and exit code 1."""
    try:
        _worker_main(argv)
    except (SmithError, RedisError) as exc:
        raise SystemExit(fail("smith-worker", exc)) from None


def _worker_main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="smith-worker", description="Run an Agent Smith worker.")
    parser.add_argument("app", nargs="?", help="the app to serve, as package.module:attribute")
    parser.add_argument("--queue", choices=["turns", "tools"])
    parser.add_argument("--log-level", default=os.environ.get("SMITH_LOG_LEVEL", "INFO"))
    parser.add_argument("--check", action="store_true",
                        help="liveness probe: exit 0 when this host's worker on --queue touched its heartbeat "
                             "file (SMITH_HEARTBEAT_FILE) in the last 15 s; Redis is not asked. Needs --queue or "
                             "SMITH_HEARTBEAT_FILE")
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
    runtime = worker.ctx["runtime"]
    if runtime.restart_requested and not worker.terminated:
        restart_process()
    exit_past_overrunning_threads(runtime.executors.overrunning if runtime.executors else 0)


def exit_past_overrunning_threads(overrunning: int) -> None:
    """End the process now (code 0) when ``overrunning`` sync-tool threads still run after the graceful stop.

    The interpreter joins a ThreadPoolExecutor's threads at exit, so one tool sleeping past its
    timeout would keep a stopped worker alive until SIGKILL. The exit handlers (log flushing,
    coverage) still run; only the join of those threads is skipped.
    """
    if overrunning <= 0:
        return
    logging.getLogger("agent_smith.worker").warning(
        "exiting with %d overrunning sync-tool threads still running (abandoned)", overrunning)
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


class StreamPrinter:
    """Prints a turn's events: tokens to ``out``, tool status lines to ``err``.

    An agent that does not stream publishes no ``token`` events, so its answer
    is printed from the final message of ``turn.completed``.
    """

    def __init__(self, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.out = out
        self.err = err
        self._streamed: set[str] = set()  # turns whose answer arrived as tokens

    def __call__(self, event: Event) -> None:
        data = event.data
        if event.type == TOKEN:
            self._streamed.add(event.turn_id)
            self.out.write(data["text"])
            self.out.flush()
        elif event.type == TOOL_CALL_COMPLETED:
            self._status(f"[tool call] {data['name']}({_compact(data['arguments'])})")
        elif event.type == TOOL_RESULT:
            label = "error" if data["is_error"] else "result"
            self._status(f"[tool {label}] {data['name']} -> {_short(data['content'])} (worker {data['worker']})")
        elif event.type == TURN_COMPLETED:
            if event.turn_id not in self._streamed:
                self.out.write(event.final_message().content or "")
            self._streamed.discard(event.turn_id)
            self.out.write("\n")
            self.out.flush()
        elif event.type == TURN_FAILED:
            self._status(f"[turn failed] {data['error']['kind']}: {data['error']['message']}")

    def _status(self, line: str) -> None:
        self.err.write(line + "\n")
        self.err.flush()


def _compact(value: Any) -> str:
    return orjson.dumps(value).decode()


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


async def _run_ask(args: argparse.Namespace) -> int:
    async with _connect(args) as client:
        ok = await run_turn(client, args.question, conversation_id=args.conversation, agent=args.agent,
                            timeout=args.timeout, printer=StreamPrinter())
        return 0 if ok else 1


async def _run_chat(args: argparse.Namespace) -> int:
    async with _connect(args) as client:
        repl = ChatRepl(client, StreamPrinter(), agent=args.agent, conversation_id=args.conversation,
                        timeout=args.timeout)
        return await repl.run()


def _connect(args: argparse.Namespace) -> SmithClient:
    return SmithClient.from_url(args.redis_url, prefix=args.prefix, sentinels=os.environ.get("SMITH_REDIS_SENTINELS"),
                                sentinel_master=os.environ.get("SMITH_REDIS_SENTINEL_MASTER"))


async def _run_status(args: argparse.Namespace) -> int:
    async with _connect(args) as client:
        status = await fleet_status(client.redis, client.keys)
    print(f"{'queue':<24} {'length':>7} {'workers':>8}")
    for name, queue in status.queues.items():
        print(f"{name:<24} {queue.length:>7} {len(queue.workers):>8}")
    print(f"running turns: {status.running_turns}")
    for name, queue in status.queues.items():
        for worker in queue.workers:
            print(f"worker {worker['id']} on {name} (host {worker.get('host')}, pid {worker.get('pid')})")
    return 0


async def _run_keys(args: argparse.Namespace) -> int:
    async with _connect(args) as client:
        for info in await conversation_keys(client.redis, client.keys, args.conversation):
            print(f"{info.ttl:>9}  {info.type:<7} {info.key}")
    return 0


def smith_main(argv: list[str] | None = None) -> None:
    """Entry point of ``smith``: ``smith ask "question"``, ``smith chat``, ``smith keys --conversation ID``,
    ``smith status``."""
    parser = argparse.ArgumentParser(prog="smith", description="Talk to Agent Smith agents.")
    parser.add_argument("--redis-url", default=os.environ.get("SMITH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--prefix", default=os.environ.get("SMITH_PREFIX", "smith"))
    parser.add_argument("--agent", default="default")
    parser.add_argument("--conversation", default=f"cli-{os.getpid()}")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait for a turn")
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="run one turn and print it")
    ask.add_argument("question")
    sub.add_parser("chat", help="an interactive conversation (/reset, /exit, Ctrl-D; Ctrl-C cancels a turn)")
    sub.add_parser("keys", help="list the conversation's Redis keys and their TTLs (seconds)")
    sub.add_parser("status", help="queue lengths, running turns and live workers per queue")
    args = parser.parse_args(argv)
    commands = {"ask": _run_ask, "chat": _run_chat, "keys": _run_keys, "status": _run_status}
    try:
        code = asyncio.run(commands[args.command](args))
    except (SmithError, RedisError) as exc:  # status and keys read Redis directly: its errors too
        code = fail("smith", exc)
    except KeyboardInterrupt:
        code = 130
    raise SystemExit(code)
