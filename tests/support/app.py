"""The app the integration tests' worker processes serve (``tests.support.app:app``)."""

from __future__ import annotations

import asyncio
import os

import redis.asyncio as aioredis

from smith_worker import AgentConfig, SmithApp, ToolContext

app = SmithApp()


def _marker_key(name: str) -> str:
    return f"{os.environ.get('SMITH_PREFIX', 'smith')}:test:{name}"


async def _record(name: str, value: str) -> None:
    """Write a marker the test process can read (with a TTL, like every key)."""
    client = aioredis.Redis.from_url(os.environ["SMITH_REDIS_URL"])
    try:
        await client.rpush(_marker_key(name), value)
        await client.expire(_marker_key(name), 3600)
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
def whoami(ctx: ToolContext) -> dict:
    """Which worker ran this call."""
    return {"worker": ctx.worker_id, "call_id": ctx.call_id}


@app.tool
def finish(answer: str) -> dict:
    """Ends the turn with `answer` (the seed's _done sentinel)."""
    return {"_done": True, "final_message": answer}


app.agent("default", system_prompt="You are a test agent.", tools=[add, sleepy, boom, whoami, finish])
app.agent("plain", system_prompt="No tools here.")
app.agent("limited", tools=[add], config=AgentConfig(max_iterations=2))
