"""Tool side of tool calls: the ``run_tool`` job function.

Runs one tool call through the source its job names (``ToolJob.source``,
without choosing again) within its timeout, cuts the content to the agent's
byte cap, stores the outcome under the call's result key (first writer wins,
so a turn that already gave up on the call keeps its answer), publishes the
``tool.result`` event and wakes the waiting turn worker.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import Any

import orjson

from smith_client.errors import ContextValidationError
from smith_client.eventlog import WHILE_RUNNING
from smith_client.events import tool_result_data
from smith_client.jobs import REPLY_INLINE_MAX, ToolJob, ToolOutcome
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.scripts import LuaScript
from smith_worker.app import SmithApp
from smith_worker.ops import tracing
from smith_worker.ops.redaction import redact_literals, redact_text, secrets_scope
from smith_worker.runtime import WorkerRuntime
from smith_worker.tools.caller import NO_CONTEXT, parse_context
from smith_worker.tools.function import (
    ToolContext,
    ToolResult,
    bounded_structured,
    error_result,
    scrub_surrogates,
    truncate_content,
)
from smith_worker.tools.source import APP_TOOLS, ToolSource, skill_id, source_id

#: The script of this module, in ``lua/`` beside it.
STORE_TOOL_RESULT = LuaScript("store_tool_result", __package__)

logger = logging.getLogger("agent_smith.tool")

#: Seconds past a call's budget before the tool worker stops waiting for a source that ignores its own timeout.
TIMEOUT_GUARD = 0.5


def stored_outcome(
    result: ToolResult, max_bytes: int, worker: str, secrets: frozenset[str] = frozenset()
) -> ToolOutcome:
    """What is stored for a finished call: content cut to ``max_bytes`` UTF-8 bytes (lone surrogates
    become U+FFFD, so the result always serializes), known secrets redacted from error content and the caller
    context's ``secrets`` from any (docs/architecture.md, Caller context), ``structured`` dropped when over
    ``max_bytes`` (see :func:`bounded_structured`)."""
    content = redact_literals(truncate_content(scrub_surrogates(result.content), max_bytes), secrets)
    structured = bounded_structured(result.structured, max_bytes)
    if secrets and structured is not None:
        text = orjson.dumps(structured).decode()
        if redact_literals(text, secrets) != text:
            structured = orjson.loads(redact_literals(text, secrets))
    return ToolOutcome(
        content=redact_text(content) if result.is_error else content,
        is_error=result.is_error,
        structured=structured,
        worker=worker,
        retry_requested=result.retry_requested,
    )


def _source(app: SmithApp, job: ToolJob) -> ToolSource | None:
    """The source the job names (:attr:`ToolJob.source`), or None when this app has none."""
    return app.source(job.source or legacy_source_id(app, job.skill, job.call.name))


def legacy_source_id(app: SmithApp, skill_name: str, tool_name: str) -> str:
    """The source id of a job that names none (enqueued by a worker older than source ids): found by the
    tool's name as those workers found it, in skill ``skill_name``'s Python tools then its MCP servers, or
    ("" skill) in the app's Python tools then its other sources; "" when nothing owns it."""
    if skill_name:
        skill = app.skills.get(skill_name)
        if skill is None:
            return ""
        if tool_name in skill.native:
            return skill_id(skill_name)
        aliases = skill.aliases
    elif app.native.owns(tool_name):
        return APP_TOOLS
    else:
        aliases = list(app.sources)
    return next((source_id(alias) for alias in aliases if app.sources[alias].owns(tool_name)), "")


async def _invoke(rt: WorkerRuntime, job: ToolJob, context: Any = None) -> ToolResult:
    source = _source(rt.app, job)
    if source is None:
        return error_result(f"unknown tool: {job.call.name}")
    ctx = ToolContext(
        call_id=job.call.id,
        tool_name=job.call.name,
        turn_id=job.turn_id,
        conversation_id=job.conversation_id,
        agent=job.agent,
        budget=job.timeout,
        deadline=time.monotonic() + job.timeout,
        worker_id=rt.worker_id,
        agent_path=job.agent_path,
        call_path=job.call_path,
        context=context,
        retry=job.retry,
        tool_retries=job.tool_retries,
        step=job.step,
        index=job.index,
        position=job.position,
        tenant=job.tenant,
    )
    try:  # a guard behind the source's own timeout, which fires first with its own message
        async with asyncio.timeout(job.timeout + TIMEOUT_GUARD):
            return await source.call(job.call.name, job.call.arguments, ctx)
    except TimeoutError:
        return error_result(f"tool {job.call.name!r} timed out after {job.timeout:g} s")


