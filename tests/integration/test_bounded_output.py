"""A 50 MB model answer — as 1 KiB content deltas and as one SSE line — ends
the turn with ``ParseError`` at ``max_response_bytes`` (4 MiB), cheaply, and the worker keeps serving."""

from __future__ import annotations

import psutil
import pytest

from smith_client.errors import ParseError
from smith_worker.llm.types import DEFAULT_MAX_RESPONSE_BYTES
from smith_worker.testing import Reply, Script, sse_frame

pytestmark = [pytest.mark.integration]

ANSWER_BYTES = 50 * 1024 * 1024


def one_line_answer() -> Reply:
    frame = sse_frame({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "z" * ANSWER_BYTES}}]})
    return Reply.raw([frame, b"data: [DONE]\n\n"])


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


@pytest.mark.parametrize("answer", [lambda: Reply.text("y" * ANSWER_BYTES, chunk_size=1024), one_line_answer],
                         ids=["1 KiB deltas", "one SSE line"])
async def test_a_50_mb_answer_is_cut_off_at_max_response_bytes(workers, client, scenario, answer):
    turn_worker = workers[0].pid
    _, marker = scenario(Script(answer()))
    _, after = scenario(Script(Reply.text("still here")))
    memory_before = (await client.redis.info("memory"))["used_memory"]
    cpu_before = cpu_seconds(turn_worker)
    handle = await client.submit(f"{marker} write a novel", conversation_id=f"big-{marker[11:23]}", agent="plain")
    with pytest.raises(ParseError) as cut:  # the caller gets the error
        await handle.result(timeout=60)
    assert cut.value.offset == DEFAULT_MAX_RESPONSE_BYTES
    assert cpu_seconds(turn_worker) - cpu_before < 5.0
    grown = (await client.redis.info("memory"))["used_memory"] - memory_before
    assert grown < 20 * 1024 * 1024
    following = await client.submit(f"{after} hello", conversation_id=f"big-{after[11:23]}", agent="plain")
    assert (await following.result(timeout=30)).content == "still here"  # the worker keeps serving
