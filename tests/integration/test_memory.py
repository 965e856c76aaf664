"""Memory end to end: memory strategies keep long conversations inside the context window, on any
turn worker, and the history stays complete and well-formed.

SmithClient → Redis → real turn workers (the session's pair plus a second turn worker for this
module) → the scripted chat-completions server, which records every request it receives.
"""

from __future__ import annotations

import math
import threading

import orjson
import pytest

from smith_client import AgentUsage, ContextOverflowError, ConversationBusyError, SyncSmithClient
from smith_client.messages import AssistantMessage, ToolMessage
from smith_worker.memory.summary import DEFAULT_SUMMARY_PROMPT, SUMMARY_HEADING
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS
from tests.integration.test_turns import collect, of_type
from tests.support.app import SUMMARY, WINDOW

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]

#: (kind, messages it adds): a text turn, and tool turns with two and three parallel calls.
PATTERN = [("tools2", 5), ("text", 2), ("tools3", 6), ("text", 2)]


@pytest.fixture(scope="module")
async def second_turn_worker(workers, redis_url, prefix, scripted_llm):
    """Another turn worker of the session's prefix, so consecutive turns land on two workers."""
    env = worker_env(redis_url, prefix, scripted_llm.base_url)
    procs = start_workers("tests.support.app:app", env, ["turns"], f"{prefix}-memory", log_dir=LOGS)
    try:
        await wait_for_workers(redis_url, prefix, len(workers) + 1)
        yield procs[0]
    finally:
        procs[0].stop()


def register(scenario, scripted_llm, make_handler, **options) -> tuple[str, str]:
    """A scenario whose handler needs its own marker (summaries repeat it, so they route like the turns)."""
    key, marker = scenario(Reply.text("unused"))
    scripted_llm.add_scenario(key, make_handler(marker, **options))
    return key, marker


def is_summary_request(request) -> bool:
    messages = request.messages
    return bool(messages) and messages[0].get("content") == DEFAULT_SUMMARY_PROMPT


def handler(marker: str, fail_summaries: bool = False):
    """Answers by the last user message's kind; summary requests get a summary (or HTTP 500)."""
    summaries = iter(range(1, 10_000))

    def answer(request):
        if is_summary_request(request):
            return Reply.error(500) if fail_summaries else Reply.text(f"{marker} summary {next(summaries)}")
        last_user = [m for m in request.messages if m.get("role") == "user"][-1]["content"]
        calls = 3 if "tools3" in last_user else 2 if "tools2" in last_user else 0
        if calls and request.step == 0:
            return Reply.tool_calls([("add", {"a": i, "b": 10 * i}) for i in range(calls)])
        return Reply.text("done " + "z" * (len(last_user) % 90))

    return answer


def turn_texts(marker: str, messages: int) -> list[str]:
    """User messages of a conversation that reaches exactly ``messages`` stored messages."""
    texts, total, n = [], 0, 0
    while total < messages:
        kind, size = PATTERN[n % len(PATTERN)]
        if total + size > messages:
            kind, size = "text", 2
        texts.append(f"{marker} {kind} #{n} " + "pad " * (n * 7 % 60))
        total, n = total + size, n + 1
    assert total == messages
    return texts


def wire_problems(messages: list[dict]) -> list[str]:
    """Pairing problems as a provider reports them (HTTP 400): orphan tool messages, unanswered calls."""
    problems, open_calls = [], None
    for index, message in enumerate([*messages, {"role": "user"}]):
        if message["role"] == "tool":
            if open_calls is None or message["tool_call_id"] not in open_calls:
                problems.append(f"orphan tool message at {index}")
            else:
                open_calls.remove(message["tool_call_id"])
            continue
        if open_calls:
            problems.append(f"unanswered calls {open_calls} before {index}")
        open_calls = [c["id"] for c in message.get("tool_calls", [])] if message["role"] == "assistant" else None
    return problems


