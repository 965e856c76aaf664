"""A turn worker's resident memory (RSS) under long histories, Redis restarts and Redis stalls.

Starts a private redis-server on a fixed port, the scripted chat-completions
server and one real turn worker (``tests.support.app:app``, agent ``plain``:
``FullMemory``, so every turn sends its whole history), then reads the worker's
RSS (``VmRSS`` of ``/proc/<pid>/status``) at each phase:

* idle: after one warm-up turn;
* during: ``--turns`` concurrent turns, each over its own conversation of
  ``--messages`` stored messages, all waiting for their model (the scripted
  model holds every reply until all requests arrived); the peak is sampled
  every 50 ms until they completed;
* after: ``--settle`` seconds after they completed;
* restarts: ``--restarts`` times, the same burst with Redis killed while all
  its turns wait for their model, started again empty on the same port 2 s
  later; the RSS once the worker served a new turn and ``--settle`` seconds passed;
* stalls: a steady stream of short turns (``--turns`` callers, each sending one turn after another over a
  fresh conversation) for ``--load`` seconds, ``--calm`` times without a fault, then ``--stalls`` times
  with Redis stopped (SIGSTOP) for ``--stop`` seconds in its middle and continued (SIGCONT); the RSS
  ``--settle`` seconds after each phase's last turn ended. The calm phases show the drift of the load
  itself, so a stall's figure beside them tells a step that stays from a growth that goes on.

Usage: ``.venv/bin/python bench/worker_memory.py [--turns 20] [--messages 10000] [--restarts 3] [--stalls 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import LOGS  # noqa: E402
from smith_client import SmithClient  # noqa: E402
from smith_client.errors import SmithError  # noqa: E402
from smith_client.messages import AssistantMessage, UserMessage, message_to_json  # noqa: E402
from smith_worker.local.processes import ManagedProcess, free_port, start_redis_server  # noqa: E402
from smith_worker.testing import (  # noqa: E402
    Reply,
    Script,
    ScriptedLlmServer,
    scenario_marker,
    start_workers,
    wait_for_workers,
    worker_env,  # noqa: E402
)

APP = "tests.support.app:app"
MIB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid`` in bytes (``VmRSS``, Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def history_blobs(marker: str, messages: int) -> list[bytes]:
    """``messages`` stored messages, user questions (each carrying ``marker``, so the scripted model routes
    the request whatever the history trimmed) and answers, ~150 bytes each."""
    out: list[bytes] = []
    for n in range(messages):
        if n % 2 == 0:
            out.append(message_to_json(UserMessage(content=f"{marker} question {n}: " + "words " * (n % 40))))
        else:
            out.append(message_to_json(AssistantMessage(content=f"answer {n}: " + "text " * (n % 25))))
    return out


async def fill(client: SmithClient, conversation_id: str, blobs: list[bytes]) -> None:
    """Store ``blobs`` as the history of ``conversation_id`` (as earlier turns would have)."""
    key = client.keys.history(conversation_id)
    for start in range(0, len(blobs), 1000):
        await client.redis.rpush(key, *blobs[start : start + 1000])


class Sampler:
    """The peak RSS of ``pid`` (bytes), sampled every 50 ms in a thread while running."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


async def burst(client: SmithClient, llm: ScriptedLlmServer, turns: int, messages: int) -> tuple[list, threading.Event]:
    """Submit ``turns`` turns over fresh ``messages``-message conversations whose model holds its reply
    until the returned gate is set; returns once every turn's model request arrived."""
    key, gate = uuid.uuid4().hex[:10], threading.Event()
    llm.add_scenario(key, Reply.text("fine " * 20, chunk_size=10, gate=gate))
    blobs = history_blobs(scenario_marker(key), messages - 1)
    handles = []
    for _ in range(turns):
        conversation = f"c-{uuid.uuid4().hex[:8]}"
        await fill(client, conversation, blobs)
        handles.append(await client.submit(f"{scenario_marker(key)} go", conversation_id=conversation, agent="plain"))
    if not await llm.wait_until_async(lambda: llm.attempts(key) >= turns, timeout=300):
        raise SystemExit(f"only {llm.attempts(key)} of {turns} model requests arrived in 300 s")
    return handles, gate


