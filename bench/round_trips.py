"""Redis commands of one text turn and of one one-tool turn, counted with MONITOR on a private redis-server.

It starts a private ``redis-server``, the scripted chat-completions server,
one turn worker and one tool worker serving ``tests.support.app:app``, warms
them up, then runs ``--turns`` sequential text turns and ``--turns``
sequential one-tool turns (client → turn worker → tool worker → client) while
``redis-cli monitor`` records every command. A command belongs to a turn when
it names the turn's id or its conversation's (its keys, job ids, channels);
``MULTI`` and ``EXEC`` name nothing, so each goes with the next (``MULTI``) or
the previous (``EXEC``) command of its connection. arq's queue polling and the
workers' heartbeats name no turn: they are the idle background, left out.

Each command is put down to the process whose connection sent it (the
workers' connections are found with psutil; the rest are this process, the
client). Commands a Lua script runs (MONITOR's ``[0 lua]`` lines) are counted
apart, as are ``MULTI``/``EXEC``. A pipeline's commands count one each
(MONITOR cannot see round trips), so the figures bound the round trips from above.

Usage: ``.venv/bin/python bench/round_trips.py [--turns 20] [--root DIR]``
(``--root``: measure another checkout of the project, e.g. one made with
``git archive main | tar -x -C DIR``; its ``smith_client``/``smith_worker`` are used).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose packages run")
    return parser.parse_args()


ARGS = _parse_args()
sys.path.insert(0, str(ARGS.root.resolve()))
os.environ["PYTHONPATH"] = str(ARGS.root.resolve())  # the worker processes import the same packages

from bench import LOGS  # noqa: E402
from smith_client import SmithClient  # noqa: E402
from smith_worker.local.processes import start_redis_server  # noqa: E402
from smith_worker import testing  # noqa: E402

# redis-cli monitor lines: 1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "ab12…" "3" "key" …
_LINE = re.compile(r'^\S+ \[\d+ ([^\]]*)\] "([A-Za-z]+)"')
KINDS = ("text", "tool")


@dataclass
class Command:
    """One MONITOR line: the sending connection ("lua" inside a script), the command name, the line."""

    conn: str
    name: str
    line: str


@dataclass
class Tally:
    """Commands of the measured turns of one kind."""

    turns: int = 0
    per_turn: list[int] = field(default_factory=list)
    by_process: Counter[str] = field(default_factory=Counter)
    by_command: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    connections: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


def parse(text: str) -> list[Command]:
    """The MONITOR log's commands, in order."""
    return [Command(m.group(1), m.group(2).upper(), line) for line in text.splitlines() if (m := _LINE.match(line))]


def owners(commands: list[Command], marks: dict[str, tuple[str, ...]]) -> list[str | None]:
    """The turn (a key of ``marks``) each command belongs to, or None (idle background)."""
    found: list[str | None] = []
    for command in commands:
        found.append(next((turn for turn, m in marks.items() if any(x in command.line for x in m)), None))
    last_on: dict[str, int] = {}
    for i, command in enumerate(commands):  # EXEC: the previous command of its connection
        if command.name == "EXEC" and command.conn in last_on:
            found[i] = found[last_on[command.conn]]
        last_on[command.conn] = i
    next_on: dict[str, int] = {}
    for i in range(len(commands) - 1, -1, -1):  # MULTI: the next command of its connection
        command = commands[i]
        if command.name == "MULTI" and command.conn in next_on:
            found[i] = found[next_on[command.conn]]
        next_on[command.conn] = i
    return found


def sender(command: Command, process_of: dict[str, str]) -> str:
    """The process that sent ``command``."""
    if command.conn == "lua":
        return "lua (inside scripts)"
    return process_of.get(command.conn.rsplit(":", 1)[-1], "client")


def tally(
    commands: list[Command], turns: dict[str, tuple[str, ...]], kind_of: dict[str, str], process_of: dict[str, str]
) -> dict[str, Tally]:
    """Per kind of turn: commands per turn, by process, by command; Lua and MULTI/EXEC apart."""
    tallies = {kind: Tally() for kind in KINDS}
    per_turn: Counter[str] = Counter()
    found = owners(commands, turns)
    following = None  # the client runs one turn at a time: what it sends naming no turn is for the next one
    for i in range(len(commands) - 1, -1, -1):
        if sender(commands[i], process_of) == "client":
            found[i] = following = found[i] or following
    for command, turn in zip(commands, found, strict=True):
        if turn is None or kind_of[turn] == "warm-up":
            continue
        t = tallies[kind_of[turn]]
        process = sender(command, process_of)
        if process != "lua (inside scripts)":
            t.connections[process].add(command.conn)
            per_turn[turn] += 1
        group = "multi/exec" if command.name in ("MULTI", "EXEC") and command.conn != "lua" else process
        t.by_process[group] += 1
        t.by_command[process][command.name] += 1
    for turn, kind in kind_of.items():
        if kind == "warm-up":
            continue
        tallies[kind].turns += 1
        tallies[kind].per_turn.append(per_turn[turn])
    return tallies