def model_views(scripted_llm, key: str) -> list[list[dict]]:
    """The messages of every agent request (summary requests left out), the agent's system prompt dropped."""
    views = []
    for request in scripted_llm.requests_for(key):
        if not is_summary_request(request):
            assert request.messages[0]["role"] == "system"
            views.append(request.messages[1:])
    return views


async def run_conversation(client, key: str, marker: str, agent: str, messages: int = 200) -> list[str]:
    """Send the conversation's turns one after another; returns their turn ids."""
    conversation, turn_ids = f"conv-{key}", []
    for n, text in enumerate(turn_texts(marker, messages)):
        turn_ids.append(f"{key}-{n}")
        await client.send(text, conversation_id=conversation, agent=agent, turn_id=turn_ids[-1], timeout=60)
    return turn_ids


@pytest.mark.parametrize("agent", ["full", "windowed", "summarised"])
async def test_200_messages_every_request_respects_the_limits_and_the_pairing(
    client, scenario, scripted_llm, second_turn_worker, agent
):
    key, marker = register(scenario, scripted_llm, handler)
    await run_conversation(client, key, marker, agent)

    history = await client.history(f"conv-{key}")
    assert len(history) == 200  # the stored history stays complete
    tool_turns = sum("tools" in text for text in turn_texts(marker, 200))
    assert sum(len(m.tool_calls) > 1 for m in history if isinstance(m, AssistantMessage)) == tool_turns > 20
    views = model_views(scripted_llm, key)
    assert len(views) == sum(isinstance(m, AssistantMessage) for m in history)
    for view in views:
        assert wire_problems(view) == []
    if agent == "full":
        assert len(views[-1]) == 199  # everything but the final answer: nothing was left out
    if agent == "windowed":
        for view in views:
            size = sum(len(orjson.dumps(m)) for m in view)  # UTF-8 bytes of the wire JSON
            assert len(view) <= WINDOW["max_messages"] and size <= WINDOW["max_chars"]
            assert math.ceil(size / 4) <= WINDOW["max_tokens"]
            assert view[0]["role"] == "user"
        assert max(len(v) for v in views) >= WINDOW["max_messages"] - 3  # the window is used, not just the turn
    if agent == "summarised":
        assert all(len(view) <= SUMMARY["threshold"] for view in views)
        with_summary = [v[0]["role"] == "system" and v[0]["content"].startswith(SUMMARY_HEADING) for v in views]
        first = with_summary.index(True)
        assert 0 < first and all(with_summary[first:])  # once summarised, every later view carries the summary


def expected_summaries(history: list, threshold: int, keep_recent: int) -> int:
    """The expected count: a summary call each time the view would exceed ``threshold`` messages,
    replayed over the stored history (one model call before each assistant message)."""
    covers, has_summary, count = 0, False, 0
    for end, message in enumerate(history):
        if not isinstance(message, AssistantMessage):
            continue
        if has_summary + end - covers > threshold:
            cut = end - keep_recent
            while isinstance(history[cut], ToolMessage):
                cut -= 1
            if cut > covers:
                covers, has_summary, count = cut, True, count + 1
    return count


