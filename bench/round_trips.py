"""Redis commands (and bytes) of one tool turn, counted with MONITOR on a private redis-server.

Issue 10 moved the Lua scripts into ``smith_client/lua`` (EVALSHA instead of
EVAL with the script text) and gave each conversation a statuses hash; this
bench shows the commands of a tool turn did not grow. It starts a private
``redis-server``, the scripted chat-completions server, one turn worker and
one tool worker serving ``tests.support.app:app``, warms them up with one turn,
then runs ``--turns`` sequential turns with one tool call each while
``redis-cli monitor`` records every command. A command belongs to a turn when
it names the turn's id or its conversation's (its keys, job ids, channels);
arq's queue polling and the workers' heartbeats name neither and are left out,
and so are the commands scripts run inside Redis (MONITOR's ``[0 lua]`` lines).
A pipeline's commands count one each (MONITOR cannot see round trips), so the
figure is an upper bound on the turn's round trips.

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
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose packages run")
    return parser.parse_args()


ARGS = _parse_args()
sys.path.insert(0, str(ARGS.root.resolve()))
os.environ["PYTHONPATH"] = str(ARGS.root.resolve())  # the worker processes import the same packages

from smith_client import SmithClient  # noqa: E402
from smith_worker.local.processes import start_redis_server  # noqa: E402
from tests.conftest import start_workers, wait_for_workers, worker_env  # noqa: E402
from tests.support.scripted_llm import Reply, Script, ScriptedLlmServer, scenario_marker  # noqa: E402

# redis-cli monitor lines: 1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "ab12…" "3" "key" …
_COMMAND = re.compile(r'^\S+ \[[^\]]*\] "([A-Za-z]+)"')


async def run_turns(redis_url: str, prefix: str, llm: ScriptedLlmServer, turns: int) -> list[str]:
    """Run one warm-up turn, then ``turns`` tool turns; return the conversation ids measured."""
    key = uuid.uuid4().hex[:10]
    llm.add_scenario(key, Script(Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("3")))
    conversations = []
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        await client.send(scenario_marker(key), conversation_id=f"warm-{key}", timeout=60)
        for i in range(turns):
            conversation = f"rt{i}-{uuid.uuid4().hex[:8]}"
            answer = await client.send(scenario_marker(key), conversation_id=conversation, timeout=60)
            assert answer.content == "3"
            conversations.append(conversation)
    return conversations


def per_turn(lines: list[str], conversations: list[str], turn_ids: dict[str, str]) -> tuple[list[int], list[int],
                                                                                                 Counter[str]]:
    """Commands and bytes per turn, and the command names over all turns."""
    counts, sizes, names = [], [], Counter()
    for conversation in conversations:
        marks = (conversation, turn_ids[conversation])
        mine = [line for line in lines if any(mark in line for mark in marks)]
        counts.append(len(mine))
        sizes.append(sum(len(line) for line in mine))
        names.update(m.group(1).upper() for line in mine if (m := _COMMAND.match(line)))
    return counts, sizes, names


async def turn_ids_of(redis_url: str, prefix: str, conversations: list[str]) -> dict[str, str]:
    """Each conversation's turn id (the turn is over, so scan the turn states once)."""
    found: dict[str, str] = {}
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        async for raw in client.redis.scan_iter(match=client.keys.turn_state("*"), count=1000):
            conversation = (await client.redis.hget(raw, "conversation_id") or b"").decode()
            if conversation in conversations:  # the older checkout has no Keys.turn_id_of_state
                found[conversation] = raw.decode().split(":turn:", 1)[1].rsplit(":state", 1)[0]
    return found


async def main() -> None:
    redis_proc, redis_url = start_redis_server()
    port = redis_url.rsplit(":", 1)[1].split("/", 1)[0]
    log = Path("/tmp") / f"smith-monitor-{uuid.uuid4().hex[:6]}.log"
    try:
        with ScriptedLlmServer() as llm:
            prefix = f"rt{uuid.uuid4().hex[:6]}"
            procs = start_workers("tests.support.app:app", worker_env(redis_url, prefix, llm.base_url),
                                  ["turns", "tools"], prefix)
            try:
                await wait_for_workers(redis_url, prefix, 2)
                with log.open("w") as out:
                    monitor = subprocess.Popen([shutil.which("redis-cli") or "redis-cli", "-p", port, "monitor"],
                                               stdout=out)
                    try:
                        await asyncio.sleep(0.3)
                        conversations = await run_turns(redis_url, prefix, llm, ARGS.turns)
                        await asyncio.sleep(0.5)  # the last turn's tail (wake-up of the next turn)
                    finally:
                        monitor.terminate()
                        monitor.wait()
                ids = await turn_ids_of(redis_url, prefix, conversations)
            finally:
                for proc in procs:
                    proc.stop()
    finally:
        redis_proc.stop()
    # commands a script runs show as "[0 lua]": they are not sent by a client
    lines = [line for line in log.read_text(errors="replace").splitlines() if " lua]" not in line]
    log.unlink()
    counts, sizes, names = per_turn(lines, conversations, ids)
    print(f"code: {ARGS.root}")
    print(f"tool turns measured: {len(counts)}")
    print(f"commands per turn: median {statistics.median(counts):.0f}, min {min(counts)}, max {max(counts)}")
    print(f"bytes of those commands per turn (as MONITOR prints them): median {statistics.median(sizes):.0f}")
    print("by command (all turns):", ", ".join(f"{name} {n}" for name, n in names.most_common()))


if __name__ == "__main__":
    asyncio.run(main())