async def run_tool(ctx: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """arq job function: run one tool call. Returns a small summary (arq's result is not relied on)."""
    rt: WorkerRuntime = ctx["runtime"]
    job = ToolJob.model_validate(payload)
    started = time.monotonic()
    # one round trip: is it answered already, and mark who runs it (lets a resumed
    # turn tell a live tool worker from a dead one); the turn's caller context rides along (read from its
    # record, never carried in the job: docs/architecture.md, Caller context)
    start = RoundTrip()
    answered = start.call("exists", job.result_key, parse=bool)
    start.call("set", rt.keys.tool_started(job.turn_id, job.step, job.index, job.position), rt.worker_id,
               ex=rt.keys.turn_ttl)  # fmt: skip
    record: Pending[bytes | None] = start.call("get", rt.keys.turn_context(job.turn_id))
    await start.run(rt.redis)
    if answered.value:
        return {"is_error": False, "stored": False}  # never run a call twice
    with tracing.span(
        f"execute_tool {job.call.name}", carrier=job.trace, attributes=_span_attributes(ctx, job)
    ) as span:
        try:
            caller = parse_context(record.value, rt.app.context_type)
        except ContextValidationError as exc:  # the turn worker validated it: another app version's type
            caller = NO_CONTEXT
            result = error_result(f"the turn's caller context does not fit this worker: {exc.message}")
        else:
            with secrets_scope(caller.secrets):  # redacted from every log line while the call runs
                result = await _invoke(rt, job, caller.value)
        span.set("smith.tool.run_s", round(time.monotonic() - started, 6))
        if result.is_error:  # a failure: status error and an exception event (docs/architecture.md, Tracing)
            span.fail("ToolError", redact_literals(_error_message(result), caller.secrets))
    outcome = stored_outcome(result, job.result_max_bytes, rt.worker_id, caller.secrets)
    rt.metrics.record_tool_call(job.call.name, outcome.is_error, time.monotonic() - started)
    # A call that ran is not lost to a Redis outage: its outcome is stored once Redis answers
    # again (bounded by the job's timeout), where the resumed turn finds it.
    stored = await rt.health.until_ok("storing a tool result", lambda: _store(rt, job, outcome))
    logger.debug("tool %s ran in %.3f s (stored=%s)", job.call.name, time.monotonic() - started, bool(stored))
    return {"is_error": outcome.is_error, "stored": bool(stored)}


def _error_message(result: ToolResult) -> str:
    """The message of an error result for its span's status: the ``message`` of ``{"error": true, ...}``
    content, else the content (an MCP server's text), at most 1000 characters."""
    try:
        decoded = orjson.loads(result.content)
    except orjson.JSONDecodeError:
        decoded = None
    message = decoded.get("message") if isinstance(decoded, dict) else None
    return (message if isinstance(message, str) else result.content)[:1000]


def _span_attributes(ctx: dict[str, Any], job: ToolJob) -> dict[str, str | int | float]:
    """The ``execute_tool`` span's attributes (GenAI conventions; docs/architecture.md, Tracing), with the
    seconds the job waited in the queue (arq's ``enqueue_time`` to now)."""
    attributes: dict[str, str | int | float] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": job.call.name,
        "gen_ai.tool.call.id": job.call.id,
        "gen_ai.agent.name": job.agent,
        "smith.turn.id": job.turn_id,
        "smith.tool.source": job.source,
    }
    enqueued = ctx.get("enqueue_time")
    if isinstance(enqueued, datetime.datetime):
        attributes["smith.tool.queue_wait_s"] = round(max(0.0, time.time() - enqueued.timestamp()), 6)
    return attributes


async def _store(rt: WorkerRuntime, job: ToolJob, outcome: ToolOutcome) -> bool:
    """Store the outcome (first writer wins); when stored, publish ``tool.result`` and wake the turn with the
    outcome, all in one script call (``lua/store_tool_result.lua``; all or nothing, so a retry after a lost
    reply finds the result stored and sends nothing twice)."""
    once = rt.keys.tool_result_published(job.turn_id, job.step, job.index, job.position)
    # never after the turn's terminal event, and never twice (a turn between attempts publishes it on resume)
    event_keys, event_args = rt.events.publish_args(
        job.turn_id, tool_result_data(job, outcome), job.agent_path, WHILE_RUNNING, once, job.call_path
    )
    script_keys = [job.result_key, job.reply_channel, *event_keys]
    script_args = [outcome.model_dump_json(), rt.keys.turn_ttl, REPLY_INLINE_MAX, *event_args]
    return bool(await STORE_TOOL_RESULT(rt.redis, script_keys, script_args))
