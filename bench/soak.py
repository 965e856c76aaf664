"""Soak test: the fleet under a steady mix of turns and faults, then a check of everything it left behind.

Starts a private redis-server keeping an append-only file in its own directory,
the scripted chat-completions server (a loopback HTTP server in this process), 2
turn workers and 2 tool workers serving ``bench.soak_app:app``, and for
``--minutes`` submits ``--rate`` turns per second to ``--conversations``
conversations (a third are text answers, the others make one or two calls of the
non-idempotent ``record_effect``, each with its own label; a few are cancelled
by the caller, a few followed as event streams). Meanwhile the faults of
:func:`fault_schedule`, which scales with the duration: a kill -9 of a worker
every tenth of the run (the four in turn, each restarted at once as a supervisor
would), one kill -9 and restart of Redis on its append-only file at a third, one
10 s SIGSTOP of Redis at two thirds. Then it drains (no new turns, no faults; at
most ``--drain`` s) and prints:

* turns by final state (completed, failed by error kind, cancelled) and the non-terminal ones (must be 0);
* duplicated side effects: ``record_effect`` labels executed more than once (0);
* event gaps: turns whose replay log is not seq 1..N ending with exactly one terminal event, the one of
  its final status (0), and followed streams that missed or repeated an event (0);
* conversations whose stored history is not well-formed (0): the tool-call pairing invariant
  (:func:`smith_worker.memory.pairing.is_well_formed`), one user message per turn, in submission order, and
  each completed turn exactly ``user, [assistant with calls, its tool messages], assistant answer``;
* keys without a TTL and without a documented owner (0, :func:`smith_client.hygiene.keys_without_ttl`);
* the slope of Redis ``used_memory`` and of each worker process's RSS in MiB per 1000 finished turns
  (least squares over samples every 10 s, without each series' first minute; a restarted worker is a new
  series), over the whole run and over its second half (by then the turn TTL, a quarter of the run by
  default, has expired the first turns and the histories have reached ``--history-max``).

When a check fails it also describes the first non-terminal turns (state, lease, jobs, conversation FIFO)
and keeps Redis's append-only file beside the logs for a post-mortem.

Exits 1 when a zero-check fails. Only loopback; it stops every process it started, whatever happens.
Worker and Redis logs: ``.pytest_cache/worker-logs/soak*``.

Usage: ``.venv/bin/python bench/soak.py --minutes 30`` (``make soak MINUTES=30``)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from redis.exceptions import RedisError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import LOGS  # noqa: E402
from bench.distributed import rss_mib  # noqa: E402
from bench.durability import registered  # noqa: E402
from bench.soak_app import effects_key  # noqa: E402
from bench.stats import pct  # noqa: E402
from smith_client import SmithClient  # noqa: E402
from smith_client import turn_record as record  # noqa: E402
from smith_client.errors import SmithError, TransportError  # noqa: E402
from smith_client.events import TERMINAL_TYPES, event_from_json  # noqa: E402
from smith_client.hygiene import keys_without_ttl, owned_keys_without_ttl  # noqa: E402
from smith_client.messages import AssistantMessage, ToolMessage, UserMessage  # noqa: E402
from smith_worker.local.processes import ManagedProcess, free_port, start_redis_server  # noqa: E402
from smith_worker.memory.pairing import answer_dangling, is_well_formed  # noqa: E402
from smith_worker import testing  # noqa: E402

APP = "bench.soak_app:app"
AGENT = "soak"
SCENARIO = "soak"
#: The fleet: one slot per worker process, restarted in place after a kill.
SLOTS = [("turns-1", "turns"), ("turns-2", "turns"), ("tools-1", "tools"), ("tools-2", "tools")]
#: Turn kinds → ``record_effect`` calls the model makes (in one step); drawn with equal odds.
KINDS = {"text": 0, "tool1": 1, "tool2": 2}
PROMPT = re.compile(r"\b(text|tool1|tool2) (t\d+)\b")
#: Seconds between the streamed chunks of an answer (a turn takes a few tenths of a second).
CHUNK_DELAY = 0.03
#: Kills per run: one every ``duration / KILLS`` (every 3 min in a 30-minute run).
KILLS = 10
FREEZE_SECONDS = 10.0
REDIS_DOWN_SECONDS = 2.0
SAMPLE_EVERY = 10.0
POLL_EVERY = 0.5
#: Seconds after a turn is seen terminal before its replay log is read (and once more at the end).
EVENT_CHECK_DELAY = 2.0
#: Tries of one submission through outages, one second apart (each at most the 5 s socket timeout).
SUBMIT_TRIES = 60
#: Turn ids, states and logs read per pipeline.
BATCH = 500
#: Seconds at the start of each memory series left out of its slopes (a process's imports, pools, first turns).
WARM_UP = 60.0
#: The shortest default turn TTL, seconds: a turn waiting out the faults must not expire before it is seen.
MIN_TURN_TTL = 300
#: Non-terminal turns described in detail (state, leases, jobs, conversation FIFO) at the end.
DIAGNOSED = 10
MIB = 1024 * 1024


@dataclass
class Turn:
    """One submitted turn as the soak saw it; ``calls`` is the number of ``record_effect`` calls it makes."""

    turn_id: str
    conversation: str
    calls: int
    submitted_at: float
    status: str = "submitting"
    error_kind: str = ""
    ended_at: float | None = None


# ---- the pure checks (tests/unit/test_soak_checks.py) -----------------------------------------------------


def fault_schedule(duration: float, kills: int = KILLS) -> list[tuple[float, str]]:
    """The faults of a run of ``duration`` seconds as ``(seconds from the start, fault)``, in time order:
    ``kill`` every ``duration / kills`` seconds (``kills - 1`` of them, the last one before the end),
    ``redis-restart`` at a third and ``redis-stop`` at two thirds."""
    every = duration / kills
    plan = [(every * k, "kill") for k in range(1, kills)]
    return sorted([*plan, (duration / 3, "redis-restart"), (2 * duration / 3, "redis-stop")])


def event_problems(events: Sequence[tuple[int, str]], counter: int | None, status: str | None) -> list[str]:
    """What is wrong with one turn's events, given as ``(seq, type)`` in log (or arrival) order.

    They must be seq 1..N without a gap or repeat, hold exactly one terminal event, last, whose type is
    ``turn.<status>`` when ``status`` is given; ``counter`` (the turn's seq counter, when given) must be N.
    Returns ``[]`` when all holds.
    """
    problems = []
    seqs = [seq for seq, _ in events]
    wrong = next((i for i, seq in enumerate(seqs) if seq != i + 1), None)
    if wrong is not None:
        problems.append(f"seq {seqs[wrong]} where {wrong + 1} was due")
    if counter is not None and counter != len(seqs):
        problems.append(f"seq counter {counter} but {len(seqs)} events")
    terminal = [kind for _, kind in events if kind in TERMINAL_TYPES]
    if len(terminal) != 1:
        problems.append(f"{len(terminal)} terminal events")
    elif events[-1][1] not in TERMINAL_TYPES:
        problems.append(f"{events[-1][1]} after the terminal event")
    if status and len(terminal) == 1 and terminal[0] != f"turn.{status}":
        problems.append(f"terminal event {terminal[0]} but status {status}")
    return problems


def slope_per_1000(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(turns, MiB)`` points in MiB per 1000 turns; None with fewer than 3 points
    or a single turn count."""
    if len(points) < 3 or len({turns for turns, _ in points}) < 2:
        return None
    turns, mib = zip(*points, strict=True)
    return statistics.linear_regression([t / 1000 for t in turns], mib).slope


def duplicated(records: Iterable[bytes | str]) -> dict[str, list[str]]:
    """``record_effect`` executions (``label|worker id``) → ``{label: [worker ids]}`` of labels run more than once."""
    runs: dict[str, list[str]] = collections.defaultdict(list)
    for entry in records:
        label, _, worker = (entry.decode() if isinstance(entry, bytes) else entry).partition("|")
        runs[label].append(worker)
    return {label: workers for label, workers in runs.items() if len(workers) > 1}


def _segments(messages: Sequence[Any]) -> list[tuple[str | None, list[Any]]]:
    """The history cut before each user message: ``(its turn id, the messages from it to the next one)``;
    the messages before the first user message (left by trimming) come first with ``None``."""
    out: list[tuple[str | None, list[Any]]] = [(None, [])]
    for message in messages:
        if isinstance(message, UserMessage):
            match = PROMPT.search(message.content)
            out.append((match.group(2) if match else "?", []))
        out[-1][1].append(message)
    return out if out[0][1] else out[1:]


def _shape(messages: Sequence[Any]) -> str:
    """``U``, ``C<n>`` (assistant with n calls), ``T`` (tool), ``A`` (assistant answer) per message."""

    def letter(m: Any) -> str:
        if isinstance(m, AssistantMessage):
            return f"C{len(m.tool_calls)}" if m.tool_calls else "A"
        return "T" if isinstance(m, ToolMessage) else "U" if isinstance(m, UserMessage) else "?"

    return " ".join(letter(m) for m in messages)


def expected_shape(calls: int) -> str:
    """The :func:`_shape` of a completed turn making ``calls`` calls in one step."""
    return " ".join(["U", *([f"C{calls}", *["T"] * calls] if calls else []), "A"])


def _pairing_problem(messages: Sequence[Any], last: Turn | None) -> str | None:
    """The pairing invariant; calls left unanswered at the very end are fine after a turn that did not
    complete (the conversation's next turn answers them, docs/architecture.md, Tool-call pairing)."""
    if is_well_formed(list(messages)):
        return None
    repairs = answer_dangling(list(messages))
    ends_dangling = len(repairs) == 1 and repairs[0][0] == len(messages)
    if (
        ends_dangling
        and last is not None
        and last.status != record.COMPLETED
        and is_well_formed([*messages, *repairs[0][1]])
    ):
        return None
    return "tool-call pairing broken (orphan, duplicate or unanswered tool message)"


def history_problems(messages: Sequence[Any], turns: Sequence[Turn]) -> list[str]:
    """What is wrong with one conversation's stored history (messages in stored form, oldest first), given
    its turns in submission order; ``[]`` when it is well-formed (see the module docstring)."""
    by_id = {turn.turn_id: turn for turn in turns}
    order = {turn.turn_id: i for i, turn in enumerate(turns)}
    segments = _segments(messages)
    ids = [turn_id for turn_id, _ in segments if turn_id is not None]
    last = by_id.get(ids[-1]) if ids else None
    problems = [p for p in [_pairing_problem(messages, last)] if p]
    problems += [f"{t}: user message {n} times" for t, n in collections.Counter(ids).items() if n > 1]
    problems += [f"user message of unknown turn {t}" for t in ids if t not in by_id]
    known = [order[t] for t in ids if t in order]
    if known != sorted(known):
        problems.append("user messages out of submission order")
    first = min(known, default=len(turns))  # earlier turns may have been trimmed
    problems += [
        f"{t.turn_id}: completed, not in the history"
        for t in turns[first:]
        if t.status == record.COMPLETED and t.turn_id not in ids
    ]
    for turn_id, segment in segments:
        if turn_id is None:
            continue
        answers = [m.content for m in segment if isinstance(m, AssistantMessage) and not m.tool_calls]
        problems += [
            f"{turn_id}: answer {a[:30]!r} of another turn" for a in answers if not a.startswith(f"done {turn_id} ")
        ]
        turn = by_id.get(turn_id)
        if turn is not None and turn.status == record.COMPLETED and _shape(segment) != expected_shape(turn.calls):
            problems.append(f"{turn_id}: {_shape(segment)!r}, not {expected_shape(turn.calls)!r}")
    return problems


# ---- the model --------------------------------------------------------------------------------------------


def answer(request: testing.RecordedRequest) -> testing.Reply:
    """The scripted model: the last user message names the turn's kind and id; a tool turn's first step calls
    ``record_effect`` once per call (label ``<turn id>.<i>``), every other step answers ``done <turn id> …``."""
    last_user = [m for m in request.messages if m.get("role") == "user"][-1]
    kind, turn_id = PROMPT.search(str(last_user.get("content"))).groups()  # type: ignore[union-attr]
    if KINDS[kind] and request.step == 0:
        return testing.Reply.tool_calls([("record_effect", {"label": f"{turn_id}.{i}"}) for i in range(KINDS[kind])])
    return testing.Reply.text(f"done {turn_id} " + "word " * 8, chunk_size=8, delay=CHUNK_DELAY)


# ---- the run ----------------------------------------------------------------------------------------------


class Soak:
    """One soak run (see the module docstring); :meth:`run` returns the exit code."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.duration = args.minutes * 60.0
        self.turn_ttl = args.turn_ttl or max(MIN_TURN_TTL, int(self.duration / 4))
        self.prefix = f"soak{uuid.uuid4().hex[:6]}"
        self.rng = random.Random(args.seed)
        self.conversations = [f"conv{i:03d}" for i in range(args.conversations)]
        self.turns: dict[str, Turn] = {}
        self.by_conversation: dict[str, list[Turn]] = collections.defaultdict(list)
        self.unfinished: set[str] = set()
        self.submitting: set[str] = set()  # conversations with a submission in progress (keeps their order)
        self.due: collections.deque[tuple[float, str]] = collections.deque()  # (when, turn id) to read the log of
        self.event_verdicts: dict[str, list[str]] = {}
        #: Turn id → its state and events when its log first failed a check (evidence_of).
        self.evidence: dict[str, str] = {}
        self.follow_problems: list[str] = []
        self.samples: dict[str, list[tuple[float, int, float]]] = collections.defaultdict(list)
        self.timeline: list[str] = []
        self.counts: collections.Counter[str] = collections.Counter()
        self.tasks: set[asyncio.Task[None]] = set()
        self.finished = 0
        self.kills = 0
        self.handler_errors = 0
        self.workers: list[ManagedProcess] = []
        self.retired: list[ManagedProcess] = []
        self.redis: ManagedProcess | None = None
        self.aof_dir = Path(tempfile.mkdtemp(prefix="smith-soak-aof-"))
        self.redis_log = LOGS / f"{self.prefix}-redis.log"
        self.port = free_port()
        self.started = time.monotonic()
        self.keep_data = False  # set when a check fails: the append-only file is kept for a post-mortem

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    async def run(self) -> int:
        LOGS.mkdir(parents=True, exist_ok=True)
        try:
            self.redis, url = start_redis_server(self.port, self.redis_log, aof_dir=self.aof_dir)
            with testing.ScriptedLlmServer() as llm:
                self.llm = llm
                llm.add_scenario(SCENARIO, answer)
                self.env = testing.worker_env(
                    url,
                    self.prefix,
                    llm.base_url,
                    SMITH_TURN_TTL=str(self.turn_ttl),
                    SMITH_HISTORY_MAX_MESSAGES=str(self.args.history_max),
                )
                try:
                    return await self.run_fleet(url)
                finally:  # before the model server goes: workers with open connections to it would race its close
                    self.stop_workers()
        finally:
            self.stop_workers()
            if self.redis is not None:
                self.redis.signal(signal.SIGCONT)
                self.redis.stop()
            if self.keep_data:
                kept = LOGS / f"{self.prefix}-redis-data"
                shutil.move(self.aof_dir, kept)
                print(f"Redis's append-only file kept in {kept} (redis-server --dir {kept} --appendonly yes)")
            else:
                shutil.rmtree(self.aof_dir, ignore_errors=True)

    async def run_fleet(self, url: str) -> int:
        self.workers = [self.start_worker(slot) for slot in range(len(SLOTS))]
        await testing.wait_for_workers(url, self.prefix, len(SLOTS))
        async with SmithClient.from_url(url, prefix=self.prefix, turn_ttl=self.turn_ttl) as client:
            self.client = client
            self.started = time.monotonic()
            self.header()
            async with asyncio.timeout(self.duration + self.args.drain + 600):  # a last-resort bound
                await self.soak()
            return await self.report()

    def stop_workers(self) -> None:
        """Stop every worker process started (idempotent)."""
        for proc in [*self.workers, *self.retired]:
            proc.stop()

    def header(self) -> None:
        a = self.args
        print(
            f"soak {a.minutes:g} min: {a.rate:g} turns/s to {a.conversations} conversations, 2 turn + 2 tool "
            f"workers, turn TTL {self.turn_ttl} s, history cap {a.history_max} messages, prefix {self.prefix}; "
            f"logs {LOGS}/{self.prefix}-*",
            flush=True,
        )
        plan = ", ".join(f"{fault} at {at:.0f} s" for at, fault in fault_schedule(self.duration) if fault != "kill")
        print(f"faults: kill -9 every {self.duration / KILLS:.0f} s, {plan}", flush=True)

    def start_worker(self, slot: int) -> ManagedProcess:
        name, queue = SLOTS[slot]
        return testing.start_workers(APP, self.env, [queue], f"{self.prefix}-{name}", log_dir=LOGS)[0]

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def soak(self) -> None:
        loops = [asyncio.create_task(loop()) for loop in (self.poll_loop, self.event_loop, self.sample_loop)]
        faults = asyncio.create_task(self.run_faults())
        try:
            await self.submit_loop(self.started + self.duration)
            await faults
            drain_started = time.monotonic()
            await self.drain()
            self.timeline.append(
                f"{self.elapsed():7.1f} s  drained in {time.monotonic() - drain_started:.1f} s, "
                f"{len(self.unfinished)} turns unfinished"
            )
        finally:
            for task in [*loops, faults, *self.tasks]:
                task.cancel()
            await asyncio.gather(*loops, faults, *self.tasks, return_exceptions=True)

    # -- submitting ------------------------------------------------------------------------------------------

    async def submit_loop(self, deadline: float) -> None:
        interval, next_at, n = 1.0 / self.args.rate, time.monotonic(), 0
        while (now := time.monotonic()) < deadline:
            if now < next_at:
                await asyncio.sleep(min(next_at, deadline) - now)
                continue
            next_at = max(next_at + interval, now - 1.0)  # after a stall, no burst of more than a second's worth
            idle = [c for c in self.conversations if c not in self.submitting]
            if len(self.unfinished) + len(self.submitting) >= self.args.max_in_flight or not idle:
                self.counts["ticks skipped (in-flight cap, or every conversation mid-submission)"] += 1
                continue
            n += 1
            kind = self.rng.choice(list(KINDS))
            turn = Turn(f"t{n:06d}", self.rng.choice(idle), KINDS[kind], time.monotonic())
            self.turns[turn.turn_id] = turn
            self.by_conversation[turn.conversation].append(turn)
            self.submitting.add(turn.conversation)
            self.spawn(self.submit(turn, kind))

    async def submit(self, turn: Turn, kind: str) -> None:
        prompt = f"{testing.scenario_marker(SCENARIO)} {kind} {turn.turn_id}"
        try:
            for _ in range(SUBMIT_TRIES):
                try:
                    await self.client.submit(
                        prompt, conversation_id=turn.conversation, agent=AGENT, turn_id=turn.turn_id
                    )
                    break
                except TransportError:
                    self.counts["submissions retried (Redis unreachable)"] += 1
                    await asyncio.sleep(1.0)
            else:
                turn.status = "unacknowledged"
                return
        except SmithError as exc:
            turn.status, turn.error_kind = "refused", exc.kind
            return
        finally:
            self.submitting.discard(turn.conversation)
        turn.status = record.QUEUED
        self.unfinished.add(turn.turn_id)
        draw = self.rng.random()
        if draw < self.args.cancel_share:
            self.spawn(self.cancel_later(turn))
        elif draw < self.args.cancel_share + self.args.follow_share:
            self.spawn(self.follow(turn))

    async def cancel_later(self, turn: Turn) -> None:
        await asyncio.sleep(self.rng.uniform(0.0, 1.0))
        try:
            self.counts[f"cancels answered {await self.client.turn(turn.turn_id).cancel()}"] += 1
        except TransportError:
            self.counts["cancels lost to an outage"] += 1

    async def follow(self, turn: Turn) -> None:
        """Follow the turn's events as a caller would, re-attaching after the last seq on TransportError."""
        seen: list[tuple[int, str]] = []
        limit = time.monotonic() + self.duration + self.args.drain
        self.counts["turns followed as streams"] += 1
        while (left := limit - time.monotonic()) > 0:
            try:
                async for event in self.client.turn(turn.turn_id).events(seen[-1][0] if seen else 0, timeout=left):
                    seen.append((event.seq, event.type))
                break
            except TransportError:
                self.counts["stream re-attaches"] += 1
                await asyncio.sleep(0.5)
            except SmithError as exc:
                self.follow_problems.append(f"{turn.turn_id}: following raised {exc.kind}: {exc}")
                return
        self.follow_problems += [f"{turn.turn_id}: {p}" for p in event_problems(seen, None, None)]

    # -- watching ----------------------------------------------------------------------------------------------

    async def poll_loop(self) -> None:
        while True:
            await asyncio.sleep(POLL_EVERY)
            ids = list(self.unfinished)
            try:
                states = await self.read_states(ids)
            except (RedisError, OSError):
                continue
            now = time.monotonic()
            for turn_id, (status, error) in zip(ids, states, strict=True):
                self.observe(self.turns[turn_id], status, error, now)

    async def read_states(self, ids: list[str]) -> list[tuple[str | None, bytes | None]]:
        out: list[tuple[str | None, bytes | None]] = []
        for start in range(0, len(ids), BATCH):
            async with self.client.redis.pipeline(transaction=False) as pipe:
                for turn_id in ids[start : start + BATCH]:
                    pipe.hmget(self.client.keys.turn_state(turn_id), [record.STATUS, record.ERROR])
                replies = await pipe.execute()
            out += [(status.decode() if status else None, error) for status, error in replies]
        return out

    def observe(self, turn: Turn, status: str | None, error: bytes | None, now: float) -> None:
        turn.status = status or "unknown"
        if not record.is_terminal(status):
            return
        turn.ended_at = now
        if error:
            turn.error_kind = str(orjson.loads(error).get("kind", "?"))
        self.unfinished.discard(turn.turn_id)
        self.finished += 1
        self.due.append((now + EVENT_CHECK_DELAY, turn.turn_id))

    async def event_loop(self) -> None:
        while True:
            await asyncio.sleep(POLL_EVERY)
            ready = []
            while self.due and self.due[0][0] <= time.monotonic():
                ready.append(self.due.popleft()[1])
            try:
                await self.check_events(ready)
            except (RedisError, OSError):
                self.due.extendleft((time.monotonic(), turn_id) for turn_id in reversed(ready))

    async def read_logs(self, ids: list[str]) -> list[tuple[list[tuple[int, str]], int | None]]:
        """Each turn's replay log as ``(seq, type)`` pairs and its seq counter (None when gone)."""
        out = []
        for start in range(0, len(ids), BATCH):
            async with self.client.redis.pipeline(transaction=False) as pipe:
                for turn_id in ids[start : start + BATCH]:
                    pipe.xrange(self.client.keys.turn_log(turn_id))
                    pipe.get(self.client.keys.turn_seq(turn_id))
                replies = await pipe.execute()
            for entries, counter in zip(replies[::2], replies[1::2], strict=True):
                events = [event_from_json(fields[b"e"]) for _, fields in entries]
                out.append(([(e.seq, e.type) for e in events], int(counter) if counter is not None else None))
        return out

    async def check_events(self, ids: list[str], only_live: bool = False) -> None:
        for turn_id, (events, counter) in zip(ids, await self.read_logs(ids), strict=True):
            if only_live and counter is None:
                continue  # expired since its first check: that verdict stands
            problems = event_problems(events, counter, self.turns[turn_id].status)
            self.event_verdicts[turn_id] = ["replay log gone"] if counter is None and not events else problems
            if problems and turn_id not in self.evidence:  # the keys expire long before the summary
                self.evidence[turn_id] = await self.evidence_of(turn_id, events)

    async def evidence_of(self, turn_id: str, events: list[tuple[int, str]]) -> str:
        """A turn's state hash (without its job payload) and its event types, as they are when a check fails."""
        state = record.decode_state(await self.client.redis.hgetall(self.client.keys.turn_state(turn_id)))
        state.pop(record.JOB, None)
        return f"state {state or 'gone'}; events {[kind for _, kind in events]}"

    async def sample_loop(self) -> None:
        while True:
            self.sample()
            if self.llm.handler_errors:
                self.handler_errors += len(self.llm.handler_errors)
                print(f"scripted server handler error: {self.llm.handler_errors[0]!r}", flush=True)
            self.llm.reset()  # the recorded requests (each with its history) would grow this process
            try:
                info = await self.client.redis.info("memory")
                self.samples["redis used_memory"].append((self.elapsed(), self.finished, info["used_memory"] / MIB))
            except (RedisError, OSError):
                pass
            if len(self.samples["redis used_memory"]) % 6 == 1:
                self.progress()
            await asyncio.sleep(SAMPLE_EVERY)

    def sample(self) -> None:
        """One RSS sample per worker; a worker that exited by itself is noted and restarted, as a supervisor would."""
        for slot, proc in enumerate(self.workers):
            if not proc.alive():
                self.retired.append(proc)
                self.workers[slot] = self.start_worker(slot)
                line = (
                    f"{self.elapsed():7.1f} s  {SLOTS[slot][0]} (pid {proc.pid}) EXITED by itself "
                    f"(code {proc.stop()}); restarted as pid {self.workers[slot].pid}"
                )
                self.timeline.append(line)
                print(line, flush=True)
                continue
            try:
                mib = rss_mib(proc.pid)
            except OSError:  # exited since the check
                continue
            self.samples[f"{SLOTS[slot][0]} pid {proc.pid}"].append((self.elapsed(), self.finished, mib))

    def progress(self) -> None:
        redis = self.samples["redis used_memory"]
        print(
            f"{self.elapsed():7.1f} s  {len(self.turns)} submitted, {self.finished} finished, "
            f"{len(self.unfinished)} unfinished; Redis {redis[-1][2] if redis else float('nan'):.1f} MiB",
            flush=True,
        )

    # -- faults ------------------------------------------------------------------------------------------------

    async def run_faults(self) -> None:
        actions = {"kill": self.kill_worker, "redis-restart": self.restart_redis, "redis-stop": self.freeze_redis}
        for at, fault in fault_schedule(self.duration):
            await asyncio.sleep(max(0.0, self.started + at - time.monotonic()))
            begun = self.elapsed()
            line = f"{begun:7.1f} s  {await actions[fault]()}"
            self.timeline.append(line)
            print(line, flush=True)

    async def kill_worker(self) -> str:
        slot, self.kills = self.kills % len(SLOTS), self.kills + 1
        victim = self.workers[slot]
        victim.signal(signal.SIGKILL)
        victim.stop()  # reaps it (and kills what it left in its process group)
        self.retired.append(victim)
        self.workers[slot] = self.start_worker(slot)
        restarted = time.monotonic()
        try:
            await registered(self.client, self.workers[slot].pid)
            took = f"registered after {time.monotonic() - restarted:.1f} s"
        except (TimeoutError, SmithError, RedisError) as exc:
            took = f"NOT registered ({type(exc).__name__})"
        return f"kill -9 {SLOTS[slot][0]} (pid {victim.pid}); restarted as pid {self.workers[slot].pid}, {took}"

    async def restart_redis(self) -> str:
        assert self.redis is not None
        self.redis.signal(signal.SIGKILL)
        self.redis.stop()
        await asyncio.sleep(REDIS_DOWN_SECONDS)
        begun = time.monotonic()
        self.redis, _ = await asyncio.to_thread(start_redis_server, self.port, self.redis_log, aof_dir=self.aof_dir)
        took = time.monotonic() - begun
        try:
            loaded = f"{await self.client.redis.dbsize()} keys"
        except (RedisError, OSError):
            loaded = "keys not counted"
        return (
            f"Redis kill -9, down {REDIS_DOWN_SECONDS:g} s, restarted on its append-only file in {took:.1f} s "
            f"({loaded})"
        )

    async def freeze_redis(self) -> str:
        assert self.redis is not None
        self.redis.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(FREEZE_SECONDS)
        finally:
            self.redis.signal(signal.SIGCONT)
        return f"Redis SIGSTOP for {FREEZE_SECONDS:g} s, then SIGCONT"

    async def drain(self) -> None:
        limit = time.monotonic() + self.args.drain
        # polled: the sets change in several places, and the wait is bounded either way
        while (self.unfinished or self.submitting) and time.monotonic() < limit:  # noqa: ASYNC110
            await asyncio.sleep(1.0)
        await asyncio.sleep(EVENT_CHECK_DELAY + 2 * POLL_EVERY)  # the last logs come due and are read
        if self.tasks:  # followers and cancels end with their turns; a stuck one is reported, not awaited forever
            await asyncio.wait(self.tasks, timeout=max(1.0, limit - time.monotonic()))

    # -- the report --------------------------------------------------------------------------------------------

    async def report(self) -> int:
        changed = await self.recheck_states()
        # read every terminal turn's log once more, while it lives: a late extra event shows now
        terminal = [t.turn_id for t in self.turns.values() if record.is_terminal(t.status)]
        await self.check_events(terminal, only_live=True)
        records = await self.client.redis.lrange(effects_key(self.prefix), 0, -1)
        dupes = duplicated(records)
        histories = {
            c: history_problems(await self.client.history(c), self.by_conversation[c]) for c in self.conversations
        }
        no_ttl = await keys_without_ttl(self.client.redis, self.client.keys)
        owned = await owned_keys_without_ttl(self.client.redis, self.client.keys)

        turns = list(self.turns.values())
        statuses = collections.Counter(t.status for t in turns)
        failed = collections.Counter(t.error_kind for t in turns if t.status == record.FAILED)
        stuck = [t for t in turns if t.status in (record.QUEUED, record.RUNNING, "unknown", "submitting")]
        never = [t for t in turns if t.status in ("unacknowledged", "refused")]
        gaps = {t: p for t, p in self.event_verdicts.items() if p}
        unchecked = [t.turn_id for t in turns if record.is_terminal(t.status) and t.turn_id not in self.event_verdicts]
        bad_histories = {c: p for c, p in histories.items() if p}
        latencies = [t.ended_at - t.submitted_at for t in turns if t.ended_at is not None]

        print("\n== soak summary")
        for line in self.timeline:
            print(line)
        print(
            f"turns: {len(turns)} submitted ({self.args.rate:g}/s asked, {len(turns) / self.duration:.1f}/s done), "
            f"{statuses[record.COMPLETED]} completed, {statuses[record.CANCELLED]} cancelled, "
            f"{statuses[record.FAILED]} failed {dict(failed) or ''}"
        )
        if latencies:
            p50, p99 = statistics.median(latencies), pct(latencies, 0.99)
            print(f"submit → terminal seen: p50 {p50:.2f} s, p99 {p99:.2f} s, max {max(latencies):.1f} s")
        print("client side: " + ", ".join(f"{name} {n}" for name, n in sorted(self.counts.items())))
        checks = [
            ("non-terminal turns (queued, running, state gone)", stuck),
            ("turns never acknowledged or refused at submission", never),
            ("turns whose final state changed afterwards", changed),
            ("duplicated side effects (labels run twice or more)", dupes),
            ("event gaps in replay logs", gaps),
            ("terminal turns whose log was never read", unchecked),
            (f"event gaps in followed streams (of {self.counts['turns followed as streams']})", self.follow_problems),
            (f"conversations with an ill-formed history (of {len(self.conversations)})", bad_histories),
            ("keys without TTL (and no documented owner)", no_ttl),
            ("scripted-server handler errors", range(self.handler_errors)),
        ]
        print(f"\n{'check':<62} {'found':>6}  want")
        for name, found in checks:
            print(f"{name:<62} {len(found):>6}  0  {'ok' if not found else 'FAIL'}")
        print(f"owned keys without TTL (documented owners): {await self.describe_queues(sorted(owned))}")
        self.print_slopes()
        self.print_details(stuck, never, changed, dupes, gaps, bad_histories, no_ttl)
        for turn in stuck[:DIAGNOSED]:
            for line in await self.diagnose(turn):
                print("  " + line)
        self.keep_data = any(found for _, found in checks)
        return 1 if self.keep_data else 0

    async def diagnose(self, turn: Turn) -> list[str]:
        """Where a non-terminal turn is stuck: its state, lease, jobs, and its conversation's FIFO."""
        keys, redis, now = self.client.keys, self.client.redis, time.time()
        state = record.decode_state(await redis.hgetall(keys.turn_state(turn.turn_id)))
        state.pop(record.JOB, None)
        if record.LEASE_UNTIL in state:
            state[record.LEASE_UNTIL] += f" (in {int(state[record.LEASE_UNTIL]) / 1000 - now:+.0f} s)"
        job = keys.turn_job_id(turn.turn_id)
        queued = [m.decode() for m in await redis.zrange(keys.turns_queue, 0, -1)]
        queued = [m for m in queued if m == job or m.startswith(job + "#")]
        running = [k.decode() async for k in redis.scan_iter(match=keys.arq_in_progress(job) + "*", count=1000)]
        fifo = [t.decode() for t in await redis.lrange(keys.conversation_turns(turn.conversation), 0, 4)]
        statuses = record.decode_state(await redis.hgetall(keys.conversation_statuses(turn.conversation)))
        earlier = [t for t in self.by_conversation[turn.conversation] if t.submitted_at < turn.submitted_at][-3:]
        return [
            f"{turn.turn_id} ({turn.conversation}, submitted at {turn.submitted_at - self.started:.1f} s): "
            f"state {state or 'gone'}",
            f"    running-ZSET lease {await redis.zscore(keys.running, turn.turn_id)}, queued jobs {queued}, "
            f"arq in-progress keys {running}",
            f"    conversation FIFO {fifo}, statuses {statuses}, "
            f"earlier turns {[(t.turn_id, t.status) for t in earlier]}",
        ]

    async def describe_queues(self, queues: list[str]) -> str:
        """Each arq queue left after the drain, with its job count and its first job ids (deferred re-checks
        are expected; a job of a finished turn is not)."""
        parts = []
        for queue in queues:
            jobs = [job.decode() for job in await self.client.redis.zrange(queue, 0, -1)]
            parts.append(f"{queue} ({len(jobs)} jobs: {', '.join(jobs[:5])}{' …' if len(jobs) > 5 else ''})")
        return "; ".join(parts) or "none"

    async def recheck_states(self) -> list[str]:
        """Terminal turns whose state, still in Redis, now says something else (a final state must not move)."""
        done = [t for t in self.turns.values() if record.is_terminal(t.status)]
        states = await self.read_states([t.turn_id for t in done])
        return [
            f"{t.turn_id}: {t.status} → {status}"
            for t, (status, _) in zip(done, states, strict=True)
            if status is not None and status != t.status
        ]

    def print_slopes(self) -> None:
        """First and last MiB of each series, and its slopes without its first :data:`WARM_UP` seconds."""
        half = self.duration / 2
        print(
            f"\n{'MiB per 1000 finished turns':<28} {'samples':>7} {'first':>8} {'last':>8} {'slope':>8} "
            f"{'2nd half':>8}"
        )
        for name, samples in self.samples.items():
            if not samples:
                continue
            warm = samples[0][0] + WARM_UP
            during = [(turns, mib) for at, turns, mib in samples if warm <= at <= self.duration]
            late = [(turns, mib) for at, turns, mib in samples if max(warm, half) <= at <= self.duration]
            print(
                f"{name:<28} {len(samples):>7} {samples[0][2]:>8.1f} {samples[-1][2]:>8.1f} "
                f"{fmt(slope_per_1000(during)):>8} {fmt(slope_per_1000(late)):>8}"
            )

    def print_details(
        self,
        stuck: list[Turn],
        never: list[Turn],
        changed: list[str],
        dupes: dict[str, list[str]],
        gaps: dict[str, list[str]],
        histories: dict[str, list[str]],
        no_ttl: list[str],
    ) -> None:
        lines = [f"non-terminal {t.turn_id} ({t.conversation}, {t.calls} calls): {t.status}" for t in stuck]
        lines += [f"not submitted {t.turn_id}: {t.status} {t.error_kind}" for t in never]
        lines += [f"state changed {c}" for c in changed]
        lines += [f"duplicated {label}: run by {workers}" for label, workers in dupes.items()]
        lines += [f"events {turn_id}: {'; '.join(p)} ({self.evidence.get(turn_id, '')})" for turn_id, p in gaps.items()]
        lines += [f"stream {p}" for p in self.follow_problems]
        lines += [f"history {c}: {p}" for c, problems in histories.items() for p in problems]
        lines += [f"no TTL {key}" for key in no_ttl]
        if lines:
            print(f"\nproblems ({len(lines)}; the first 40):")
            for line in lines[:40]:
                print("  " + line)


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long turns are submitted (faults included)")
    parser.add_argument("--rate", type=float, default=10.0, help="turns submitted per second")
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--max-in-flight", type=int, default=500, help="unfinished turns above which a tick is skipped")
    parser.add_argument("--drain", type=float, default=300.0, help="longest wait for the last turns, seconds")
    parser.add_argument(
        "--turn-ttl", type=int, default=0, help="SMITH_TURN_TTL; default a quarter of the run, at least 300 s"
    )
    parser.add_argument("--history-max", type=int, default=100, help="SMITH_HISTORY_MAX_MESSAGES")
    parser.add_argument("--cancel-share", type=float, default=0.02, help="share of turns cancelled by the caller")
    parser.add_argument("--follow-share", type=float, default=0.1, help="share of turns followed as event streams")
    parser.add_argument("--seed", type=int, default=26)
    sys.exit(asyncio.run(Soak(parser.parse_args()).run()))


if __name__ == "__main__":
    main()
