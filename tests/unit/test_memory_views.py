"""Memory strategies against a real Redis (the session's private redis-server), without workers:
window limits, the current turn, summaries and their coverage, trimming and absolute positions."""

from __future__ import annotations

import math
import uuid

import orjson
import pytest
import redis.asyncio as aioredis

from smith_client.errors import ConfigurationError, ContextOverflowError
from smith_client.events import MEMORY_SUMMARY_FAILED, EventData
from smith_client.keys import Keys
from smith_client.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage, message_to_json
from smith_client.roundtrip import RoundTrip
from smith_worker import FullMemory, RollingWindowMemory, SummaryMemory
from smith_worker.memory import MemoryContext, is_well_formed, wire_size
from smith_worker.memory.history import ConversationStore
from smith_worker.memory.pairing import REPAIR_SCAN, pending_repair
from smith_worker.memory.summary import SUMMARY_HEADING, SUMMARY_SAVE
from smith_worker.turn.attempt import TurnAttempt


@pytest.fixture
async def redis(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def tool_turn(n: int, calls: int = 2, text: str = "") -> list:
    ids = [f"t{n}_{i}" for i in range(calls)]
    return [
        UserMessage(content=f"turn {n} {text}"),
        AssistantMessage(tool_calls=[ToolCall(id=i, name="add", arguments={"a": n, "b": k}) for k, i in enumerate(ids)]),
        *[ToolMessage(tool_call_id=i, name="add", content=str(n + k)) for k, i in enumerate(ids)],
        AssistantMessage(content=f"answer {n}"),
    ]


def text_turn(n: int, text: str = "") -> list:
    return [UserMessage(content=f"turn {n} {text}"), AssistantMessage(content=f"answer {n}")]


class Convo:
    """One conversation in Redis plus a MemoryContext on it; `summaries` records summary requests."""

    def __init__(self, redis, keys: Keys) -> None:
        self.redis, self.keys, self.cid = redis, keys, f"c{uuid.uuid4().hex[:8]}"
        self.store = ConversationStore(redis, keys, self.cid)
        self.summaries: list[list] = []
        self.events: list[tuple[str, dict]] = []
        self.fail_summaries = False

    async def push(self, messages: list) -> int:
        """Append messages; returns the position of the first."""
        n = await self.redis.rpush(self.keys.history(self.cid), *[message_to_json(m) for m in messages])
        return n - len(messages)

    async def summarize(self, request: list) -> str:
        self.summaries.append(request)
        if self.fail_summaries:
            raise RuntimeError("summary server down")
        return f"summary #{len(self.summaries)}"

    async def publish(self, data: EventData) -> int:
        self.events.append((data.event_type, data.to_wire()))
        return len(self.events)

    def ctx(self, turn_start: int) -> MemoryContext:
        return MemoryContext(store=self.store, turn_start=turn_start, summarize=self.summarize, publish=self.publish,
                             redis=self.redis, keys=self.keys, conversation_id=self.cid)


async def read_tail(store: ConversationStore, redis) -> object:
    """The history's last REPAIR_SCAN messages, read as a turn's start reads them (queued on a pipeline)."""
    rt = RoundTrip()
    tail = store.queue_tail(rt, REPAIR_SCAN)
    await rt.run(redis)
    return tail.value


async def append_user(attempt, redis, message, repair=None) -> int:
    """The turn's user message appended alone; its absolute position."""
    rt = RoundTrip()
    position = attempt.queue_append_user(rt, message, repair)
    await rt.run(redis)
    return position.value


@pytest.fixture
def convo(redis):
    return Convo(redis, Keys(f"u{uuid.uuid4().hex[:6]}"))


def within(view: list, memory: RollingWindowMemory) -> bool:
    size = sum(map(wire_size, view))
    return ((memory.max_messages is None or len(view) <= memory.max_messages)
            and (memory.max_chars is None or size <= memory.max_chars)
            and (memory.max_tokens is None or math.ceil(size / 4) <= memory.max_tokens))


@pytest.mark.parametrize("limits", [{"max_messages": 7}, {"max_chars": 900}, {"max_tokens": 200},
                                    {"max_messages": 9, "max_chars": 1500, "max_tokens": 300}])
async def test_window_keeps_the_newest_whole_groups_within_every_limit(convo, limits):
    memory = RollingWindowMemory(**limits)
    history = []
    for n in range(30):
        history += tool_turn(n, calls=1 + n % 3) if n % 2 else text_turn(n, "x" * (n * 7))
    await convo.push(history)
    start = max(i for i, m in enumerate(history) if isinstance(m, UserMessage))
    view = await memory.view(convo.ctx(start))
    assert within(view, memory) and is_well_formed(view)
    assert isinstance(view[0], UserMessage)
    assert view == history[len(history) - len(view):]  # a suffix: nothing from the middle is skipped
    # the next older user message would not have fitted: the window is as large as the limits allow
    earlier = max(i for i, m in enumerate(history[:len(history) - len(view)]) if isinstance(m, UserMessage))
    assert not within(history[earlier:], memory)


class CountingRedis:
    """A Redis client counting the bytes of the stored messages its history reads (EVALSHA) returned."""

    def __init__(self, redis) -> None:
        self.redis, self.bytes_read = redis, 0

    def __getattr__(self, name: str):
        return getattr(self.redis, name)

    async def evalsha(self, *args):
        reply = await self.redis.evalsha(*args)
        self.bytes_read += sum(len(item) for item in reply[3] or [])
        return reply


async def test_window_reads_only_its_pages_not_the_whole_history(convo):
    history = []
    for n in range(1500):
        history += tool_turn(n)
    await convo.push(history)  # 7 500 messages
    total = sum(len(message_to_json(m)) for m in history)
    counting = CountingRedis(convo.redis)
    convo.store = ConversationStore(counting, convo.keys, convo.cid)
    view = await RollingWindowMemory(max_messages=20).view(convo.ctx(len(history) - 5))
    assert len(view) <= 20
    assert 0 < counting.bytes_read < total / 100


async def test_window_raises_context_overflow_when_the_turn_alone_is_too_big(convo):
    await convo.push(text_turn(0))
    start = await convo.push([UserMessage(content="y" * 500)])
    with pytest.raises(ContextOverflowError) as raised:
        await RollingWindowMemory(max_tokens=50).view(convo.ctx(start))
    assert raised.value.limit == "max_tokens" and raised.value.budget == 50 and raised.value.size > 50
    # the current turn is always kept, even when older messages must all go
    assert await RollingWindowMemory(max_messages=1).view(convo.ctx(start)) == [UserMessage(content="y" * 500)]


@pytest.mark.parametrize("bad", [{}, {"max_messages": 0}, {"max_chars": -1}, {"max_tokens": 1.5},
                                 {"max_messages": True}])
def test_window_refuses_bad_limits(bad):
    with pytest.raises(ConfigurationError):
        RollingWindowMemory(**bad)


@pytest.mark.parametrize("bad", [{"threshold": 1}, {"keep_recent": -1}, {"threshold": 10, "keep_recent": 10},
                                 {"window": "x"}])
def test_summary_refuses_bad_settings(bad):
    with pytest.raises(ConfigurationError):
        SummaryMemory(**bad)


async def test_summary_is_made_once_per_crossing_and_covers_the_old_summary(convo):
    memory = SummaryMemory(threshold=12, keep_recent=4)
    history: list = []
    views = []
    for n in range(12):
        turn = tool_turn(n)
        start = len(history)
        history += turn
        await convo.push(turn[:1])
        for step, message in enumerate(turn[1:]):  # one view per model call: before each assistant message
            if isinstance(message, AssistantMessage):
                views.append(await memory.view(convo.ctx(start)))
            await convo.push([message])
    assert all(len(v) <= 12 and is_well_formed(v) for v in views)
    summarised = [v for v in views if isinstance(v[0], SystemMessage)]
    assert summarised and all(v[0].content.startswith(SUMMARY_HEADING) for v in summarised)
    # each crossing summarises once: consecutive summaries are at least threshold - keep_recent - 1 messages apart
    assert 3 <= len(convo.summaries) < len(views) / 3
    # a later summary request carries the previous summary, not the old messages again
    later = convo.summaries[-1][1].content
    assert later.startswith(f"Summary so far:\nsummary #{len(convo.summaries) - 1}")
    assert "turn 0 " not in later
    text, covers = await convo.redis.hmget(convo.keys.conversation_summary(convo.cid), "text", "covers")
    assert text.decode() == f"summary #{len(convo.summaries)}"
    assert not isinstance(history[int(covers)], ToolMessage)  # coverage ends at a group boundary
    assert 0 < await convo.redis.ttl(convo.keys.conversation_summary(convo.cid)) <= 30 * 24 * 3600


async def test_failed_summary_falls_back_to_the_window_and_publishes_an_event(convo, caplog):
    caplog.set_level("WARNING", logger="agent_smith.agent")
    memory = SummaryMemory(threshold=8, keep_recent=3)
    history = []
    for n in range(4):
        history += tool_turn(n)
    await convo.push(history)
    convo.fail_summaries = True
    start = len(history) - 5
    view = await memory.view(convo.ctx(start))
    assert view == history[-5:]  # RollingWindowMemory(max_messages=8), from a user message
    assert [t for t, _ in convo.events] == [MEMORY_SUMMARY_FAILED]
    assert convo.events[0][1]["error"]["kind"] == "InternalError"
    assert any("summary call failed" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    assert await convo.redis.exists(convo.keys.conversation_summary(convo.cid)) == 0


async def test_full_memory_and_a_dangling_call_of_an_earlier_turn(convo):
    history = tool_turn(0)[:2] + [UserMessage(content="merged while it failed")]  # a failed turn, then a merge
    await convo.push(history)
    view = await FullMemory().view(convo.ctx(len(history)))
    assert is_well_formed(view) and len(view) == 5 and isinstance(view[2], ToolMessage)
    repair = pending_repair(await read_tail(convo.store, convo.redis))
    assert repair.position == 2 and repair.end == 3 and [m.tool_call_id for m in repair.messages] == ["t0_0", "t0_1"]


async def test_trimming_keeps_whole_groups_and_positions_stay_absolute(convo):
    """TurnAttempt's appends trim to history_max; a repair is inserted with the user message."""
    keys, cid = convo.keys, convo.cid
    await convo.redis.hset(keys.turn_state("t1"), mapping={"attempt": 1, "status": "running"})
    await convo.redis.expire(keys.turn_state("t1"), 60)
    attempt = TurnAttempt(convo.redis, keys, "t1", cid, "w", history_max=10)
    attempt.attempt = 1
    appended = []
    for n in range(8):
        appended += tool_turn(n, calls=3)  # 6 messages a turn
        await attempt.append(*tool_turn(n, calls=3))
    stored = await convo.store.read(0)
    assert len(stored.messages) <= 10 and not isinstance(stored.messages[0], ToolMessage)
    assert stored.stored_first + len(stored.messages) == stored.end == len(appended)
    assert stored.messages == appended[stored.stored_first:]
    # reads by absolute position survive the trimming
    assert (await convo.store.read(len(appended) - 3)).messages == appended[-3:]
    # a dangling call of the last turn is answered right after it, atomically with the next user message
    await attempt.append(UserMessage(content="q"), AssistantMessage(tool_calls=[ToolCall(id="d", name="add")]))
    repair = pending_repair(await read_tail(convo.store, convo.redis))
    position = await append_user(attempt, convo.redis, UserMessage(content="next"), repair)
    tail = (await convo.store.read(position - 3)).messages
    assert [m.role for m in tail] == ["user", "assistant", "tool", "user"]
    assert tail[2].tool_call_id == "d" and orjson.loads(tail[2].content)["error"] is True
    assert position == len(appended) + 3
    assert 0 < await convo.redis.ttl(keys.history_trimmed(cid)) <= 30 * 24 * 3600


async def test_conversations_never_see_each_others_summary_and_a_summary_only_moves_forward(redis):
    keys = Keys(f"u{uuid.uuid4().hex[:6]}")
    a, b = Convo(redis, keys), Convo(redis, keys)
    memory = SummaryMemory(threshold=6, keep_recent=2)
    history = tool_turn(0) + tool_turn(1)
    for convo in (a, b):
        await convo.push(history)
    view_a = await memory.view(a.ctx(5))
    assert isinstance(view_a[0], SystemMessage) and len(a.summaries) == 1
    view_b = await memory.view(b.ctx(5))  # b summarises its own messages, not a's summary
    assert len(b.summaries) == 1 and "Summary so far" not in b.summaries[0][1].content
    summary_a = await redis.hgetall(keys.conversation_summary(a.cid))
    # a stale attempt writing an older summary later does not replace the newer one
    assert await SUMMARY_SAVE(redis, [keys.conversation_summary(a.cid)], ["stale", 1, 60]) == 0
    assert await redis.hgetall(keys.conversation_summary(a.cid)) == summary_a
    assert view_b[0] == view_a[0]  # same wording of the first summary, in each conversation's own key


async def test_window_reads_further_pages_until_a_limit_or_the_oldest_message(convo):
    history = []
    for n in range(60):
        history += tool_turn(n)  # 300 messages: the 64-message pages must be read back to the start
    await convo.push(history)
    start = len(history) - 5
    assert await RollingWindowMemory(max_chars=10_000_000).view(convo.ctx(start)) == history
    view = await RollingWindowMemory(max_chars=20_000).view(convo.ctx(start))
    assert 64 < len(view) < len(history) and view == history[-len(view):]
    assert isinstance(view[0], UserMessage) and sum(map(wire_size, view)) <= 20_000


async def test_an_attempt_whose_own_writes_were_lost_writes_nothing_after_the_gap(convo):
    """A failover to a replica that missed the attempt's last append: the next append is refused
    (StaleAttemptError), so no tool message lands after a history without its assistant message."""
    from smith_worker.memory.fencing import StaleAttemptError

    keys, cid = convo.keys, convo.cid
    await convo.redis.hset(keys.turn_state("t2"), mapping={"attempt": 1, "status": "running"})
    await convo.redis.expire(keys.turn_state("t2"), 60)
    attempt = TurnAttempt(convo.redis, keys, "t2", cid, "w")
    attempt.attempt = 1
    position = await append_user(attempt, convo.redis, UserMessage(content="q"))
    await attempt.append(AssistantMessage(tool_calls=[ToolCall(id="a", name="add")]))
    assert (position, attempt.history_end) == (0, 2)
    await convo.redis.rpop(keys.history(cid))  # the lost write
    with pytest.raises(StaleAttemptError):
        await attempt.append(ToolMessage(tool_call_id="a", name="add", content="3"))
    assert [m.role for m in (await convo.store.read(0)).messages] == ["user"]


async def test_a_read_finding_the_attempts_own_writes_lost_is_fenced_off(convo):
    """The prompt is never built from a history missing the attempt's writes: the store's read refuses it."""
    from smith_worker.memory.fencing import StaleAttemptError

    await convo.push([UserMessage(content="q"), AssistantMessage(content="a")])
    ends = [2]
    store = ConversationStore(convo.redis, convo.keys, convo.cid, expected_end=lambda: ends[0])
    assert len((await store.read(0)).messages) == 2
    await convo.redis.rpop(convo.keys.history(convo.cid))  # a failover lost the attempt's last append
    with pytest.raises(StaleAttemptError):
        await store.read(0)
    ends[0] = None  # no attempt's writes to check (before its user message is in)
    assert len((await store.read(0)).messages) == 1


@pytest.mark.parametrize("memory", [FullMemory(), RollingWindowMemory(max_messages=6)], ids=repr)
async def test_a_prefetched_view_is_the_same_view_and_reads_nothing_more(convo, memory):
    """A strategy's first read sent ahead with the step's other reads (Memory.prefetch): its view is the one
    it computes alone, and computing it sends no further history read."""
    history = [*tool_turn(0), *text_turn(1), *tool_turn(2)]
    await convo.push([*history, UserMessage(content="now")])
    alone = await memory.view(convo.ctx(len(history)))
    counting = CountingRedis(convo.redis)
    convo.store = ConversationStore(counting, convo.keys, convo.cid)
    rt = RoundTrip()
    step = memory.prefetch(convo.ctx(len(history)), rt)
    await rt.run(convo.redis)
    assert await memory.view(step) == alone
    assert counting.bytes_read == 0
    assert (await step.store.read(0)).messages  # served once; a second read goes to Redis
    assert counting.bytes_read > 0
