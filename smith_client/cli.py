"""The ``smith`` command: talk to agents from a terminal (base install: needs only ``smith_client``).

* ``smith ask "question"`` runs one turn; ``smith chat`` is a REPL. Tokens go
  to stdout as they arrive; one status line per tool call and result goes to
  stderr (seed §19).
* ``smith --conversation ID keys`` lists that conversation's Redis keys and TTLs.

``smith-worker`` (running workers) is :mod:`smith_worker.cli`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any, TextIO

import orjson

from smith_client.client import SmithClient
from smith_client.errors import SmithError
from smith_client.events import (
    Event,
    TokenData,
    ToolCallCompletedData,
    ToolResultData,
    TurnCompletedData,
    TurnFailedData,
)
from smith_client.hygiene import conversation_keys
from smith_client.repl import ChatRepl, run_turn


class StreamPrinter:
    """Prints a turn's events: tokens to ``out``, tool status lines to ``err``."""

    def __init__(self, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.out = out
        self.err = err

    def __call__(self, event: Event) -> None:
        data = event.payload
        if isinstance(data, TokenData):
            self.out.write(data.text)
            self.out.flush()
        elif isinstance(data, ToolCallCompletedData):
            self._status(f"[tool call] {data.name}({_compact(data.arguments)})")
        elif isinstance(data, ToolResultData):
            label = "error" if data.is_error else "result"
            self._status(f"[tool {label}] {data.name} -> {_short(data.content)} (worker {data.worker})")
        elif isinstance(data, TurnCompletedData):
            self.out.write("\n")
            self.out.flush()
        elif isinstance(data, TurnFailedData):
            self._status(f"[turn failed] {data.error.kind}: {data.error.message}")

    def _status(self, line: str) -> None:
        self.err.write(line + "\n")
        self.err.flush()


def _compact(value: Any) -> str:
    return orjson.dumps(value).decode()


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


async def _run_ask(args: argparse.Namespace) -> int:
    async with SmithClient.from_url(args.redis_url, prefix=args.prefix) as client:
        ok = await run_turn(client, args.question, conversation_id=args.conversation, agent=args.agent,
                            timeout=args.timeout, printer=StreamPrinter())
        return 0 if ok else 1


async def _run_chat(args: argparse.Namespace) -> int:
    async with SmithClient.from_url(args.redis_url, prefix=args.prefix) as client:
        repl = ChatRepl(client, StreamPrinter(), agent=args.agent, conversation_id=args.conversation,
                        timeout=args.timeout)
        return await repl.run()


async def _run_keys(args: argparse.Namespace) -> int:
    async with SmithClient.from_url(args.redis_url, prefix=args.prefix) as client:
        for info in await conversation_keys(client.redis, client.keys, args.conversation):
            print(f"{info.ttl:>9}  {info.type:<7} {info.key}")
    return 0


def smith_main(argv: list[str] | None = None) -> None:
    """Entry point of ``smith``: ``smith ask "question"``, ``smith chat``, ``smith keys --conversation ID``."""
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
    args = parser.parse_args(argv)
    commands = {"ask": _run_ask, "chat": _run_chat, "keys": _run_keys}
    try:
        code = asyncio.run(commands[args.command](args))
    except SmithError as exc:
        print(f"smith: {exc.kind}: {exc.message}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    raise SystemExit(code)
