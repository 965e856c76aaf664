"""The ``smith`` command: talk to agents from a terminal (base install: needs only ``smith_client``).

* ``smith ask "question"`` runs one turn; ``smith chat`` is a REPL. Tokens go
  to stdout as they arrive; one status line per tool call and result goes to
  stderr (seed §19).
* ``smith --conversation ID keys`` lists that conversation's Redis keys and TTLs.
* ``smith status`` prints queue lengths, running turns and live workers per queue.
* It reads ``SMITH_REDIS_URL``, ``SMITH_PREFIX`` and the Sentinel variables.

``smith-worker`` (running workers) is :mod:`smith_worker.cli`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any, TextIO

import orjson
from redis.exceptions import RedisError

from smith_client.client import SmithClient
from smith_client.errors import SmithError
from smith_client.events import (
    Event,
    TokenData,
    ToolCallCompletedData,
    ToolResultData,
    TurnCompletedData,
    TurnFailedData,
    TurnResumedData,
)
from smith_client.hygiene import conversation_keys
from smith_client.redis_errors import smith_error
from smith_client.registry import fleet_status
from smith_client.repl import ChatRepl, run_turn


class StreamPrinter:
    """Prints a turn's events: tokens to ``out``, tool status lines to ``err``.

    An agent that does not stream publishes no ``token`` events, so its answer
    is printed from the final message of ``turn.completed``. After ``turn.resumed``
    (a worker crashed or stopped mid-turn) the interrupted step's reply is
    streamed again from its start, so it begins on a new line, with a status line. A sub-agent's
    status lines start with its chain (``[lead > researcher]``, the event's
    ``agent_path``); its tokens are not printed: its answer is its parent's tool result.
    """

    def __init__(self, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.out = out
        self.err = err
        self._streamed: set[str] = set()  # turns whose answer arrived as tokens

    def __call__(self, event: Event) -> None:
        data = event.payload
        chain = _chain(event.agent_path)
        if isinstance(data, TokenData):
            if chain:
                return
            self._streamed.add(event.turn_id)
            self.out.write(data.text)
            self.out.flush()
        elif isinstance(data, ToolCallCompletedData):
            self._status(f"{chain}[tool call] {data.name}({_compact(data.arguments)})")
        elif isinstance(data, ToolResultData):
            label = "error" if data.is_error else "result"
            ran_on = f" (worker {data.worker})" if data.worker else ""  # none: the turn gave up on the call
            self._status(f"{chain}[tool {label}] {data.name} -> {_short(data.content)}{ran_on}")
        elif isinstance(data, TurnResumedData):
            if event.turn_id in self._streamed:  # the interrupted reply is streamed again: start it on a new line
                self.out.write("\n")
                self.out.flush()
            self._status(
                f"[turn resumed, attempt {data.attempt}: a worker stopped; its unfinished reply streams again]"
            )
        elif isinstance(data, TurnCompletedData):
            if event.turn_id not in self._streamed:
                self.out.write(data.message.content or "")
            self._streamed.discard(event.turn_id)
            self.out.write("\n")
            self.out.flush()
        elif isinstance(data, TurnFailedData):
            self._status(f"[turn failed] {data.error.kind}: {data.error.message}")

    def _status(self, line: str) -> None:
        self.err.write(line + "\n")
        self.err.flush()


def _chain(agent_path: list[str]) -> str:
    """``"[lead > researcher] "`` for a sub-agent's event, ``""`` for the root agent's."""
    return f"[{' > '.join(agent_path)}] " if len(agent_path) > 1 else ""


def _compact(value: Any) -> str:
    return orjson.dumps(value).decode()


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


async def _run_ask(args: argparse.Namespace) -> int:
    async with _connect(args) as client:
        ok = await run_turn(
            client,
            args.question,
            conversation_id=args.conversation,
            agent=args.agent,
            timeout=args.timeout,
            printer=StreamPrinter(),
        )
        return 0 if ok else 1


async def _run_chat(args: argparse.Namespace) -> int:
    async with _connect(args) as client:
        repl = ChatRepl(
            client, StreamPrinter(), agent=args.agent, conversation_id=args.conversation, timeout=args.timeout
        )
        return await repl.run()


def _connect(args: argparse.Namespace) -> SmithClient:
    return SmithClient.from_url(
        args.redis_url,
        prefix=args.prefix,
        sentinels=os.environ.get("SMITH_REDIS_SENTINELS"),
        sentinel_master=os.environ.get("SMITH_REDIS_SENTINEL_MASTER"),
    )


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
        found = await conversation_keys(client.redis, client.keys, args.conversation)
    for info in found:
        print(f"{info.ttl:>9}  {info.type:<7} {info.key}")
    if not found:
        print(f"no keys for conversation {args.conversation!r} under prefix {args.prefix!r}", file=sys.stderr)
    return 0


def fail(prog: str, exc: BaseException) -> int:
    """Print a typed error as one ``PROG: Kind: message`` line on stderr (no traceback); returns exit code 1.

    A Redis failure (``RedisError``) is printed as the typed error it means (:func:`smith_error`).
    """
    error = exc if isinstance(exc, SmithError) else smith_error(exc)
    print(f"{prog}: {error.kind}: {error.message}", file=sys.stderr)
    return 1


def smith_main(argv: list[str] | None = None) -> None:
    """Entry point of ``smith``: ``smith ask "question"``, ``smith chat``, ``smith keys --conversation ID``,
    ``smith status``."""
    parser = argparse.ArgumentParser(prog="smith", description="Talk to Agent Smith agents.")
    parser.add_argument("--redis-url", default=os.environ.get("SMITH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--prefix", default=os.environ.get("SMITH_PREFIX", "smith"))
    parser.add_argument("--agent", default="default")
    parser.add_argument("--conversation", help="conversation id (ask, chat: default a new cli-PID; keys: required)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait for a turn")
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="run one turn and print it")
    ask.add_argument("question")
    sub.add_parser("chat", help="an interactive conversation (/reset, /exit, Ctrl-D; Ctrl-C cancels a turn)")
    sub.add_parser("keys", help="list the conversation's Redis keys and their TTLs (seconds)")
    sub.add_parser("status", help="queue lengths, running turns and live workers per queue")
    args = parser.parse_args(argv)
    if args.conversation is None:
        if args.command == "keys":
            parser.error("keys needs --conversation ID")
        args.conversation = f"cli-{os.getpid()}"
    commands = {"ask": _run_ask, "chat": _run_chat, "keys": _run_keys, "status": _run_status}
    try:
        code = asyncio.run(commands[args.command](args))
    except (SmithError, RedisError) as exc:  # status and keys read Redis directly: its errors too
        code = fail("smith", exc)
    except KeyboardInterrupt:
        code = 130
    raise SystemExit(code)
