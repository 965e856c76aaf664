"""What a worker says at start about the app it serves."""

import logging

import pytest

from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.queue.worker import build_worker

SETTINGS = Settings(redis_url="redis://127.0.0.1:1/0")  # never reached: building a worker sends no command


def tools_only() -> SmithApp:
    app = SmithApp()
    app.tool(lambda a, b: a + b, name="add")
    return app


def with_an_agent() -> SmithApp:
    app = tools_only()
    app.agent("default", tools=["add"])
    return app


@pytest.mark.parametrize(("make_app", "queue", "warning"), [
    (SmithApp, "turns", "the app declares no agents"),
    (tools_only, "turns", "the app declares no agents"),
    (with_an_agent, "turns", None),
    (tools_only, "tools", None),  # a tools-only app is right for tool workers
    (SmithApp, "tools", "the app declares no tools"),
])
async def test_a_worker_warns_at_start_when_its_app_gives_it_nothing_to_serve(caplog, make_app, queue, warning):
    with caplog.at_level(logging.WARNING, logger="agent_smith.worker"):
        worker = build_worker(make_app(), queue, SETTINGS)
    await worker.pool.aclose()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if warning:
        assert any(w.startswith(warning) for w in warnings), warnings
    else:
        assert warnings == []
