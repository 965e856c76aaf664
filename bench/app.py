"""The app ``make bench``'s workers serve (``bench.app:app``): the anchors' agent and tools.

``add`` is a plain ``def`` as in the anchors' SDK agent (both frameworks run it in a
thread); ``noop`` is an ``async def`` that returns at once, for the tool hop.
"""

from __future__ import annotations

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


app.agent("default", system_prompt="You are a terse assistant.", tools=[add, noop])
