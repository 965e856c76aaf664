"""Tool retries (docs/architecture.md, Tool calls): an idempotent tool's attempts within one timeout, and the
corrections a tool asks of the model with ``RetryWithMessage``."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
import pytest

from smith_client.errors import ConfigurationError
from smith_client.jobs import ToolJob, ToolOutcome
from smith_worker import AgentConfig, RetryWithMessage
from smith_worker.app import SmithApp
from smith_worker.tool_worker.job import stored_outcome
from smith_worker.tools.function import ToolContext, ToolResult, make_tool, retry_delay
from smith_worker.tools.isolation import ToolExecutors


def ctx(retry: int = 0, tool_retries: int = 1) -> ToolContext:
    return ToolContext(call_id="c1", tool_name="t", retry=retry, tool_retries=tool_retries)


def flaky(failures: int, exc: type[BaseException] = ConnectionError):
    """An async tool failing with ``exc`` on its first ``failures`` attempts; ``calls`` counts them."""
    calls: list[float] = []

    async def tool() -> str:
        calls.append(time.monotonic())
        if len(calls) <= failures:
            raise exc(f"attempt {len(calls)}")
        return f"ok after {len(calls)}"

    return tool, calls


async def test_a_listed_exception_is_retried_and_only_the_last_outcome_is_returned(caplog):
    fn, calls = flaky(1)
    tool = make_tool(fn, name="flaky", idempotent=True, retries=2, retry_on=(TimeoutError, ConnectionError), backoff=0)
    with caplog.at_level(logging.WARNING, logger="agent_smith.tool"):
        result = await tool.invoke({}, ctx(), timeout=5)
    assert result == ToolResult(content="ok after 2")
    assert len(calls) == 2
    assert [r.getMessage() for r in caplog.records] == [
        "tool 'flaky' attempt 1 of 3 raised ConnectionError: attempt 1; retrying in 0.00 s"
    ]


async def test_retries_run_out_and_the_last_error_is_the_result():
    fn, calls = flaky(10)
    tool = make_tool(fn, name="flaky", idempotent=True, retries=2, retry_on=ConnectionError, backoff=lambda n: 0.0)
    result = await tool.invoke({}, ctx(), timeout=5)
    assert result.is_error and orjson.loads(result.content)["message"] == "ConnectionError: attempt 3"
    assert len(calls) == 3  # the first attempt and two retries


async def test_an_unlisted_exception_is_not_retried():
    fn, calls = flaky(1, ValueError)
    tool = make_tool(fn, name="flaky", idempotent=True, retries=2, retry_on=ConnectionError, backoff=0)
    result = await tool.invoke({}, ctx(), timeout=5)
    assert result.is_error and len(calls) == 1


async def test_the_tool_own_timeout_error_retries_but_the_call_budget_never_does():
    fn, calls = flaky(1, TimeoutError)
    tool = make_tool(fn, name="flaky", idempotent=True, retries=1, retry_on=TimeoutError, backoff=0)
    assert (await tool.invoke({}, ctx(), timeout=5)).content == "ok after 2"

    attempts: list[int] = []

    async def slow() -> str:
        attempts.append(1)
        await asyncio.sleep(10)
        return "late"

    slow_tool = make_tool(slow, idempotent=True, retries=3, retry_on=TimeoutError, backoff=0)
    result = await slow_tool.invoke({}, ctx(), timeout=0.2)
    assert "timed out after 0.2 s" in result.content and attempts == [1]


async def test_backoff_waits_between_attempts_and_never_past_the_budget():
    fn, calls = flaky(1)
    tool = make_tool(fn, name="flaky", idempotent=True, retries=1, retry_on=ConnectionError, backoff=lambda n: 0.2)
    assert (await tool.invoke({}, ctx(), timeout=5)).content == "ok after 2"
    assert calls[1] - calls[0] >= 0.2

    fn, calls = flaky(1)
    tool = make_tool(fn, name="flaky", idempotent=True, retries=1, retry_on=ConnectionError, backoff=lambda n: 10.0)
    started = time.monotonic()
    result = await tool.invoke({}, ctx(), timeout=1.0)
    # a wait past the call's timeout is not started: the attempt's error is the answer, at once
    assert orjson.loads(result.content)["message"] == "ConnectionError: attempt 1"
    assert len(calls) == 1 and time.monotonic() - started < 0.5


def test_the_default_backoff_is_the_http_policy_schedule():
    assert 0.5 <= retry_delay(0.5, 1) < 0.75
    assert 1.0 <= retry_delay(0.5, 2) < 1.25
    assert retry_delay(0.5, 10) == 8.0
    assert retry_delay(0, 1) == 0.0  # no base: no wait
    assert retry_delay(lambda n: n * 0.1, 3) == pytest.approx(0.3)


_THREAD_CALLS: list[int] = []


def threaded_flaky() -> str:
    _THREAD_CALLS.append(1)
    if len(_THREAD_CALLS) < 3:
        raise ConnectionError("refused")
    return "done"


async def test_a_sync_tool_retries_in_the_thread_pool():
    _THREAD_CALLS.clear()
    executors = ToolExecutors(job_slots=2, processes=1)
    try:
        tool = make_tool(threaded_flaky, idempotent=True, retries=2, retry_on=ConnectionError, backoff=0)
        assert (await tool.invoke({}, ctx(), timeout=5, executors=executors)).content == "done"
        assert len(_THREAD_CALLS) == 3
    finally:
        executors.close()


@pytest.mark.parametrize(
    "options, setting",
    [
        ({"retries": 1, "retry_on": ConnectionError}, "retries"),  # not idempotent
        ({"retries": 1, "idempotent": True}, "retry_on"),  # nothing would retry
        ({"retries": -1, "idempotent": True, "retry_on": ConnectionError}, "retries"),
        ({"retry_on": ("ConnectionError",)}, "retry_on"),
        ({"backoff": -1.0}, "backoff"),
    ],
)
def test_inconsistent_retry_options_are_refused(options, setting):
    with pytest.raises(ConfigurationError) as info:
        make_tool(lambda: "x", name="x", **options)
    assert info.value.setting == setting


def test_app_tool_takes_the_retry_options():
    app = SmithApp()

    @app.tool(idempotent=True, retries=2, retry_on=(TimeoutError, ConnectionError), backoff=0.1)
    def fetch() -> str:
        return "x"

    tool = app.tools.find("fetch")
    assert tool is not None
    assert (tool.retries, tool.retry_on, tool.backoff) == (2, (TimeoutError, ConnectionError), 0.1)


def test_tool_retries_is_checked():
    assert AgentConfig().tool_retries == 1
    with pytest.raises(ConfigurationError):
        AgentConfig(tool_retries=-1)


async def fussy(n: int) -> str:
    if n % 2:
        raise RetryWithMessage(f"n must be even, got {n}")
    return f"took {n}"


async def test_retry_with_message_hands_the_model_a_correction_within_the_allowance():
    tool = make_tool(fussy)
    result = await tool.invoke({"n": 3}, ctx(retry=0, tool_retries=2))
    assert result.is_error and result.retry_requested
    assert orjson.loads(result.content) == {
        "error": True,
        "message": "n must be even, got 3",
        "kind": "RetryWithMessage",
        "retries_left": 1,
        "corrections": 1,
    }
    assert orjson.loads((await tool.invoke({"n": 3}, ctx(retry=1, tool_retries=2))).content)["retries_left"] == 0


async def test_retry_with_message_past_the_allowance_is_an_ordinary_tool_error():
    tool = make_tool(fussy)
    result = await tool.invoke({"n": 3}, ctx(retry=1, tool_retries=1))
    assert result.is_error and result.retry_requested  # still counted: the limit keeps holding
    content = orjson.loads(result.content)
    assert content["kind"] == "ToolError" and content["retryable"] is False
    assert content["message"].startswith("n must be even, got 3 (tool 'fussy' asked for more than tool_retries=1")
    zero = await tool.invoke({"n": 3}, ctx(retry=0, tool_retries=0))
    assert orjson.loads(zero.content)["kind"] == "ToolError"


async def test_retry_with_message_is_never_retried_in_the_job_even_when_listed():
    calls: list[int] = []

    async def asks() -> str:
        calls.append(1)
        raise RetryWithMessage("say please")

    tool = make_tool(asks, idempotent=True, retries=3, retry_on=Exception, backoff=0)
    result = await tool.invoke({}, ctx())
    assert result.retry_requested and calls == [1]


def test_the_stored_outcome_carries_the_request_and_an_old_job_allows_none():
    outcome = stored_outcome(ToolResult("x", is_error=True, retry_requested=True), 1024, "w1")
    assert ToolOutcome.model_validate_json(outcome.model_dump_json()).retry_requested
    job = ToolJob.model_validate(
        {"turn_id": "t", "conversation_id": "c", "agent": "a", "step": 1, "index": 0,
         "call": {"name": "x"}, "timeout": 1.0, "reply_channel": "r", "result_key": "k"}
    )  # fmt: skip
    assert (job.retry, job.tool_retries) == (0, 0)


# ---- a resumed attempt reads the corrections back from the stored messages ----


def _step(*names):
    from smith_client.messages import AssistantMessage, ToolCall

    return AssistantMessage(tool_calls=[ToolCall(id=f"c{i}", name=n) for i, n in enumerate(names)])


def _answer(name, content, is_error=True):
    from smith_client.messages import ToolMessage

    return ToolMessage(tool_call_id="c", name=name, content=content, is_error=is_error)


def test_corrections_in_counts_the_last_step_of_each_tool():
    from smith_worker.tools.function import ToolContext, corrections_in, correction_result

    first = correction_result("even_only", "n must be even", ToolContext(call_id="a", tool_name="even_only"))
    second = correction_result(
        "even_only", "n must be even", ToolContext(call_id="b", tool_name="even_only", retry=1, tool_retries=1)
    )
    messages = [
        _step("even_only", "add"),
        _answer("even_only", first.content),
        _answer("add", "3", is_error=False),
        _step("even_only"),
        _answer("even_only", second.content),  # past tool_retries: an ordinary tool error, still counted
    ]
    assert corrections_in(messages) == {"even_only": 2, "add": 0}


def test_corrections_in_starts_again_after_a_step_that_asked_none():
    from smith_worker.tools.function import corrections_in, error_content

    messages = [
        _step("even_only"),
        _answer("even_only", error_content("odd", kind="RetryWithMessage", retries_left=0, corrections=1)),
        _step("even_only"),
        _answer("even_only", "took 2", is_error=False),
        _step("even_only"),
        _answer("even_only", error_content("boom", kind="ToolError")),  # an error that asks no correction
        _answer("other", "not JSON {", is_error=True),  # a name outside the step: ignored
    ]
    assert corrections_in(messages) == {"even_only": 0}
    assert corrections_in([]) == {}