async def test_summary_is_made_once_per_threshold_crossing_across_two_turn_workers(
    client, scenario, scripted_llm, second_turn_worker
):
    key, marker = register(scenario, scripted_llm, handler)
    counted = (await client.usage(agent="summarised")).get("summarised", AgentUsage())
    turn_ids = await run_conversation(client, key, marker, "summarised", messages=120)

    workers = [(await client.turn(t).state())["worker"] for t in turn_ids]
    assert len(set(workers)) == 2  # the turns ran on both turn workers
    assert any(a != b for a, b in zip(workers, workers[1:]))
    history = await client.history(f"conv-{key}")
    summary_requests = [r for r in scripted_llm.requests_for(key) if is_summary_request(r)]
    expected = expected_summaries(history, SUMMARY["threshold"], SUMMARY["keep_recent"])
    assert len(summary_requests) == expected and 5 <= expected < len(turn_ids) / 2
    assert all(r.body["stream"] is False for r in summary_requests)  # a non-streaming call
    # the summaries count in the agent's usage with its replies (docs/architecture.md, Token usage)
    used = (await client.usage(agent="summarised"))["summarised"]
    calls = len(scripted_llm.requests_for(key))
    assert (used.requests - counted.requests, used.prompt - counted.prompt) == (calls, 10 * calls)  # 10 per call
    # each new summary is built on the previous one, on whichever worker wrote it
    for number, request in enumerate(summary_requests[1:], start=1):
        assert request.messages[1]["content"].startswith(f"Summary so far:\n{marker} summary {number}\n")
    # memory state lives in Redis; clear() removes it with the messages
    summary_key = client.keys.conversation_summary(f"conv-{key}")
    assert (await client.redis.hget(summary_key, "text")).decode() == f"{marker} summary {expected}"
    await client.clear(f"conv-{key}")
    assert await client.history(f"conv-{key}") == [] and not await client.redis.exists(summary_key)


async def test_failed_summary_call_falls_back_to_the_window(client, scenario, scripted_llm):
    key, marker = register(scenario, scripted_llm, handler, fail_summaries=True)
    texts = turn_texts(marker, 30)
    conversation = f"conv-{key}"
    events = []
    for text in texts:
        events += await collect(client, text, conversation, agent="summarised", timeout=60)

    assert [e.type for e in events if e.terminal] == ["turn.completed"] * len(texts)
    failed = of_type(events, "memory.summary_failed")
    assert failed and failed[0].data["error"]["kind"] == "LlmApiError"
    assert failed[0].data["error"]["fields"]["http_status"] == 500
    views = model_views(scripted_llm, key)
    assert all(len(v) <= SUMMARY["threshold"] and wire_problems(v) == [] for v in views)
    assert max(len(v) for v in views) == SUMMARY["threshold"]  # RollingWindowMemory(max_messages=threshold)
    assert not await client.redis.exists(client.keys.conversation_summary(conversation))
    assert len(await client.history(conversation)) == 30


async def test_a_turn_too_big_for_the_window_fails_with_context_overflow_error(client, scenario, scripted_llm):
    key, marker = scenario(Reply.text("never"))
    with pytest.raises(ContextOverflowError) as raised:  # re-raised on the client as the same class
        await client.send(f"{marker} " + "x" * 3000, conversation_id=f"conv-{key}", agent="windowed", timeout=30)
    assert raised.value.limit == "max_chars" and raised.value.budget == WINDOW["max_chars"]
    assert raised.value.size > WINDOW["max_chars"]
    assert scripted_llm.requests_for(key) == []  # refused before the model call
    assert len(await client.history(f"conv-{key}")) == 1  # the user message is kept


async def test_a_turn_that_failed_after_its_model_asked_for_a_tool_leaves_a_repaired_history(
    client, scenario, scripted_llm
):
    def answer(request):
        last_user = [m for m in request.messages if m.get("role") == "user"][-1]["content"]
        return Reply.tool_calls([("brittle__probe", {}), ("add", {"a": 1, "b": 2})]) if "probe" in last_user \
            else Reply.text("fine")

    key, marker = scenario(answer)
    conversation = f"conv-{key}"
    first = await collect(client, f"{marker} probe", conversation, agent="brittle")
    assert first[-1].type == "turn.failed"  # the brittle source broke
    reply = await client.send(f"{marker} again", conversation_id=conversation, agent="brittle", timeout=30)
    assert reply.content == "fine"

    request = scripted_llm.requests_for(key)[-1].messages
    assert wire_problems(request) == []
    assert [m["role"] for m in request] == ["user", "assistant", "tool", "tool", "user"]
    history = await client.history(conversation)
    assert [m.role for m in history] == ["user", "assistant", "tool", "tool", "user", "assistant"]
    calls = history[1].tool_calls
    assert [m.tool_call_id for m in history[2:4]] == [call.id for call in calls]
    broken, add = history[2:4]
    assert broken.is_error and orjson.loads(broken.content)["error"] is True
    # `add` is dispatched beside the broken source's call: when its job ran before the turn failed, the
    # history keeps its real result; otherwise the repair answers it with an error
    assert (add.is_error and orjson.loads(add.content)["error"] is True) or (not add.is_error and add.content == "3")


