"""ToolJobWaiter on the session's real redis-server: a call no tool worker takes becomes a timeout error naming
the whole wait (the call's timeout + the pickup grace), and its job is removed from the queue."""

from __future__ import annotations

import time
import uuid

from arq.connections import ArqRedis

from smith_client.jobs import ToolJob
from smith_client.keys import Keys
from smith_client.messages import ToolCall
from smith_worker.tools.waiter import ToolJobWaiter, WorkerSubscription


async def test_a_call_no_tool_worker_takes_times_out_naming_the_whole_wait(redis_url):
    redis = ArqRedis.from_url(redis_url)
    keys = Keys(f"tw{uuid.uuid4().hex[:6]}")
    subscription = WorkerSubscription(redis, keys.worker_replies_channel("test"))
    await subscription.start()
    turn = "t-nobody"
    job = ToolJob(turn_id=turn, conversation_id="c", agent="a", step=1, index=0, call=ToolCall(id="call-1", name="x"),
                  timeout=0.2, reply_channel=subscription.channel, result_key=keys.tool_result(turn, 1, 0))
    try:
        started = time.monotonic()
        outcome, produced_here = await ToolJobWaiter(redis, keys, subscription, pickup_grace=0.3).run(job)
        waited = time.monotonic() - started
    finally:
        await subscription.stop()
    assert produced_here and outcome.is_error
    assert "no tool worker answered within 0.5 s (its timeout 0.2 s + 0.3 s for a tool worker to take it)" in outcome.content
    assert 0.5 <= waited < 5 * 0.5
    job_id = keys.tool_job_id(turn, 1, 0, "")
    assert await redis.zscore(keys.tools_queue, job_id) is None  # aborted: it never starts later
    await redis.delete(job.result_key, keys.arq_job(job_id))
    await redis.aclose()
