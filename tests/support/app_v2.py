"""Version 2 of the tests' app (``tests.support.app_v2:app``), for a fleet in a rolling deploy: v1's app
(:mod:`tests.support.app`) plus a tool and an agent that v1 workers do not have.

Importing it adds them to ``tests.support.app.app`` in the importing process: only worker processes
import it (tests name it as a string).
"""

from __future__ import annotations

from smith_worker import ToolContext
from tests.support.app import app, whoami

__all__ = ["app"]


@app.tool
def convert(amount: float, ctx: ToolContext) -> dict:
    """Convert an amount (new in v2); says which worker ran the call."""
    return {"converted": amount * 2, "worker": ctx.worker_id}


app.agent("v2agent", system_prompt="You use v2's tools.", tools=[convert, whoami])
