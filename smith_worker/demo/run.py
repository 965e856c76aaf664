"""``make demo``: one real streamed turn through every part, then everything stopped.

1. Redis: ``SMITH_REDIS_URL`` if it answers, else a private ``redis-server`` on a free port.
2. The model: ``SMITH_LLM_BASE_URL`` if set, else the local model server (SmolLM2-135M on
   xllamacpp, used with ``json_schema`` tool calling and temperature 0).
3. One turn worker and one tool worker for :mod:`smith_worker.demo`.
4. ``smith ask``-style turn: tokens to stdout, tool status lines to stderr.

Exits 0 when the turn completed, a calculator call ran on the tool worker and
the answer streamed at least one token; 1 otherwise. Logs of the child
processes go to ``.demo-logs/``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from smith_client import SmithClient
from smith_client.cli import StreamPrinter, fail
from smith_client.errors import SmithError
from smith_client.events import TokenData, ToolResultData, TurnCompletedData
from smith_client.registry import live_agents
from smith_worker.config import Settings
from smith_worker.local.llm_server import LocalModelServer
from smith_worker.local.processes import ManagedProcess, redis_answers, start_redis_server, wait_until, worker_argv
from smith_worker.ops.redaction import redact_text

DEFAULT_QUESTION = "What is 17*23?"


def _status(line: str) -> None:
    print(f"[demo] {line}", file=sys.stderr, flush=True)


async def _turn(redis_url: str, prefix: str, question: str) -> bool:
    printer = StreamPrinter()
    tokens = tool_on_worker = completed = False
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        async for event in client.stream(question, conversation_id=f"demo-{uuid.uuid4().hex[:8]}", timeout=300):
            printer(event)
            data = event.payload
            tokens |= isinstance(data, TokenData) and bool(data.text)
            tool_on_worker |= isinstance(data, ToolResultData) and bool(data.worker) and not data.is_error
            completed |= isinstance(data, TurnCompletedData)
    _status(f"turn completed={completed} tool_ran_on_worker={tool_on_worker} streamed_tokens={tokens}")
    return completed and tool_on_worker and tokens


async def _delete_keys(redis_url: str, prefix: str) -> None:
    """Remove this run's keys (its prefix is unique), arq's job keys of it included, from a Redis the demo
    did not start."""
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        for pattern in client.keys.key_patterns:
            keys = [key async for key in client.redis.scan_iter(match=pattern, count=500)]
            if keys:
                await client.redis.delete(*keys)


async def _agents_ready(redis_url: str, prefix: str) -> bool:
    client = SmithClient.from_url(redis_url, prefix=prefix)
    async with client:
        return "default" in (await live_agents(client.redis, client.keys) or set())


def smith_hint(redis_url: str, prefix: str, cluster: bool = False) -> str:
    """A ``smith status`` command line for another terminal, talking to ``redis_url`` under ``prefix`` (with
    ``cluster``, a Redis Cluster node: ``SMITH_REDIS_CLUSTER=1`` leads the line).

    ``smith`` reads them from ``SMITH_REDIS_URL``, ``SMITH_PREFIX`` and ``SMITH_REDIS_CLUSTER``
    (:func:`smith_client.cli.smith_main`);
    the URL's credentials are shown redacted. The ``smith`` beside this interpreter is named
    (relative to the cwd when under it: ``.venv/bin/smith`` for ``make demo``), else ``smith``.
    """
    smith = Path(sys.executable).parent / "smith"
    command = "smith"
    if smith.exists():
        command = os.path.relpath(smith) if smith.is_relative_to(Path.cwd()) else str(smith)
    variables = ["SMITH_REDIS_CLUSTER=1"] if cluster else []
    variables += [f"SMITH_REDIS_URL={redact_text(redis_url)}", f"SMITH_PREFIX={prefix}"]
    return shlex.join([*variables, command, "status"])


#: A started child process and its log file.
Child = tuple[ManagedProcess, Path]


class Services(NamedTuple):
    """What :func:`start_services` started: the Redis URL and key prefix its workers use, and its child
    processes by name (``"redis-server"``, ``"local model"``, ``"turn worker"``, ``"tool worker"``; a
    borrowed Redis or model is not one of them) with their log files."""

    redis_url: str
    prefix: str
    children: dict[str, Child]


def start_services(stack: contextlib.ExitStack, logs: Path, status: Callable[[str], None] = _status) -> Services:
    """Redis, the model (unless ``SMITH_LLM_BASE_URL``) and a turn and a tool worker.

    Everything started is stopped when ``stack`` closes; this run's keys are
    removed from a borrowed Redis. ``status`` prints progress lines, the Redis URL
    and key prefix among them (with :func:`smith_hint`). Raises ``ConfigurationError``
    / ``SmithTimeoutError``.
    """
    settings = Settings.from_env()  # a bad SMITH_* value fails here, in one line, not in the workers' logs
    logs.mkdir(exist_ok=True)
    prefix = f"smith-demo-{uuid.uuid4().hex[:6]}"  # never touches a developer's own keys
    redis_url = os.environ.get("SMITH_REDIS_URL", "redis://127.0.0.1:6379/0")
    children: dict[str, Child] = {}
    if redis_answers(redis_url):
        stack.callback(lambda: asyncio.run(_delete_keys(redis_url, prefix)))
    else:
        status(f"no Redis at {redact_text(redis_url)}; starting a private redis-server")
        redis_proc, redis_url = start_redis_server(log_path=logs / "redis.log")
        stack.callback(redis_proc.stop)
        children["redis-server"] = (redis_proc, logs / "redis.log")
    hint = smith_hint(redis_url, prefix, settings.redis_cluster)
    status(f"Redis {redact_text(redis_url)}, key prefix {prefix}; from another terminal: {hint}")
    env = dict(os.environ, SMITH_REDIS_URL=redis_url, SMITH_PREFIX=prefix)
    if not os.environ.get("SMITH_LLM_BASE_URL"):
        status("starting the local model server (SmolLM2-135M via xllamacpp, json_schema tool calling)")
        model = stack.enter_context(LocalModelServer(log_path=logs / "llm.log"))
        env.update(model.client_env())
        children["local model"] = (model.process, logs / "llm.log")
    for queue, name in (("turns", "turn worker"), ("tools", "tool worker")):
        log = logs / f"{queue}.log"
        worker = ManagedProcess(worker_argv("smith_worker.demo:app", queue), env=env, log_path=log)
        children[name] = (stack.enter_context(worker), log)
    wait_until(lambda: asyncio.run(_agents_ready(redis_url, prefix)), 30.0, "turn worker", interval=0.3)
    return Services(redis_url, prefix, children)


#: Seconds between two looks at the children of a long-running demo (:func:`watch_children`).
WATCH_EVERY = 0.5


@contextlib.contextmanager
def watching_children(children: dict[str, Child], on_exit: Callable[[str], None]) -> Iterator[None]:
    """While the block runs, call ``on_exit`` once (from a thread) with a line naming the first child that
    exits, its exit code and log, so a long-running ``make web`` says so instead of serving on without it.
    The watch ends with the block, before the children are stopped."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(WATCH_EVERY):
            for name, (child, log) in children.items():
                if not child.alive():
                    on_exit(f"the {name} exited (code {child.returncode}; its log: {log}): stopping everything")
                    return

    watcher = threading.Thread(target=watch, name="watch-children", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def one_line_errors(prog: str, body: Callable[[], int]) -> int:
    """Run ``body`` and return its exit code; a typed error (a service that cannot start, a bad setting)
    is printed as one ``prog: Kind: message`` line instead of a traceback, exit code 1; a Ctrl-C (once
    everything started was stopped) as ``prog: interrupted``, exit code 130."""
    try:
        return body()
    except SmithError as exc:
        return fail(prog, exc)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit code (0: a streamed turn with a tool call on the tool worker)."""
    parser = argparse.ArgumentParser(description="Run one real streamed turn end to end.")
    parser.add_argument("question", nargs="?", default=DEFAULT_QUESTION)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        redis_url, prefix, _ = start_services(stack, Path(".demo-logs"))
        _status(f"asking: {args.question}")
        ok = asyncio.run(_turn(redis_url, prefix, args.question))
    _status("stopped everything it started")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(one_line_errors("make demo", main))
