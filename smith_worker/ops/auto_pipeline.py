"""Auto-pipelining: the commands many tasks of one worker send at once go to Redis as one pipeline.

A turn worker streaming 50 model replies publishes a token event for each of
them every few milliseconds, each its own script call. redis-py sends every
call on its own: a connection taken from the pool, one write, one wake-up for
the reply; about 120 µs of CPU per call with 50 in flight, against about
30 µs each in one pipeline (``bench/distributed.py``, BENCHMARKS.md).
:class:`AutoPipeline` queues the commands that tasks send while a pipeline is
being built or is in flight and sends them together as the next one, the way
ioredis's ``enableAutoPipelining`` and Lettuce do: nothing waits for a timer
(a command sent alone goes at once) and one pipeline is in flight at a time,
so commands keep the order they were sent in.

A pipeline carries at most :data:`MAX_COMMANDS` commands. Redis writes the
pub/sub messages of a pipeline's scripts to their subscribers only after it
has run every command it read in one go (it flushes client output once per
pass of its event loop), so the first event of a pipeline of 50 waits for
the other 49 to run, and its followers then get all 50 at once. Pipelines
of a few commands get the first events out sooner and spread the burst: at
50 streams the token latency p50 fell from about 1.3 ms to about 0.6 ms with
the turn worker's CPU per stream unchanged (BENCHMARKS.md, ``make bench``).

A command is a typed :class:`~smith_client.roundtrip.Command` (the one a
:class:`~smith_client.roundtrip.RoundTrip` holds): each caller gets its own command's parsed reply or
error (a Redis error reply, or what its ``parse`` raised); a failure of the whole
pipeline (the connection broke) is raised to every caller of that pipeline.
A ``NOSCRIPT`` reply (a Redis restart or ``SCRIPT FLUSH`` emptied the script
cache) loads the scripts and sends the calls that met it once more, before
any later command (:mod:`smith_client.scripts`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import NoScriptError

from smith_client import scripts
from smith_client.roundtrip import Command

T = TypeVar("T")

#: Most commands in one pipeline (see the module docstring; 3 to 20 measured, 8 kept both latency and CPU low).
MAX_COMMANDS = 8

#: ``make()`` returns the command to send, when its pipeline is built.
Make = Callable[[], Command[Any]]


class AutoPipeline:
    """Commands of many tasks sent as one pipeline (see the module docstring); one per worker process."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._queued: list[tuple[Make, asyncio.Future[Any]]] = []
        self._sender: asyncio.Task[None] | None = None

    def submit(self, make: Callable[[], Command[T]]) -> asyncio.Future[T]:
        """Queue the command ``make()`` returns for the next pipeline; return the future of its parsed reply.

        ``make`` runs when that pipeline is built, so what it sends may be decided then. The future
        raises the command's error (e.g. ``ResponseError``) or what its ``parse`` raised, or the
        pipeline's (``ConnectionError``, ``TimeoutError``). Cancelled before its pipeline is built, the
        command is never sent; once it is sent, the reply is dropped.
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queued.append((make, future))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send())
        return future

    async def _send(self) -> None:
        try:
            while self._queued:
                live = [entry for entry in self._queued if not entry[1].done()]
                batch, self._queued = live[:MAX_COMMANDS], live[MAX_COMMANDS:]
                if batch:
                    await self._send_batch(batch)
        except BaseException as exc:  # the worker stops: nobody may wait for a pipeline that never goes
            for _, future in self._queued:
                _fail(future, exc)
            self._queued = []
            raise
        finally:
            self._sender = None

    async def _send_batch(self, batch: list[tuple[Make, asyncio.Future[Any]]]) -> None:
        try:
            commands = [make() for make, _ in batch]
            replies = await self._execute(commands)
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                await scripts.load_all(self._redis)
                for i, reply in zip(missing, await self._execute([commands[i] for i in missing]), strict=True):
                    replies[i] = reply
        except BaseException as exc:
            for _, future in batch:
                _fail(future, exc)
            if not isinstance(exc, Exception):
                raise
            return  # told to its callers; later commands go in a pipeline of their own
        for (_, future), command, reply in zip(batch, commands, replies, strict=True):
            if future.done():  # its caller was cancelled while the pipeline was in flight
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
                continue
            try:
                future.set_result(command.parse(reply))
            except Exception as exc:  # the reply says the command failed (e.g. a fenced-off publish)
                future.set_exception(exc)

    async def _execute(self, commands: list[Command[Any]]) -> list[Any]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for command in commands:
                command.queue_on(pipe)
            return list(await pipe.execute(raise_on_error=False))


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)
