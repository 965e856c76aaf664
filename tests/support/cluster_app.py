"""The app of tests/integration/test_cluster_runtime.py: a text agent, a tool agent whose tools run on the tool
worker, a skill and a sub-agent, all served from one Redis Cluster hash slot (docs/cluster.md, One hash slot)."""

from __future__ import annotations

from pathlib import Path

from smith_worker import SmithApp
from tests.support import app as support

app = SmithApp()
# the integration app's tools, registered here too (their markers carry the deployment's hash tag)
add = app.tool(timeout=5.0)(support.add)
counted = app.tool(timeout=30.0)(support.counted)
slow_tool = app.tool(timeout=30.0)(support.slow_tool)
app.skill(Path(__file__).resolve().parent / "skills" / "research")
app.agent("default", system_prompt="You are a test agent.", tools=[add, counted, slow_tool])
app.agent("plain", system_prompt="No tools here.")
app.agent("lead", system_prompt="You lead.", tools=[add], subagents=["researcher"], description="Leads the work.")
app.agent("researcher", system_prompt="You research.", tools=[add], skills=["research"],
          description="Researches a question and answers it.")