async def served(url: str, prefix: str, llm: ScriptedLlmServer) -> None:
    """Until one new turn completed (a new client each try: Redis may just have restarted)."""
    key = uuid.uuid4().hex[:10]
    llm.add_scenario(key, Reply.text("ok"))
    while True:
        try:
            async with SmithClient.from_url(url, prefix=prefix) as client:
                await client.send(
                    f"{scenario_marker(key)} hi", conversation_id=uuid.uuid4().hex, agent="plain", timeout=30
                )
            return
        except SmithError:
            await asyncio.sleep(0.5)


async def steady(url: str, prefix: str, llm: ScriptedLlmServer, callers: int, stop: asyncio.Event) -> int:
    """``callers`` loops each sending one short turn after another (a fresh conversation each, agent
    ``default``: one ``add`` call on the tool worker, then 100 streamed characters) until ``stop`` is set;
    a turn that fails (Redis stopped under it) is followed by the next after 0.2 s. Returns the turns
    completed."""
    key = uuid.uuid4().hex[:10]
    llm.add_scenario(
        key, Script(Reply.tool_calls([("add", {"a": 17, "b": 23})]), Reply.text("fine " * 20, chunk_size=10))
    )
    completed = 0

    async def caller() -> None:
        nonlocal completed
        async with SmithClient.from_url(url, prefix=prefix) as client:
            while not stop.is_set():
                try:
                    conversation = uuid.uuid4().hex
                    await client.send(f"{scenario_marker(key)} hi", conversation_id=conversation, timeout=30)
                    completed += 1
                except SmithError:
                    await asyncio.sleep(0.2)

    await asyncio.gather(*(caller() for _ in range(callers)))
    llm.reset()
    return completed


async def stalls(
    redis_proc: ManagedProcess, url: str, prefix: str, llm: ScriptedLlmServer, pid: int, args: argparse.Namespace
) -> None:
    """The stall phases (module docstring): ``--calm`` phases of steady load, then ``--stalls`` with Redis
    stopped in their middle; prints the RSS after each."""
    figures: list[int] = []
    for number in range(1, args.calm + args.stalls + 1):
        stop = asyncio.Event()
        load = asyncio.create_task(steady(url, prefix, llm, args.turns, stop))
        stalled = number > args.calm
        if stalled:
            await asyncio.sleep((args.load - args.stop) / 2)
            redis_proc.signal(signal.SIGSTOP)
            await asyncio.sleep(args.stop)
            redis_proc.signal(signal.SIGCONT)
            await asyncio.sleep((args.load - args.stop) / 2)
        else:
            await asyncio.sleep(args.load)
        stop.set()
        completed = await load
        await asyncio.sleep(args.settle)
        figures.append(rss_bytes(pid))
        what = f"Redis stopped {args.stop:g} s in its middle" if stalled else "no fault"
        print(
            f"{args.load:g} s of {args.turns} callers' steady turns, {what}: {completed} turns completed; "
            f"{figures[-1] / MIB:.1f} MiB {args.settle:g} s after"
        )
    steps = ", ".join(f"{(b - a) / MIB:+.1f}" for a, b in zip(figures, figures[1:], strict=False))
    print(f"RSS per phase from the first: {steps} MiB ({args.calm} without a fault, then {args.stalls} stalls)")


