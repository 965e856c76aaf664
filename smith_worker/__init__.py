"""Agent Smith workers: the agent loop, the LLM client, tools and their dispatch.

Declare tools and agents on a :class:`SmithApp` and point a worker at it::

    smith-worker mypackage.agents:app --queue turns
    smith-worker mypackage.agents:app --queue tools

The names below load their modules on first use, so ``smith-worker`` can tell a base install
(no ``worker`` extra) what is missing instead of failing on an import (:mod:`smith_worker.cli`).
"""

from typing import TYPE_CHECKING

from smith_worker.lazy import lazy_exports

if TYPE_CHECKING:  # the names for type checkers; at run time each loads its module on first use
    from smith_worker.app import AgentSpec as AgentSpec
    from smith_worker.app import SmithApp as SmithApp
    from smith_worker.config import AgentConfig as AgentConfig
    from smith_worker.config import Settings as Settings
    from smith_worker.hooks import Hooks as Hooks
    from smith_worker.memory import FullMemory as FullMemory
    from smith_worker.memory import Memory as Memory
    from smith_worker.memory import MemoryContext as MemoryContext
    from smith_worker.memory import RollingWindowMemory as RollingWindowMemory
    from smith_worker.memory import SummaryMemory as SummaryMemory
    from smith_worker.memory import strip_orphans as strip_orphans
    from smith_worker.skills import Skill as Skill
    from smith_worker.skills import load_skill as load_skill
    from smith_worker.tools.function import RetryWithMessage as RetryWithMessage
    from smith_worker.tools.function import Tool as Tool
    from smith_worker.tools.function import ToolContext as ToolContext
    from smith_worker.tools.function import ToolRegistry as ToolRegistry
    from smith_worker.tools.function import ToolResult as ToolResult
    from smith_worker.tools.function import make_tool as make_tool

_EXPORTS = {
    "AgentConfig": "config",
    "AgentSpec": "app",
    "FullMemory": "memory",
    "Hooks": "hooks",
    "Memory": "memory",
    "MemoryContext": "memory",
    "RetryWithMessage": "tools.function",
    "RollingWindowMemory": "memory",
    "Settings": "config",
    "Skill": "skills",
    "SmithApp": "app",
    "SummaryMemory": "memory",
    "Tool": "tools.function",
    "ToolContext": "tools.function",
    "ToolRegistry": "tools.function",
    "ToolResult": "tools.function",
    "load_skill": "skills",
    "make_tool": "tools.function",
    "strip_orphans": "memory",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