async def test_clear_removes_the_conversation_and_refuses_while_a_turn_is_queued_or_running(
    client, scenario, scripted_llm
):
    gate = threading.Event()

    def answer(request):
        last_user = [m for m in request.messages if m.get("role") == "user"][-1]["content"]
        return Reply.text("held back", gate=gate) if "hold" in last_user else Reply.text("quick")

    key, marker = scenario(answer)
    conversation = f"conv-{key}"
    await client.send(f"{marker} hello", conversation_id=conversation, agent="plain")
    running = await client.submit(f"{marker} hold", conversation_id=conversation, agent="plain")
    queued = await client.submit(f"{marker} after", conversation_id=conversation, agent="plain")
    assert await scripted_llm.wait_until_async(lambda: len(scripted_llm.requests_for(key)) == 2, 10)
    before = await client.history(conversation)
    assert await running.status() == "running" and await queued.status() == "queued"

    with pytest.raises(ConversationBusyError) as busy:
        await client.clear(conversation)
    assert busy.value.active_turn_id == running.turn_id and busy.value.conversation_id == conversation
    assert await client.history(conversation) == before  # nothing changed
    gate.set()
    await running.result(timeout=30)
    await queued.result(timeout=30)

    await client.clear(conversation)
    assert await client.history(conversation) == []
    assert (await client.send(f"{marker} fresh", conversation_id=conversation, agent="plain")).content == "quick"
    assert [m.role for m in await client.history(conversation)] == ["user", "assistant"]


async def test_done_final_message_is_in_the_history_and_the_next_turn_sees_it(client, scenario, scripted_llm):
    def answer(request):
        last_user = [m for m in request.messages if m.get("role") == "user"][-1]["content"]
        if "finish" in last_user:
            return Reply.tool_calls([("add", {"a": 1, "b": 2}), ("finish", {"answer": "all done"})])
        return Reply.text("next")

    key, marker = scenario(answer)
    conversation = f"conv-{key}"
    events = await collect(client, f"{marker} finish", conversation)
    final = AssistantMessage(content="all done")
    assert events[-1].final_message() == final
    assert of_type(events, "message")[-1].data["message"] == final.model_dump(mode="json")
    history = await client.history(conversation)
    assert history[-1] == final and [m.role for m in history] == ["user", "assistant", "tool", "tool", "assistant"]
    assert len(scripted_llm.requests_for(key)) == 1  # the _done result ended the turn: no second model call

    await client.send(f"{marker} and now?", conversation_id=conversation)
    assert {"role": "assistant", "content": "all done"} in scripted_llm.requests_for(key)[-1].messages


def test_the_blocking_client_clears_too_and_refuses_while_a_turn_runs(redis_url, prefix, scenario, scripted_llm):
    gate = threading.Event()
    key, marker = scenario(Script(Reply.text("held back", gate=gate)))
    conversation = f"conv-{key}"
    with SyncSmithClient.from_url(redis_url, prefix=prefix) as sync:
        handle = sync.submit(f"{marker} hold", conversation_id=conversation, agent="plain")
        assert scripted_llm.wait_until(lambda: len(scripted_llm.requests_for(key)) == 1, 10)
        with pytest.raises(ConversationBusyError):
            sync.clear(conversation)
        assert len(sync.history(conversation)) == 1
        gate.set()
        assert handle.result(timeout=30).content == "held back"
        sync.clear(conversation)
        assert sync.history(conversation) == []
