"""The app of tests/integration/test_mcp_asking.py: the lab stdio MCP server (tests/support/mcp_servers/lab_server.py)
asking a person during its calls (elicitation, sampling approval) with a short ``request_timeout``, and sampling
against small token budgets (docs/architecture.md, Pausing for a person and MCP)."""

from __future__ import annotations

import sys

from smith_worker import AgentConfig, SmithApp
from tests.support.mcp_servers import LAB_SERVER

app = SmithApp()

_LAB = {"command": sys.executable, "args": [LAB_SERVER]}

# a person's answer may come long after request_timeout: the wait does not count against it
app.mcp_server("lab_ask", **_LAB, request_timeout=3.0, elicitation_timeout=30.0)
# unanswered: declined after elicitation_timeout, longer than request_timeout
app.mcp_server("lab_hasty", **_LAB, request_timeout=2.0, elicitation_timeout=5.0)
app.mcp_server("lab_sampling", **_LAB, sampling=True)
app.mcp_server("lab_approve", **_LAB, request_timeout=3.0, sampling=True, sampling_needs_approval=True,
               elicitation_timeout=30.0)
app.mcp_server("lab_approve_hasty", **_LAB, request_timeout=2.0, sampling=True, sampling_needs_approval=True,
               elicitation_timeout=4.0)

app.agent("asker", sources=["lab_ask"])
app.agent("asker_hasty", sources=["lab_hasty"])
app.agent("sampler", sources=["lab_sampling"], llm={"model": "sampler"})
app.agent("sampler_tight", sources=["lab_sampling"], config=AgentConfig(max_total_tokens=50))
app.agent("sampler_tight_tree", sources=["lab_sampling"], config=AgentConfig(tree_max_total_tokens=50))
app.agent("approver", sources=["lab_approve"], llm={"model": "sampler"})
app.agent("approver_hasty", sources=["lab_approve_hasty"])
