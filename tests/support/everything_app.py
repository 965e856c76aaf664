"""The app of tests/integration/test_mcp_everything.py: the reference MCP server ``server-everything`` (npm),
over stdio without and with sampling, and over Streamable HTTP with sampling.

``EVERYTHING_SCRIPT`` is the server's ``dist/index.js`` and ``EVERYTHING_URL`` its HTTP endpoint, both set by
the test's fixtures.
"""

from __future__ import annotations

import os
import shutil

from smith_worker import SmithApp

app = SmithApp()

_NODE = shutil.which("node") or "node"
_SCRIPT = os.environ["EVERYTHING_SCRIPT"]

app.mcp_server("ev", command=_NODE, args=[_SCRIPT, "stdio"], request_timeout=60.0)
app.mcp_server("ev_sampling", command=_NODE, args=[_SCRIPT, "stdio"], request_timeout=60.0, sampling=True)
app.mcp_server("ev_http", url=os.environ["EVERYTHING_URL"], request_timeout=60.0, sampling=True)
app.mcp_server("ev_hasty", command=_NODE, args=[_SCRIPT, "stdio"], request_timeout=60.0, elicitation_timeout=1.0)

app.agent("everything", system_prompt="You can use the everything server.", sources=["ev"])
# sampling answers with the calling agent's own model settings: this agent's model name is its own
app.agent("everything_sampling", sources=["ev_sampling"], llm={"model": "sampler"})
app.agent("everything_http", sources=["ev_http"], llm={"model": "sampler"})
app.agent("everything_hasty", sources=["ev_hasty"])
