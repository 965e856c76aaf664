"""Memory: what of a conversation the model sees at each step (docs/architecture.md, Memory).

An agent takes one strategy, ``app.agent("a", ..., memory=RollingWindowMemory(max_messages=20))``;
the default is :class:`FullMemory`. The stored history stays complete (and
bounded by ``SMITH_HISTORY_MAX_MESSAGES``); a strategy only computes the view
sent to the model, which always holds the tool-message pairing invariant
(:func:`strip_orphans`). State a strategy keeps (a summary) lives
in Redis, so every worker sees the same view.
"""

from smith_worker.memory.base import FullMemory, Memory, MemoryContext
from smith_worker.memory.pairing import answer_dangling, is_well_formed, strip_orphans, well_formed
from smith_worker.memory.summary import SummaryMemory
from smith_worker.memory.window import RollingWindowMemory, wire_size

__all__ = [
    "FullMemory",
    "Memory",
    "MemoryContext",
    "RollingWindowMemory",
    "SummaryMemory",
    "answer_dangling",
    "is_well_formed",
    "strip_orphans",
    "well_formed",
    "wire_size",
]