async def run_turns(redis_url: str, prefix: str, llm: testing.ScriptedLlmServer, turns: int) -> dict[str, str]:
    """Warm up, then run ``turns`` text turns and ``turns`` one-tool turns; return conversation id → kind
    (``text``, ``tool``, ``warm-up``)."""
    key = uuid.uuid4().hex[:10]
    llm.add_scenario(f"tool{key}", testing.Script(testing.Reply.tool_calls([("add", {"a": 1, "b": 2})]),
                                                  testing.Reply.text("3")))
    llm.add_scenario(f"text{key}", testing.Script(testing.Reply.text("hello there")))
    kinds: dict[str, str] = {}
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        for kind in KINDS:
            await client.send(testing.scenario_marker(f"{kind}{key}"), conversation_id=f"warm-{kind}-{key}", timeout=60)
            kinds[f"warm-{kind}-{key}"] = "warm-up"  # named, so its commands are told from the next turn's
        for i in range(turns):
            for kind in KINDS:
                conversation = f"rt{kind}{i}-{uuid.uuid4().hex[:8]}"
                await client.send(testing.scenario_marker(f"{kind}{key}"), conversation_id=conversation, timeout=60)
                kinds[conversation] = kind
    return kinds


async def turn_ids_of(redis_url: str, prefix: str, conversations: dict[str, str]) -> dict[str, str]:
    """Each conversation's turn id (the turn is over, so scan the turn states once)."""
    found: dict[str, str] = {}
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        async for raw in client.redis.scan_iter(match=client.keys.turn_state("*"), count=1000):
            conversation = (await client.redis.hget(raw, "conversation_id") or b"").decode()
            if conversation in conversations:
                found[conversation] = raw.decode().split(":turn:", 1)[1].rsplit(":state", 1)[0]
    return found


def ports_of(pid: int, redis_port: int) -> set[str]:
    """Local ports of the process's (and its children's) connections to Redis."""
    root = psutil.Process(pid)
    ports = set()
    for proc in [root, *root.children(recursive=True)]:
        for conn in proc.net_connections(kind="tcp"):
            if conn.raddr and conn.raddr.port == redis_port:
                ports.add(str(conn.laddr.port))
    return ports


def report(tallies: dict[str, Tally]) -> None:
    """Print the figures."""
    print(f"code: {ARGS.root}")
    for kind, t in tallies.items():
        n = t.turns or 1
        label = "text turn" if kind == "text" else "one-tool turn"
        print(f"\n{label}s measured: {t.turns}")
        print(
            f"  commands sent per turn (MULTI/EXEC included, Lua excluded): median "
            f"{statistics.median(t.per_turn):.0f}, min {min(t.per_turn)}, max {max(t.per_turn)}"
        )
        print(
            "  per turn by sender (MULTI/EXEC apart):",
            ", ".join(f"{p} {c / n:.1f}" for p, c in sorted(t.by_process.items())),
        )
        print(
            "  connections used over all turns:", ", ".join(f"{p} {len(c)}" for p, c in sorted(t.connections.items()))
        )
        for process, names in sorted(t.by_command.items()):
            print(f"  {process}:", ", ".join(f"{name} {c / n:.1f}" for name, c in names.most_common()))


async def main() -> None:
    redis_proc, redis_url = start_redis_server()
    port = redis_url.rsplit(":", 1)[1].split("/", 1)[0]
    log = Path("/tmp") / f"smith-monitor-{uuid.uuid4().hex[:6]}.log"
    process_of: dict[str, str] = {}
    try:
        with testing.ScriptedLlmServer() as llm:
            prefix = f"rt{uuid.uuid4().hex[:6]}"
            queues = ["turns", "tools"]
            env = testing.worker_env(redis_url, prefix, llm.base_url)
            procs = testing.start_workers("tests.support.app:app", env, queues, prefix,
                                  log_dir=LOGS)
            try:
                await testing.wait_for_workers(redis_url, prefix, 2)
                with log.open("w") as out:
                    monitor = subprocess.Popen(
                        [shutil.which("redis-cli") or "redis-cli", "-p", port, "monitor"], stdout=out
                    )
                    try:
                        await asyncio.sleep(0.3)
                        kinds = await run_turns(redis_url, prefix, llm, ARGS.turns)
                        await asyncio.sleep(0.5)  # the last turn's tail (wake-up of the next turn)
                    finally:
                        monitor.terminate()
                        monitor.wait()
                for queue, proc in zip(queues, procs, strict=True):
                    process_of.update((p, f"{queue[:-1]} worker") for p in ports_of(proc.pid, int(port)))
                ids = await turn_ids_of(redis_url, prefix, kinds)
            finally:
                for proc in procs:
                    proc.stop()
    finally:
        redis_proc.stop()
    commands = parse(log.read_text(errors="replace"))
    log.unlink()
    marks = {conversation: (conversation, ids[conversation]) for conversation in kinds}
    report(tally(commands, marks, kinds, process_of))


if __name__ == "__main__":
    asyncio.run(main())
