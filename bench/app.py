"""The app ``make bench``'s workers serve (``bench.app:app``): the anchors' agent and tools.

``add`` is a plain ``def`` as in the anchors' SDK agent (both frameworks run it in a
thread); ``noop`` is an ``async def`` that returns at once, for the tool hop; ``stamp``
needs a person's approval and answers the epoch time it started at (``bench/paused_turns.py``).
"""

from __future__ import annotations

import time

from smith_worker import SmithApp

app = SmithApp()


@app.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool
async def noop() -> str:
    """Do nothing."""
    return "ok"


@app.tool(needs_approval=True)
async def stamp() -> str:
    """Say when this call started (epoch seconds); runs only once a person approved it."""
    return repr(time.time())


app.agent("default", system_prompt="You are a terse assistant.", tools=[add, noop])
app.agent("gated", system_prompt="You are a terse assistant.", tools=[stamp])
