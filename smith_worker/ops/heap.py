"""Give freed heap memory back to the system, periodically (glibc only).

A turn over a long history allocates many megabytes at once (the history's
stored form, its parsed messages, the request body) and frees them when it
ends. CPython hands blocks of that size to ``malloc``; glibc keeps what is
freed in its arenas (one per thread that allocated, and the ``mmap``
threshold grows with the sizes it has seen), so without a trim the process's
resident memory stays at its highest burst: 20 concurrent turns over
10 000-message histories left a turn worker at about 180 MiB instead of
the 72 MiB it idles at (``bench/worker_memory.py``, BENCHMARKS.md).
``malloc_trim(0)`` returns the free pages of every arena to the system.

A turn that ends with an exception (a Redis restart under it, a failed model
call) can leave that exception's traceback in a reference cycle, and the
traceback holds the frames it passed through with their locals: the turn's
request body among them, megabytes for a long history. Only the cyclic garbage
collector frees those, and it seldom examines objects that old, so the next
trim after such a turn (:func:`collect_soon`) runs a full collection first.

Elsewhere (musl, macOS, Windows) there is no such call and :func:`trim` does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
from collections.abc import Callable

#: Seconds between two trims of a running worker.
TRIM_INTERVAL = 5.0


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None when the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


_TRIM = _malloc_trim()
_collect = False


def collect_soon() -> None:
    """Have the next periodic trim run a full garbage collection first (see the module docstring).

    Called when a turn ends with an exception; at most one collection per :data:`TRIM_INTERVAL` follows,
    however many turns fail."""
    global _collect
    _collect = True


def trim() -> bool:
    """Return the C heap's free pages to the system; True when something was released.

    A no-op (False) without glibc. ctypes releases the GIL for the call, so other threads run meanwhile.
    """
    return bool(_TRIM(0)) if _TRIM is not None else False


async def trim_forever(interval: float = TRIM_INTERVAL) -> None:
    """Every ``interval`` seconds until cancelled: a full garbage collection when :func:`collect_soon` asked
    for one, then :func:`trim` in a thread (a trim of a large heap takes milliseconds)."""
    global _collect
    while True:
        await asyncio.sleep(interval)
        if _collect:
            _collect = False
            gc.collect()
        if _TRIM is not None:
            await asyncio.to_thread(trim)
