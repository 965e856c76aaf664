"""The library's loggers (seed §16.1; DESIGN.md §2): named ``agent_smith[.sub]``, and the
library never adds a handler or sets a level — the application does (``smith-worker``
configures logging in its ``main`` only, never at import).
"""

from __future__ import annotations

import json
import subprocess
import sys

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
