"""EventBatcher: events published in arrival order, batched while a publish is in flight."""

from __future__ import annotations

import asyncio

import pytest

from smith_client.events import TokenData
from smith_worker.agent.event_batch import EventBatcher
from smith_worker.memory.fencing import StaleAttemptError


class Pipeline:
    """A stand-in for the worker's auto-pipeline: a submitted publish is built (its events taken) at once and
    answered once ``release`` is set (a round trip in flight), with ``reply`` (a negative one: the attempt
    was superseded, which the publish's parse raises as StaleAttemptError) or the error ``fail``."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = asyncio.Event()
        self.reply = 1
        self.fail: BaseException | None = None
        self._answering: set[asyncio.Task[None]] = set()

    def submit(self, take):
        self.batches.append([event.text for event in take()])
        future = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._answer(future))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
        return future

    async def _answer(self, future: asyncio.Future) -> None:
        await self.release.wait()
        if future.done():  # cancelled by aclose()
            return
        if self.fail is not None:
            future.set_exception(self.fail)
        elif self.reply < 0:
            future.set_exception(StaleAttemptError("t1"))
        else:
            future.set_result(self.reply)


def batcher_for(publish: Pipeline, coalesce: float = 0.0) -> EventBatcher:
    return EventBatcher(publish.submit, coalesce)


def tokens(*texts: str) -> list[TokenData]:
    return [TokenData(text=t) for t in texts]


async def test_events_added_while_a_publish_is_in_flight_go_in_the_next_one_in_order():
    publish = Pipeline()
    batcher = batcher_for(publish)
    batcher.add(TokenData(text="a"))
    await asyncio.sleep(0)  # the first publish is in flight now
    for event in tokens("b", "c", "d"):
        batcher.add(event)
    publish.release.set()
    await batcher.flush()
    assert publish.batches == [["a"], ["b", "c", "d"]]


async def test_a_lone_event_is_published_without_waiting_for_more():
    publish = Pipeline()
    publish.release.set()
    batcher = batcher_for(publish)
    batcher.add(TokenData(text="a"))
    await asyncio.sleep(0)
    assert publish.batches == [["a"]]  # sent at once, no timer
    batcher.add(TokenData(text="b"))  # the first finished: a new publish starts
    await batcher.flush()
    assert publish.batches == [["a"], ["b"]]


async def test_a_failed_publish_is_raised_by_the_next_add_and_by_flush():
    publish = Pipeline()
    publish.reply = -1
    publish.release.set()
    batcher = batcher_for(publish)
    batcher.add(TokenData(text="a"))
    await asyncio.sleep(0.01)
    with pytest.raises(StaleAttemptError):
        batcher.add(TokenData(text="b"))
    with pytest.raises(StaleAttemptError):  # and it stays failed: nothing after it is published
        batcher.add(TokenData(text="c"))
    assert publish.batches == [["a"]]
    other = batcher_for(publish)
    other.add(TokenData(text="c"))
    with pytest.raises(StaleAttemptError):
        await other.flush()


async def test_a_redis_error_stops_the_events_queued_behind_it():
    """Events that arrived while a failed publish was in flight are never sent after it (no hole in the stream)."""
    publish = Pipeline()
    publish.fail = ConnectionError("connection reset")
    batcher = batcher_for(publish)
    batcher.add(TokenData(text="a"))
    batcher.add(TokenData(text="b"))  # queued behind "a"
    publish.release.set()
    with pytest.raises(ConnectionError):
        await batcher.flush()
    assert publish.batches == [["a"]]


async def test_aclose_stops_a_publish_in_flight_and_drops_unsent_events():
    publish = Pipeline()
    batcher = batcher_for(publish)
    batcher.add(TokenData(text="a"))
    await asyncio.sleep(0)
    batcher.add(TokenData(text="b"))
    await batcher.aclose()
    publish.release.set()
    await asyncio.sleep(0.01)
    assert publish.batches == [["a"]]
    await batcher.flush()  # nothing left: returns at once


async def test_detach_waits_for_the_publish_in_flight_and_hands_back_the_rest():
    publish = Pipeline()
    batcher = batcher_for(publish)
    batcher.add(TokenData(text="a"))
    await asyncio.sleep(0)
    batcher.add(TokenData(text="b"))
    batcher.add(TokenData(text="c"))
    detached = asyncio.ensure_future(batcher.detach())
    await asyncio.sleep(0.01)
    assert not detached.done()  # "a" is still in flight
    publish.release.set()
    assert [event.text for event in await detached] == ["b", "c"]
    assert publish.batches == [["a"]]  # the rest is the caller's to publish, in its own round trip


async def test_with_a_coalescing_window_a_burst_of_tokens_becomes_one_event():

    publish = Pipeline()
    publish.release.set()
    batcher = batcher_for(publish, coalesce=0.05)
    for event in tokens("a", "b"):
        batcher.add(event)
    await asyncio.sleep(0.01)  # within the window: nothing sent yet
    assert publish.batches == []
    batcher.add(TokenData(text="c"))
    await batcher.flush()
    assert publish.batches == [["abc"]]


def test_merge_tokens_joins_only_consecutive_token_deltas():
    from smith_client.events import ToolCallStartedData
    from smith_worker.agent.event_batch import merge_tokens

    started = ToolCallStartedData(id="c1", name="add", index=0)
    merged = merge_tokens([*tokens("a", "b"), started, *tokens("c", "d", "e")])
    assert [getattr(e, "text", e) for e in merged] == ["ab", started, "cde"]


def test_merge_tokens_joins_consecutive_reasoning_deltas_apart_from_tokens():
    from smith_client.events import ReasoningData
    from smith_worker.agent.event_batch import merge_tokens

    merged = merge_tokens([ReasoningData(text="th"), ReasoningData(text="ink"), *tokens("a", "b")])
    assert [(e.event_type, getattr(e, "text", None)) for e in merged] == [("reasoning", "think"), ("token", "ab")]
