"""The library's loggers (docs/architecture.md, Hooks and logs): named ``agent_smith[.sub]``, and the
library never adds a handler or sets a level — the application does (``smith-worker``
configures logging in its ``main`` only, never at import).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

LOGGERS = [
    "agent_smith",
    "agent_smith.llm",
    "agent_smith.tool",
    "agent_smith.mcp",
    "agent_smith.skill",
    "agent_smith.agent",
    "agent_smith.worker",
]

# Programs, not library code: importing them starts or configures an application (the
# example MCP server's SDK sets up root logging when the server object is built).
PROGRAMS = ["smith_worker.__main__", "smith_worker.demo.mcp_server_example"]

# Runs in a fresh interpreter: pytest's own logging plugin (and caplog in other tests)
# touches loggers in this process, which would hide what the library itself does.
PROBE = """
import importlib, json, logging, pkgutil, sys
import smith_client, smith_worker

for package in (smith_client, smith_worker):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name not in json.loads(sys.argv[2]):
            importlib.import_module(info.name)

loggers = {name: logging.getLogger(name) for name in json.loads(sys.argv[1])}
root = logging.getLogger()
print(json.dumps({
    "loggers": {name: [len(lg.handlers), lg.level, lg.propagate] for name, lg in loggers.items()},
    "root": [len(root.handlers), root.level],
    "library": sorted(n for n in logging.root.manager.loggerDict if n.startswith(("agent_smith", "smith"))),
}))
"""


def test_importing_every_module_adds_no_handler_and_sets_no_level():
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(LOGGERS), json.dumps(PROGRAMS)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    report = json.loads(out)
    assert report["loggers"] == {name: [0, 0, True] for name in LOGGERS}  # no handler, NOTSET, propagates
    assert report["root"] == [0, 30]  # the root logger untouched: no handler, default WARNING
    # every logger the library creates lives under "agent_smith" (no stray module-named loggers)
    assert all(name == "agent_smith" or name.startswith("agent_smith.") for name in report["library"])


# The worker program's configuration (smith_worker.cli.configure_logging), in a fresh interpreter too.
CONFIGURED = """
import json, logging, sys
from smith_worker.cli import configure_logging

configure_logging(sys.argv[1], log_jobs=sys.argv[2] == "1")
logging.getLogger("arq.worker").info("%6.2fs → %s(%s)%s", 0.01, "job:run_turn", "…", "")
logging.getLogger("arq.worker").info("%6.2fs ← %s ● %s", 0.02, "job:run_turn", "")
logging.getLogger("arq.worker").info("%6.2fs ↻ %s retrying job in %0.2fs", 0.02, "job:run_turn", 1.0)
logging.getLogger("httpx").info('HTTP Request: %s %s "%s %d %s"', "POST", "http://h/v1", "HTTP/1.1", 200, "OK")
logging.getLogger("agent_smith.worker").info("own line")
"""


@pytest.mark.parametrize(("level", "log_jobs", "per_job_shown"),
                         [("INFO", "0", False), ("DEBUG", "0", True), ("info", "1", True)])
def test_worker_logs_per_job_and_per_request_lines_only_at_debug_or_when_asked(level, log_jobs, per_job_shown):
    err = subprocess.run([sys.executable, "-c", CONFIGURED, level, log_jobs], check=True, capture_output=True,
                         text=True, timeout=60).stderr
    assert "retrying job" in err and "own line" in err  # other INFO lines stay
    for line in ("0.01s → job:run_turn(…)", "0.02s ← job:run_turn ●", "HTTP Request: POST http://h/v1"):
        assert (line in err) is per_job_shown