async def main(args: argparse.Namespace) -> None:
    turns, messages, restarts, settle = args.turns, args.messages, args.restarts, args.settle
    port = free_port()
    redis_proc, url = start_redis_server(port)
    prefix = f"mem{uuid.uuid4().hex[:6]}"
    with ScriptedLlmServer() as llm:
        (worker,) = start_workers(APP, worker_env(url, prefix, llm.base_url), ["turns"], prefix, log_dir=LOGS)
        try:
            await wait_for_workers(url, prefix, 1)
            await served(url, prefix, llm)
            await asyncio.sleep(settle)
            idle = rss_bytes(worker.pid)
            stored = sum(map(len, history_blobs(scenario_marker("x" * 10), messages - 1)))
            print(f"each history: {messages} messages ({stored / MIB:.2f} MiB stored); {turns} turns per burst")
            print(f"turn worker RSS idle: {idle / MIB:.1f} MiB")
            async with SmithClient.from_url(url, prefix=prefix) as client:
                with Sampler(worker.pid) as sampler:
                    handles, gate = await burst(client, llm, turns, messages)
                    waiting = rss_bytes(worker.pid)
                    gate.set()
                    await asyncio.gather(*(handle.result(timeout=120) for handle in handles))
                llm.reset()
            await asyncio.sleep(settle)
            after = rss_bytes(worker.pid)
            print(
                f"{turns} concurrent turns over {messages}-message histories: {waiting / MIB:.1f} MiB while all "
                f"wait for their model, peak {sampler.peak / MIB:.1f} MiB; {after / MIB:.1f} MiB {settle:g} s after"
            )
            figures = [after]
            for number in range(1, restarts + 1):
                async with SmithClient.from_url(url, prefix=prefix) as client:
                    _, gate = await burst(client, llm, turns, messages)
                redis_proc = restart(redis_proc, port)
                gate.set()
                await served(url, prefix, llm)
                llm.reset()
                await asyncio.sleep(settle)
                figures.append(rss_bytes(worker.pid))
                print(
                    f"Redis restart {number} (killed with {turns} such turns waiting for their model): "
                    f"{figures[-1] / MIB:.1f} MiB {settle:g} s after the worker served again"
                )
            print(
                f"growth across {restarts} restarts: {(figures[-1] - figures[0]) / MIB:+.1f} MiB "
                f"({', '.join(f'{(b - a) / MIB:+.1f}' for a, b in zip(figures, figures[1:], strict=False))} MiB "
                f"per restart); worker alive: {worker.alive()}"
            )
            worker.stop()  # the stalls run on a worker that never held a long history: its heap is the load's
            worker, tools = start_workers(
                APP, worker_env(url, prefix, llm.base_url), ["turns", "tools"], prefix, log_dir=LOGS
            )
            try:
                await wait_for_workers(url, prefix, 2)
                await served(url, prefix, llm)
                await asyncio.sleep(settle)
                print(
                    f"a new turn worker (and a tool worker) for the stalls, RSS idle: "
                    f"{rss_bytes(worker.pid) / MIB:.1f} MiB"
                )
                await stalls(redis_proc, url, prefix, llm, worker.pid, args)
                print(f"workers alive: {worker.alive() and tools.alive()}")
            finally:
                tools.stop()
        finally:
            worker.stop()
            redis_proc.stop()


def restart(redis_proc: ManagedProcess, port: int) -> ManagedProcess:
    """Kill Redis (SIGKILL), wait 2 s, start it again, empty, on ``port``."""
    redis_proc.signal(signal.SIGKILL)
    redis_proc.stop()
    time.sleep(2.0)
    return start_redis_server(port)[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--settle", type=float, default=8.0, help="seconds before each RSS reading after a phase")
    parser.add_argument("--calm", type=int, default=2, help="steady-load phases without a fault")
    parser.add_argument("--stalls", type=int, default=3, help="steady-load phases with Redis stopped")
    parser.add_argument("--load", type=float, default=40.0, help="seconds of steady load per phase")
    parser.add_argument("--stop", type=float, default=10.0, help="seconds Redis stays stopped in a stall")
    asyncio.run(main(parser.parse_args()))
