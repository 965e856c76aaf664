"""Agent Smith workers: the agent loop, the LLM client, tools and their dispatch.

Declare tools and agents on a :class:`SmithApp` and point a worker at it::

    smith-worker mypackage.agents:app --queue turns
    smith-worker mypackage.agents:app --queue tools
"""

from smith_worker.app import AgentSpec, SmithApp
from smith_worker.config import AgentConfig, Settings
from smith_worker.hooks import Hooks
from smith_worker.memory import FullMemory, Memory, MemoryContext, RollingWindowMemory, SummaryMemory, strip_orphans
from smith_worker.skills import Skill, load_skill
from smith_worker.tools import Tool, ToolContext, ToolRegistry, ToolResult, make_tool

__all__ = [
    "AgentConfig",
    "AgentSpec",
    "FullMemory",
    "Hooks",
    "Memory",
    "MemoryContext",
    "RollingWindowMemory",
    "Settings",
    "Skill",
    "SmithApp",
    "SummaryMemory",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "load_skill",
    "make_tool",
    "strip_orphans",
]
