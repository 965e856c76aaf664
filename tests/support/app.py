"""The app the integration tests' worker processes serve (``tests.support.app:app``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from smith_client import ToolError
from smith_client.connection import connect_redis, connect_sync_redis
from smith_client.keys import Keys, shard_prefix
from smith_client.settings import ClientSettings
from smith_worker import AgentConfig, Hooks, SmithApp, ToolContext

app = SmithApp()


def _keys() -> tuple[str, Keys]:
    """The worker's Redis URL and key names: its shard's (the markers share the shard's hash slot on a cluster)."""
    settings = ClientSettings.from_env(only=("redis_url", "prefix", "redis_cluster", "shards"))
    prefix = shard_prefix(settings.prefix, int(os.environ.get("SMITH_SHARD") or 0), settings.shards)
    return settings.redis_url, Keys(prefix, cluster=settings.redis_cluster)


def _marker_key(name: str) -> str:
    return f"{_keys()[1].key_prefix}:test:{name}"


def _async_client() -> Any:
    url, keys = _keys()
    return connect_redis(url, cluster_key=keys.cluster_slot_key)


def _sync_client() -> Any:
    url, keys = _keys()
    return connect_sync_redis(url, cluster_key=keys.cluster_slot_key)


async def _record(name: str, value: str) -> None:
    """Write a marker the test process can read (with a TTL, like every key).

    RPUSH and EXPIRE go in one MULTI: a tool cancelled between two separate commands left a key with no TTL.
    """
    client = _async_client()
    try:
        await client.pipeline(transaction=True).rpush(_marker_key(name), value).expire(_marker_key(name), 3600).execute()
    finally:
        await client.aclose()


@app.tool(timeout=5.0)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool(timeout=1.0)
async def sleepy(seconds: float, ctx: ToolContext) -> str:
    """Sleep for `seconds`; records its start and its cancellation."""
    await _record(f"sleepy:{ctx.turn_id}", "started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        await asyncio.shield(_record(f"sleepy:{ctx.turn_id}", "cancelled"))
        raise
    return "rested"


@app.tool
def boom(reason: str = "kaput") -> str:
    """Always raises."""
    raise RuntimeError(reason)


@app.tool
def out_of_quota(retryable: bool = False) -> str:
    """Reports a failure of its own, for the model, instead of crashing."""
    raise ToolError("the quota is used up", retryable=retryable)


@app.tool(isolation="process")
def out_of_quota_in_process(retryable: bool = False) -> str:
    """As ``out_of_quota``, from a pool process (the error is pickled back)."""
    raise ToolError("the quota is used up", tool_name="quota", retryable=retryable)


@app.tool
def whoami(ctx: ToolContext) -> dict:
    """Which worker ran this call."""
    return {"worker": ctx.worker_id, "call_id": ctx.call_id}


@app.tool
def finish(answer: str) -> dict:
    """Ends the turn with `answer` (the _done sentinel, docs/architecture.md, Tool calls)."""
    return {"_done": True, "final_message": answer}


app.agent("default", system_prompt="You are a test agent.",
          tools=[add, sleepy, boom, out_of_quota, out_of_quota_in_process, whoami, finish])
app.agent("plain", system_prompt="No tools here.")
app.agent("unstreamed", tools=[add], config=AgentConfig(stream_default=False))
app.agent("limited", tools=[add], config=AgentConfig(max_iterations=2))


# ---- agents for the loop's stop conditions, hooks and tool_choice ----

# the tree budget (2 model calls) is smaller than the turn's own (8), so only the tree limit can stop it
app.agent("tree_limited", tools=[add], config=AgentConfig(max_iterations=8, tree_max_iterations=2))
# tests script usage of 120 tokens for the first call: the second step is refused
app.agent("token_limited", tools=[add], config=AgentConfig(max_total_tokens=100))
# tests stream the first reply slower than this (seconds); the deadline is checked before the next step
app.agent("deadline_limited", tools=[add], config=AgentConfig(deadline=0.4))
# a named tool_choice on the first call, reset to "auto" after a tool round
app.agent("named_choice", tools=[add], tool_choice="add")
# tool calling for servers without native tool support: no tools on the wire, one JSON-schema reply
app.agent("json_tools", system_prompt="You are a test agent.", tools=[add, whoami], llm={"tool_calling": "json_schema"})


def _record_sync(name: str, value: str) -> None:
    """:func:`_record` for sync hooks, which run on the worker's event loop and cannot await."""
    client = _sync_client()
    try:
        client.pipeline(transaction=True).rpush(_marker_key(name), value).expire(_marker_key(name), 3600).execute()
    finally:
        client.close()


def _raising_hook(name: str, is_async: bool):
    """A hook that records ``name`` under the ``hooks`` marker, then raises (a hook must not fail the turn)."""
    if is_async:

        async def hook(_arg: object) -> None:
            await _record("hooks", name)
            raise RuntimeError(f"{name} hook fails on purpose")

    else:

        def hook(_arg: object) -> None:
            _record_sync("hooks", name)
            raise RuntimeError(f"{name} hook fails on purpose")

    hook.__name__ = name
    return hook


# every hook raises; sync and async ones are mixed so both call paths of invoke_hook are exercised
app.agent(
    "hooked",
    tools=[add],
    hooks=Hooks(
        on_message=_raising_hook("on_message", is_async=True),
        on_tool_call=_raising_hook("on_tool_call", is_async=False),
        on_tool_result=_raising_hook("on_tool_result", is_async=True),
        on_stream_event=_raising_hook("on_stream_event", is_async=False),
        on_error=_raising_hook("on_error", is_async=True),
    ),
)


# ---- durability tests ---------------------------------------------


@app.tool(timeout=30.0)
async def slow_tool(seconds: float, ctx: ToolContext) -> str:
    """Sleep `seconds`; records its start and cancellation (for cancel tests)."""
    await _record(f"slow:{ctx.turn_id}", "started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        await asyncio.shield(_record(f"slow:{ctx.turn_id}", "cancelled"))
        raise
    return "slept"


@app.tool(timeout=30.0)
async def counted(label: str, seconds: float = 0.0) -> str:
    """Counts its executions under `label` (not idempotent: a crash must never re-run it), then sleeps."""
    await _record(f"counted:{label}", "run")
    await asyncio.sleep(seconds)
    return f"counted {label}"


@app.tool(timeout=30.0, idempotent=True)
async def counted_idempotent(label: str, seconds: float = 0.0) -> str:
    """Like `counted`, but declared idempotent: safe to re-run when its tool worker died."""
    await _record(f"counted:{label}", "run")
    await asyncio.sleep(seconds)
    return f"counted {label}"


app.agent("durable", tools=[slow_tool, counted, counted_idempotent, add])


# ---- MCP: the lab stdio server, pooled per worker process ---------------------------
import sys as _sys  # noqa: E402

from tests.support.mcp_servers import LAB_SERVER as _LAB_SERVER  # noqa: E402


async def _record_mcp_event(event: object) -> None:
    """Agent-level on_mcp_event hook: records the event kinds per agent (key ``<prefix>:test:mcp-hook``)."""
    await _record("mcp-hook", event.to_data()["kind"])  # type: ignore[attr-defined]


app.mcp_server("lab", command=_sys.executable, args=[_LAB_SERVER], request_timeout=10.0, deny=["crash"])
app.agent("mcp", system_prompt="You can use the lab MCP server.", tools=[add], sources=["lab"],
          hooks=Hooks(on_mcp_event=_record_mcp_event))


# ---- containment: runaway sync tools, process isolation, odd results ---------------
import time as _time  # noqa: E402


@app.tool(timeout=1.0)
def block_sync(seconds: float) -> str:
    """A sync tool that ignores its timeout: its thread blocks `seconds` (Python cannot stop it)."""
    _time.sleep(seconds)
    return "unblocked"


# 5 s, not 1 s: the call may come right after the tool worker re-executed itself, while its pool
# process is still importing this module on a loaded machine; the kill at the timeout is what is tested.
@app.tool(timeout=5.0, isolation="process")
def sleep_in_process(seconds: float, ctx: ToolContext) -> str:
    """Records its process id under `proc:<turn id>`, then sleeps `seconds` in that process."""
    _record_sync(f"proc:{ctx.turn_id}", str(os.getpid()))
    _time.sleep(seconds)
    return "woke up"


@app.tool(timeout=5.0, isolation="process")
def pid_in_process() -> int:
    """The id of the process it runs in (a process-isolated call that finishes in time)."""
    return os.getpid()


@app.tool
def lone_surrogate() -> str:
    """Returns text with a lone surrogate, which UTF-8 cannot encode."""
    return "before \ud800 after"


@app.tool
def big_structured(kib: int) -> dict:
    """A JSON result of about `kib` KiB (its structured value exceeds the 64 KiB result cap when kib > 64)."""
    return {"blob": "x" * (kib * 1024)}


@app.tool
def big_done(kib: int) -> dict:
    """Ends the turn (the _done sentinel) with an oversized extra field."""
    return {"_done": True, "final_message": "done big", "blob": "y" * (kib * 1024)}


async def corrupt_result(ctx: ToolContext) -> str:
    """Stores an unreadable outcome under its own result key first (a tool worker of another version):
    the turn fails when it reads it. Must be the first call of the turn's first tool round."""
    client = _async_client()
    try:
        await client.set(_keys()[1].tool_result(ctx.turn_id, 1, 0), "{not json", ex=3600)
    finally:
        await client.aclose()
    return "written"


app.tool(corrupt_result)
app.agent("contain", tools=[block_sync, sleep_in_process, pid_in_process, add, lone_surrogate, big_structured,
                            big_done, slow_tool, corrupt_result])


# ---- memory -------------------------------------------------------------------------
from smith_worker import RollingWindowMemory, SummaryMemory  # noqa: E402
from smith_worker.llm.types import ToolSchema  # noqa: E402
from smith_worker.tools.function import ToolResult  # noqa: E402

#: Limits of the "windowed" agent; tests check every request against them.
WINDOW = {"max_messages": 12, "max_chars": 2400, "max_tokens": 500}
#: SummaryMemory settings of the "summarised" agent.
SUMMARY = {"threshold": 20, "keep_recent": 6}

app.agent("windowed", system_prompt="A windowed agent.", tools=[add], memory=RollingWindowMemory(**WINDOW))
# one retry, short backoff: a failing summary call costs the test ~0.1 s, not the default ~4 s of backoff
app.agent("summarised", system_prompt="A summarising agent.", tools=[add], memory=SummaryMemory(**SUMMARY),
          llm={"max_retries": 1, "backoff_base": 0.05})
app.agent("full", system_prompt="A full-memory agent.", tools=[add])


class BrittleSource:
    """A tool source that offers a tool, then breaks when the turn asks for its budget (the source went away):
    the turn fails after its model asked for the tool, which never ran."""

    name = "brittle"

    async def start(self, ctx: object) -> None:
        pass

    def owns(self, tool_name: str) -> bool:
        return tool_name.startswith("brittle__")

    def timeout_for(self, tool_name: str) -> float:
        raise RuntimeError("the brittle source went away")

    def idempotent(self, tool_name: str) -> bool:
        return False

    def approval(self, tool_name: str) -> bool:
        return False

    async def schemas(self, asking: object = None) -> list[ToolSchema]:
        return [ToolSchema(name="brittle__probe", description="Probe something.")]

    async def call(self, tool_name: str, arguments: dict, ctx: ToolContext) -> ToolResult:
        raise AssertionError("never runs: the turn fails before the job is enqueued")

    async def close(self) -> None:
        pass


app.add_source(BrittleSource())
app.agent("brittle", tools=[add], sources=["brittle"])


async def _pause_after_final(message: object) -> None:
    """Holds the turn after a `_done` final message is in the history, so a test can kill its worker there."""
    if getattr(message, "role", "") == "assistant" and getattr(message, "content", "") == "all done":
        await asyncio.sleep(30)


app.agent("done_pause", tools=[add, finish], hooks=Hooks(on_message=_pause_after_final))


# ---- outages and bounds ---------------------------------------------------------------


@app.tool(timeout=30.0, idempotent=True)
async def kills_its_worker(label: str) -> str:
    """Counts its executions under `label`, then kills its tool worker process (``os._exit``), every time."""
    await _record(f"counted:{label}", "run")
    os._exit(3)


app.agent("deadly", tools=[kills_its_worker, add])
# a model that never finishes meets response_timeout long before request_timeout (60 s default)
app.agent("response_bounded", llm={"response_timeout": 3.0})
# a model silent after its response head: 11 attempts allowed, the silence budget (2 x 1 s) ends the call
app.agent("silence_bounded", llm={"request_timeout": 1.0, "max_retries": 10})
# with SMITH_TURN_JOB_TIMEOUT shorter than this, the job timeout ends the turn first
app.agent("response_unbounded", llm={"response_timeout": 120.0, "request_timeout": 120.0})


# ---- sub-agents: lead -> researcher -> fetcher, each with a tool -----------------------

app.agent("lead", system_prompt="You lead.", tools=[add], subagents=["researcher", "fetcher", "limited"],
          config=AgentConfig(max_subagent_depth=2), description="Leads the work.")
app.agent("researcher", system_prompt="You research.", tools=[whoami], subagents=["fetcher"],
          description="Researches a question and answers it.")
app.agent("fetcher", system_prompt="You fetch.", tools=[counted, slow_tool], subagents=["fetcher"],
          description="Fetches one thing.")
# max_subagent_depth=0 disables sub-agents: the call's result is the refusal
app.agent("solo", tools=[add], subagents=["plain"], config=AgentConfig(max_subagent_depth=0))
# the tree budgets are the root's: 12 model calls, or 200 reported tokens, for the whole tree
# (enough child steps that their tool jobs land on both tool workers of the test fleet)
app.agent("tree_boss", tools=[add], subagents=["runaway"], config=AgentConfig(tree_max_iterations=12))
app.agent("token_boss", tools=[add], subagents=["runaway"], config=AgentConfig(tree_max_total_tokens=200))
# its own limits are wide: only its root's tree budget can stop it
app.agent("runaway", tools=[whoami], config=AgentConfig(max_iterations=1000, tree_max_iterations=1000),
          description="Never stops on its own.")


@app.tool
async def patient(seconds: float) -> str:
    """Sleeps `seconds`; registered without a timeout, so its agent's default_tool_timeout applies."""
    await asyncio.sleep(seconds)
    return "patient"


app.agent("impatient", tools=[patient], config=AgentConfig(default_tool_timeout=0.5))


# ---- human in the loop: approval-gated and external tools (docs/architecture.md, Pausing for a person) ----


@app.tool(timeout=30.0, needs_approval=True)
async def guarded_delete(label: str, target: str) -> str:
    """Deletes `target` (pretend): records each run's target under `counted:<label>`; always needs approval."""
    await _record(f"counted:{label}", target)
    return f"deleted {target}"


def _outside_scratch(_ctx: ToolContext, arguments: dict) -> bool:
    """Approval only for targets outside scratch/ (a per-call policy)."""
    return not str(arguments.get("target", "")).startswith("scratch/")


@app.tool(timeout=30.0, needs_approval=_outside_scratch)
async def tidy(label: str, target: str) -> str:
    """Tidies `target`; records each run under `counted:<label>`; needs approval outside scratch/."""
    await _record(f"counted:{label}", target)
    return f"tidied {target}"


app.external_tool(
    "pick_color",
    description="Ask the user's browser to pick a colour.",
    parameters={"type": "object", "properties": {"hint": {"type": "string"}}, "required": ["hint"]},
)
app.agent("guarded", tools=[guarded_delete, tidy, counted, "pick_color"])


@app.tool(timeout=30.0, needs_approval=True)
async def guarded_slow(label: str, seconds: float) -> str:
    """Records its run under `counted:<label>`, then sleeps `seconds`: a resumed step still running its approved
    call (for kill -9 tests); always needs approval."""
    await _record(f"counted:{label}", "run")
    await asyncio.sleep(seconds)
    return "slowly done"


app.agent("guarded_slow", tools=[guarded_slow])
# its calls wait 1 s for a person, then the sweeper (every 2 s) rejects them
app.agent("guarded_brief", tools=[guarded_delete, counted], config=AgentConfig(approval_timeout=1.0))
# an MCP server whose listed tools wait for approval (its other tools run as usual)
app.mcp_server("lab_gated", command=_sys.executable, args=[_LAB_SERVER], request_timeout=10.0, needs_approval=["echo"])
app.agent("mcp_guarded", tools=[counted], sources=["lab_gated"])
# agent trees: a child with a gated tool ("careful"), a child that needs approval to run at all ("vetted")
app.agent("careful", tools=[guarded_delete, counted], description="Deletes carefully.")
app.agent("vetted", tools=[guarded_delete, counted], needs_approval=True, description="Runs once a person agrees.")
app.agent("hitl_lead", tools=[guarded_delete, counted], subagents=["careful", "vetted"])

# ---- MCP elicitation: a server whose tool asks a person for input while the turn runs ----
from tests.support.mcp_servers import ELICIT_SERVER as _ELICIT_SERVER  # noqa: E402

app.mcp_server("elicit", command=_sys.executable, args=[_ELICIT_SERVER], request_timeout=90.0)
app.agent("elicit", sources=["elicit"])

# ---- tool retries (docs/architecture.md, Tool calls) ----

from smith_worker import RetryWithMessage  # noqa: E402


def _attempt(label: str) -> int:
    """Count one attempt under `attempts:<label>` and return how many there were (works in any process)."""
    client = _sync_client()
    try:
        key = _marker_key(f"attempts:{label}")
        count, _ = client.pipeline(transaction=True).rpush(key, "run").expire(key, 3600).execute()
        return int(count)
    finally:
        client.close()


@app.tool(timeout=10.0, idempotent=True, retries=2, retry_on=(TimeoutError, ConnectionError), backoff=0.05)
def flaky(label: str, failures: int = 1) -> str:
    """Refuses (ConnectionError) its first `failures` attempts under `label`, then answers."""
    count = _attempt(label)
    if count <= failures:
        raise ConnectionError(f"attempt {count} refused")
    return f"ok after {count} attempts"


@app.tool(timeout=10.0, idempotent=True, retries=1, retry_on=ConnectionError, backoff=0.05, isolation="process")
def flaky_in_process(label: str, failures: int = 1) -> str:
    """As `flaky`, in a pool process (the error is pickled back)."""
    count = _attempt(label)
    if count <= failures:
        raise ConnectionError(f"attempt {count} refused")
    return f"ok after {count} attempts"


@app.tool(timeout=10.0)
async def even_only(n: int) -> str:
    """Takes an even `n`; asks the model for a corrected call otherwise."""
    if n % 2:
        raise RetryWithMessage(f"n must be even, got {n}")
    return f"took {n}"


app.agent("retrying", tools=[flaky, flaky_in_process, even_only])
app.agent("lenient", tools=[even_only], config=AgentConfig(tool_retries=2))


# ---- reasoning kept in the history (docs/architecture.md, Events) ----

app.agent("thoughtful", tools=[add], config=AgentConfig(keep_reasoning=True))

# handoffs (docs/architecture.md, Handoffs): triage hands a conversation to billing or support;
# ping and pong hand it to each other for ever, so only the turn's iteration budget stops them
app.agent("triage", system_prompt="You triage.", tools=[add], handoffs=["billing", "support"])
app.agent("billing", system_prompt="You handle billing.", tools=[whoami], description="Invoices, refunds, payments.")
app.agent("support", system_prompt="You handle support.", description="Technical problems.")
app.agent("ping", system_prompt="You are ping.", handoffs=["pong"], config=AgentConfig(max_iterations=4))
app.agent("pong", system_prompt="You are pong.", handoffs=["ping"], config=AgentConfig(max_iterations=4))
# per-turn overrides (docs/architecture.md, Per-turn overrides); "big_model" configures a second model name
app.agent("overridable", system_prompt="You are overridable.", tools=[add, whoami],
          config=AgentConfig(max_iterations=6, max_total_tokens=10_000))
app.agent("big_model", llm={"model": "scripted-large"})
