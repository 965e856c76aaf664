"""How a worker waits between two polls of its queue: woken, not polling (docs/architecture.md, Process roles).

arq only polls. Here every enqueue (and every abort of a running tool job)
pushes a token on the queue's wake-up list in the same round trip
(:mod:`smith_client.enqueue`), and a worker with a free job slot waits for
one with a blocking pop (``BLPOP``) on a dedicated connection, then polls
at once. The wait also ends:

* when one of the worker's own jobs finishes (:meth:`Pickup.job_finished`):
  a full worker takes the next queued job as soon as a slot frees;
* on tool workers, when a running tool job is aborted: the abort is published on
  :attr:`~smith_client.keys.Keys.tool_aborts_channel`, which every tool worker
  follows on one more connection, so the worker running the job (full or not)
  runs arq's abort check at once;
* at the score of the queue's next deferred job (parked turns, arq retries
  with a delay), so they run on time: the poll's claim read it
  (:mod:`smith_worker.queue.claim`), so the wait sends nothing for it;
* after ``fallback`` seconds (``SMITH_FALLBACK_POLL``), so a job enqueued
  without a token (arq's own ``enqueue_job``), or whose token went to another
  worker, waits at most that long;
* at once when the worker stops (:meth:`Pickup.stop`), since arq's
  cancellation of the main task can be lost inside redis-py's reads.

A worker with no free slot, or draining, does not pop: the token stays for a
worker that can take the job; a pop that gets a token after its worker filled
up pushes it back for the same reason. The tokens of the other jobs a poll takes are
popped by the poll's claim (``lua/claim.lua``, one per job claimed beyond the tokens the
wait took, :meth:`Pickup.take_tokens`), so a burst of enqueues costs one poll, not one per job.
A claim after a wait that took tokens takes no more jobs than those and the tokens still
listed: Redis hands each token of a burst to another blocked worker, so the burst's jobs are
spread over the idle workers rather than all claimed by the first to poll.

A worker pops from two lists, its capability set's first (:mod:`smith_worker.routing`): the
enqueue puts the token of a job that only some live capability sets serve (a rolling deploy) on
the lists of those sets, so a worker that cannot run the job never takes its token; every other
token goes to the queue's list.

On tool workers an abort announced on the channel is remembered (:meth:`Pickup.take_abort`):
the worker runs arq's abort check only then, or once per ``fallback`` for an abort missed.

Any Redis failure of the wait (a restart, a frozen Redis, a Sentinel failover
answering ``UNBLOCKED`` or ``READONLY`` from the demoted master) drops the
dedicated connection, backs off through :class:`RedisHealth` and returns,
so the worker polls again; the next wait reconnects (to the new master).
The blocking pop is bounded by ``asyncio.wait_for`` as well as its socket
timeout, so a frozen Redis cannot hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

from smith_client.keys import Keys, now_ms
from smith_worker.ops.redis_health import REDIS_DOWN_ERRORS, RedisHealth
from smith_worker.queue.claim import HeldTokens

logger = logging.getLogger("agent_smith.worker")

#: Seconds the blocking pop may overrun its own timeout before the connection counts as frozen.
POP_MARGIN = 1.0
#: Shortest blocking pop, seconds: Redis reads a ``BLPOP`` timeout under 1 ms as 0, "block forever".
MIN_POP = 0.01


class Pickup:
    """The wait of one worker serving ``queue`` between polls (see the module docstring).

    ``connect()`` builds the dedicated Redis client of the blocking pop, with a
    socket timeout longer than ``fallback`` (seconds), the longest pop.
    ``capset`` is the digest of the worker's capability set ("" for none: the queue's list only).
    A pop outlives a wait that ended otherwise (a job of the worker finished, a
    deferred job is due) and serves the next one, so a busy worker neither
    re-sends it nor reconnects after every job.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        queue: str,
        fallback: float,
        health: RedisHealth,
        aborts_channel: str | None = None,
        capset: str = "",
    ) -> None:
        self._connect = connect
        self._wake_list = Keys.wake_list(queue)
        # the set's list first: BLPOP pops from the first non-empty list
        self._wake_lists = [Keys.wake_list(queue, capset), self._wake_list] if capset else [self._wake_list]
        self.fallback = fallback
        self._health = health
        self._aborts_channel = aborts_channel
        self._client: Any = None
        self._pop: asyncio.Task[None] | None = None
        self._aborts: asyncio.Task[None] | None = None
        self._pop_deadline = 0.0  # loop time past which a pending pop means a frozen Redis
        # poll now: a job of the worker ended, an abort was announced, the pop returned, or the worker stops
        self._nudge = asyncio.Event()
        self._stopped = asyncio.Event()
        self._tokens = HeldTokens()  # tokens popped (and kept) since the last take_tokens()
        self._abort_announced = False

    def job_finished(self) -> None:
        """One of the worker's jobs ended: a slot is free, end the wait."""
        self._nudge.set()

    def stop(self) -> None:
        """The worker stops: end the current wait and every later one at once."""
        self._stopped.set()
        self._nudge.set()

    def before_poll(self) -> None:
        """Forget the job ends seen so far; call right before a poll, so none during it is missed."""
        self._nudge.clear()

    def take_tokens(self) -> HeldTokens:
        """The wake-up tokens the pops took since the last call, per list (the next claim pops that many fewer)."""
        tokens, self._tokens = self._tokens, HeldTokens()
        return tokens

    def take_abort(self) -> bool:
        """Whether an abort was announced on the tool-aborts channel since the last call."""
        announced, self._abort_announced = self._abort_announced, False
        return announced

    async def wait(self, free_slots: Callable[[], int], next_due: float | None) -> None:
        """Return when there may be work (see the module docstring); never raises a Redis error.

        ``free_slots()`` is how many more jobs the worker can take now (0 when full or draining);
        ``next_due`` the epoch ms score of the queue's next deferred job as the last poll read it
        (``None``: none, or the poll did not look).
        """
        loop = asyncio.get_running_loop()
        if self._aborts_channel is not None and self._aborts is None:
            self._aborts = asyncio.ensure_future(self._follow_aborts(self._aborts_channel))
        try:
            limit = self.fallback
            if next_due is not None:  # +1: arq takes a job once its score is <= now, in whole ms
                limit = min(limit, (math.ceil(next_due) - now_ms() + 1) / 1000)
            if limit <= 0 or self._stopped.is_set():
                return
            if self._pop is None and free_slots() > 0:
                timeout = max(limit, MIN_POP)
                self._pop = asyncio.ensure_future(self._pop_token(timeout, free_slots))
                self._pop.add_done_callback(lambda _: self._nudge.set())
                self._pop_deadline = loop.time() + timeout + POP_MARGIN
            if self._pop is not None:
                limit = min(limit, max(0.0, self._pop_deadline - loop.time()))
            with contextlib.suppress(TimeoutError):  # one event, no task per wait: the wake-up path stays short
                async with asyncio.timeout(limit):
                    await self._nudge.wait()
            if self._pop is not None and self._pop.done():
                pop, self._pop = self._pop, None
                pop.result()  # its Redis error, if any
            elif self._pop is not None and loop.time() >= self._pop_deadline:
                raise TimeoutError("the wake-up pop did not return in time")
        except REDIS_DOWN_ERRORS as exc:
            await self.close()
            with contextlib.suppress(TimeoutError):  # a job's end does not cut the back-off short
                await asyncio.wait_for(self._stopped.wait(), self._health.failed("the wake-up wait", exc))

    async def close(self) -> None:
        """Cancel a pending pop and close the dedicated connection (it may hold an unread reply)."""
        pop, self._pop = self._pop, None
        # a cancel can be lost inside redis-py's read (Python 3.11): never wait on one unbounded
        if pop is not None:
            await _cancel(pop)
        if self._stopped.is_set() and self._aborts is not None:  # it reconnects by itself otherwise
            await _cancel(self._aborts)
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.aclose(close_connection_pool=True), POP_MARGIN)

    async def _pop_token(self, timeout: float, free_slots: Callable[[], int]) -> None:
        if self._client is None:
            self._client = self._connect()
        popped = await self._client.blpop(self._wake_lists, timeout=timeout)
        if popped is None:
            return
        wake_list, token = popped[0].decode(), popped[1]
        if free_slots() == 0:  # the pop may outlive the wait that sent it: the worker may have filled up since
            await self._client.lpush(wake_list, token)  # for an idle worker of the queue (of the set)
        elif wake_list == self._wake_list:
            self._tokens = dataclasses.replace(self._tokens, queue=self._tokens.queue + 1)
        else:
            self._tokens = dataclasses.replace(self._tokens, own=self._tokens.own + 1)

    async def _follow_aborts(self, channel: str) -> None:
        """Until the worker stops: end the wait at every message on ``channel`` (an abort), reconnecting
        after a Redis failure; an abort missed meanwhile waits for the fallback poll at most."""
        while not self._stopped.is_set():
            client = self._connect()
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel)
                while not self._stopped.is_set():
                    if await pubsub.get_message(timeout=self.fallback) is not None:
                        self._abort_announced = True
                        self._nudge.set()
            except REDIS_DOWN_ERRORS as exc:
                logger.debug("the tool-aborts subscription failed, reconnecting: %r", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), self.fallback)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(), POP_MARGIN)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.aclose(close_connection_pool=True), POP_MARGIN)


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for it :data:`POP_MARGIN` seconds at most; its late end is still collected."""
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    await asyncio.wait([task], timeout=POP_MARGIN)
