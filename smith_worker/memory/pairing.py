"""The tool-message pairing invariant (docs/architecture.md, Tool-call pairing) and the repair of dangling tool calls.

A *tool-call group* is an assistant message with ``tool_calls`` followed by
the tool messages answering them (the loop appends them right after it, in
the order of ``tool_calls``). The invariant every view sent to a model must
hold:

* no tool message without a matching call in the assistant message that
  opens its group (providers answer HTTP 400 otherwise:
  https://github.com/langchain-ai/langchain/issues/34282,
  https://github.com/langchain-ai/langgraph/issues/5582);
* no assistant tool call without a tool message for it.

Calls are matched by ``tool_call_id`` as a multiset: servers may send empty
or repeated ids (docs/architecture.md, Tool calls), so two calls with the same id need two
tool messages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from smith_client.messages import AssistantMessage, ToolMessage
from smith_worker.memory.history import HistorySlice, Repair
from smith_worker.tools.function import error_content

#: Content of the tool message answering a call whose turn ended before its result
#: (docs/architecture.md, Tool-call pairing).
NO_RESULT = error_content("no result: the turn ended before the tool finished")


def _groups(messages: list[Any]) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each run: an assistant message with its following tool messages, or one other
    message, or a run of tool messages with no assistant message before them (orphans)."""
    i = 0
    while i < len(messages):
        j = i + 1 if not isinstance(messages[i], ToolMessage) else i
        while j < len(messages) and isinstance(messages[j], ToolMessage):
            j += 1
        yield i, max(j, i + 1)
        i = max(j, i + 1)


def _answers(call_ids: Counter[str], tools: list[ToolMessage]) -> tuple[list[ToolMessage], Counter[str]]:
    """The tool messages answering a call still unanswered (first one wins), and the calls left unanswered."""
    wanted = Counter(call_ids)
    kept = []
    for message in tools:
        if wanted[message.tool_call_id] > 0:
            wanted[message.tool_call_id] -= 1
            kept.append(message)
    return kept, +wanted


def strip_orphans(messages: list[Any]) -> list[Any]:
    """The messages with every broken tool-call group removed.

    Removed: tool messages that answer no call of the assistant message
    opening their group (its assistant message was dropped, or the message is
    a duplicate), and every group whose assistant message has a call without
    a tool message (the assistant message and its tool messages go together).
    Everything else is kept, in order. Returns a new list; never raises.
    """
    out: list[Any] = []
    for start, end in _groups(messages):
        head = messages[start]
        if isinstance(head, ToolMessage):
            continue  # orphans: no assistant message opens this run
        if not (isinstance(head, AssistantMessage) and head.tool_calls):
            out.append(head)
            continue
        kept, missing = _answers(Counter(c.id for c in head.tool_calls), messages[start + 1 : end])
        if not missing:
            out.append(head)
            out.extend(kept)
    return out


def answer_dangling(messages: list[Any]) -> list[tuple[int, list[ToolMessage]]]:
    """For each assistant message whose calls lack tool messages: ``(index to insert at, error tool messages)``.

    The index is right after the group's existing tool messages; each error
    message carries :data:`NO_RESULT`. Orphan and
    duplicate tool messages are left for :func:`strip_orphans`.
    """
    repairs = []
    for start, end in _groups(messages):
        head = messages[start]
        if isinstance(head, AssistantMessage) and head.tool_calls:
            _, missing = _answers(Counter(c.id for c in head.tool_calls), messages[start + 1 : end])
            if missing:
                repairs.append((end, _error_messages(head, missing)))
    return repairs


def _error_messages(assistant: AssistantMessage, missing: Counter[str]) -> list[ToolMessage]:
    out = []
    for call in assistant.tool_calls:
        if missing[call.id] > 0:
            missing[call.id] -= 1
            out.append(ToolMessage(tool_call_id=call.id, name=call.name, content=NO_RESULT, is_error=True))
    return out


def with_answers(messages: list[Any]) -> list[Any]:
    """``messages`` with the error tool messages of :func:`answer_dangling` inserted."""
    out = list(messages)
    for index, repair in reversed(answer_dangling(messages)):
        out[index:index] = repair
    return out


def well_formed(messages: list[Any]) -> list[Any]:
    """A view that holds the pairing invariant: dangling calls answered, then broken groups stripped."""
    return strip_orphans(with_answers(messages))


def is_well_formed(messages: list[Any]) -> bool:
    """True when ``messages`` hold the pairing invariant (see the module docstring)."""
    return strip_orphans(messages) == list(messages)


#: Stored messages read from the end of a history to find an earlier turn's dangling tool calls.
REPAIR_SCAN = 64


def pending_repair(tail: HistorySlice) -> Repair | None:
    """The error tool messages the history's last dangling tool-call group needs, or None.

    ``tail`` is the history's last :data:`REPAIR_SCAN` messages, read before a
    turn appends its user message (in the round trip that starts the attempt,
    :meth:`~smith_worker.turn.attempt.TurnAttempt.begin`); the repair is inserted
    with the user message (:meth:`~smith_worker.turn.attempt.TurnAttempt.append_user`),
    so the history is repaired once. An unanswered call
    can only be left by the previous turn, followed at most by the user messages
    merged into it.
    """
    repairs = answer_dangling(tail.messages)
    if not repairs:
        return None
    index, messages = repairs[-1]
    return Repair(position=tail.first + index, end=tail.end, messages=messages)
