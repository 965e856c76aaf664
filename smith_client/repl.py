"""The interactive conversation of ``smith chat`` and ``make chat``.

Each line typed is one turn of the current conversation; its events go to a
printer (tokens to stdout, tool status lines to stderr). Commands:
``/reset`` starts a new conversation id, ``/exit`` (or ``/quit``) and Ctrl-D
leave. Ctrl-C during a turn cancels that turn (``TurnHandle.cancel``) and
keeps the REPL; at the prompt it only reminds how to leave.

A turn that pauses for a person (docs/architecture.md, Pausing for a person)
asks at the terminal about each pending call: ``y``/``n`` approves or rejects
a call that needs approval, a line typed is an external tool's result; once
all are decided the resumed turn's events follow. Ctrl-D at such a question
leaves the turn paused and prints the ``smith`` commands that decide it. A line
sent while an earlier turn of the conversation is paused waits behind it: one
status line says so, naming that turn.

An MCP server asking for input during a tool call (``input.requested``; the turn keeps running) is asked
about at the terminal too: accept, decline or cancel, and with accept a value for each field of the requested
schema (:mod:`smith_client.input_form`); then ``respond`` answers it. Ctrl-D at such a question leaves the
request open and prints the ``smith respond`` commands that answer it, and the turn is followed on.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TextIO

import orjson

from smith_client import SmithClient, SmithError, SmithTimeoutError, TurnPausedError
from smith_client import turn_record as record
from smith_client.approvals import REJECTED, Decision
from smith_client.errors import InvalidRequestError, NoPendingCallError
from smith_client.events import TURN_COMPLETED, Event, InputRequestedData, PendingItem
from smith_client.input_form import FormField, describe, field_value, form_fields
from smith_client.inputs import InputResponse, input_response
from smith_client.protocol import call
from smith_client.settings import masked_url
from smith_client.turns import paused_error

PROMPT = "you> "
EXIT_COMMANDS = ("/exit", "/quit")
RESET_COMMAND = "/reset"
#: A line that is one ``/word`` is a command; any other line (``/usr/bin is a path``) is a message.
COMMAND = re.compile(r"/\w+")
#: What a person types to answer an input request, and the action it means.
_ACTIONS = {"a": "accept", "accept": "accept", "d": "decline", "decline": "decline", "c": "cancel", "cancel": "cancel"}

Printer = Callable[[Event], None]
#: What a follower does when its turn pauses, given the turn id and its undecided calls: decide them (the turn's
#: events after its resume follow), or raise (:class:`TurnPausedError`: the turn stays paused).
Decider = Callable[[str, list[PendingItem]], Awaitable[None]]
#: What a follower does with an MCP server's request for input (a pending item of kind ``input``), given the turn
#: id and the item: answer it and return True, or return False to leave it open (its ``smith respond`` commands are
#: printed). The turn runs on meanwhile.
InputAnswerer = Callable[[str, PendingItem], Awaitable[bool]]


@dataclass(frozen=True)
class CommandOptions:
    """The connection options of a ``smith`` command printed for a person to run: ``--prefix`` and, when the
    person gave one, ``--redis-url`` (its password shown as ``***``: :func:`~smith_client.settings.masked_url`)."""

    prefix: str
    redis_url: str | None = None

    def __str__(self) -> str:
        url = "" if self.redis_url is None else f" --redis-url {shlex.quote(masked_url(self.redis_url))}"
        return f"--prefix {self.prefix}{url}"

    @property
    def masked(self) -> bool:
        """True when the printed ``--redis-url`` shows its password as ``***`` (the person puts it back)."""
        return self.redis_url is not None and masked_url(self.redis_url) != self.redis_url


async def leave_paused(turn_id: str, pending: list[PendingItem]) -> None:
    """The :data:`Decider` of ``smith ask``: raises :class:`TurnPausedError`; the turn stays paused."""
    raise paused_error(turn_id, pending)


async def run_turn(
    client: SmithClient,
    text: str,
    *,
    conversation_id: str,
    agent: str,
    timeout: float | None,
    printer: Printer,
    decide: Decider = leave_paused,
    answer: InputAnswerer | None = None,
    options: CommandOptions | None = None,
    err: TextIO = sys.stderr,
) -> bool:
    """Submit one turn and print its events as they arrive; True when it completed.

    When the conversation has a paused turn, the new one waits behind it: one line on ``err`` names it, with
    the ``smith pending`` command (``options``: its connection options, default the client's prefix).
    At a ``turn.paused`` whose calls are still undecided, ``decide`` is called with them and the turn's events
    after its resume follow (a pause decided meanwhile elsewhere is followed through). At an ``input.requested``,
    ``answer`` is called with its item; when it is None or leaves the request open, the ``smith respond``
    commands that answer it go to ``err`` (:func:`input_report`) and the turn is followed on.
    Cancelling the calling task cancels the turn itself, not only the printing;
    so does ``timeout`` (seconds, None: no limit), nobody waiting for the answer
    any more. Raises :class:`SmithError` from the client (:class:`SmithTimeoutError`
    at the timeout) or from ``decide`` (:class:`TurnPausedError` leaves the turn paused).
    """
    options = options or CommandOptions(client.keys.prefix)
    handle = await client.submit(text, conversation_id=conversation_id, agent=agent)
    ahead = await paused_ahead(client, conversation_id, handle.turn_id)
    if ahead is not None:
        err.write(
            f"[turn {handle.turn_id} waits behind paused turn {ahead}: it starts once that one is decided "
            f"(smith pending {options} {ahead}) or cancelled]\n"
        )
        err.flush()
    ok = False
    try:
        async for event in handle.events(timeout=timeout):  # replayed from seq 1, through pauses: nothing missed
            printer(event)
            ok = event.type == TURN_COMPLETED
            if isinstance(event.payload, InputRequestedData):
                item = event.payload.item
                if answer is None or not await answer(handle.turn_id, item):
                    err.write("".join(f"{line}\n" for line in input_report(options, handle.turn_id, item)))
                    err.flush()
            pending = [i for i in await client.pending(handle.turn_id) if i.kind != "input"] if event.paused else []
            if pending:
                await decide(handle.turn_id, pending)
    except asyncio.CancelledError:
        await asyncio.shield(handle.cancel())
        raise
    except SmithTimeoutError as exc:
        await handle.cancel()
        raise SmithTimeoutError(f"{exc.message}; it was cancelled", **exc.fields) from exc
    return ok


async def paused_ahead(client: SmithClient, conversation_id: str, turn_id: str) -> str | None:
    """The id of a paused turn of ``conversation_id`` other than ``turn_id`` (one read of the conversation's
    unfinished turns' statuses), which a turn queued after it waits behind; None when there is none."""
    statuses: dict[bytes, bytes] = await client.runner.run(
        call("hgetall", client.keys.conversation_statuses(conversation_id))
    )
    paused = [raw.decode() for raw, status in statuses.items() if status == record.PAUSED.encode()]
    return next((other for other in paused if other != turn_id), None)


async def decide_call(client: SmithClient, turn_id: str, call_id: str, decision: Decision) -> Decision:
    """Record ``decision`` on pending call ``call_id`` of ``turn_id`` with the client's ``approve``, ``reject`` or
    ``submit_tool_result`` (by its ``action``); returns the decision that stands and raises as those do."""
    if decision.action == "approve":
        return await client.approve(turn_id, call_id, decision.arguments)
    if decision.action == "reject":
        return await client.reject(turn_id, call_id, decision.message)
    return await client.submit_tool_result(turn_id, call_id, decision.content, decision.is_error)


def agent_chain(agent_path: list[str]) -> str:
    """``"[lead > researcher] "`` for a sub-agent's event or call, ``""`` for the root agent's."""
    return f"[{' > '.join(agent_path)}] " if len(agent_path) > 1 else ""


def call_text(item: PendingItem) -> str:
    """A pending call as ``tool({"arg":1})``, after its agent chain for a sub-agent's (:func:`agent_chain`)."""
    return f"{agent_chain(item.agent_path)}{item.tool}({orjson.dumps(item.arguments).decode()})"


def decide_commands(options: CommandOptions, turn_id: str, item: PendingItem) -> str:
    """The ``smith`` command line(s) that decide pending ``item`` of ``turn_id``, with connection ``options``."""
    smith = f"smith {{}} {options} {turn_id} {item.call_id}"
    if item.kind == "external":
        return smith.format("result") + " VALUE [--error]"
    return f"{smith.format('approve')} [--arguments JSON]  or  {smith.format('reject')} [--message TEXT]"


def paused_report(options: CommandOptions, paused: TurnPausedError) -> list[str]:
    """What to tell a person about a turn left paused: its calls, each with the commands (connection ``options``)
    that decide it."""
    turn_id = paused.turn_id
    lines = [f"turn {turn_id} is paused; it resumes once each call below is decided:"]
    for raw in paused.pending:
        item = PendingItem.model_validate(raw)
        lines += [f"  {item.call_id} ({item.kind}): {call_text(item)}"]
        lines += [f"    {decide_commands(options, turn_id, item)}"]
    lines.append(f"smith pending {options} {turn_id} lists the calls still waiting")
    if options.masked:
        lines.append("(the password in --redis-url is shown as ***: put yours back to run these)")
    return lines


def respond_commands(options: CommandOptions, turn_id: str, item: PendingItem) -> str:
    """The ``smith respond`` command lines that answer input request ``item`` (kind ``input``) of ``turn_id``."""
    smith = f"smith respond {options} {turn_id} {item.request_id}"
    return f"{smith} accept --content JSON  or  {smith} decline"


def input_report(options: CommandOptions, turn_id: str, item: PendingItem) -> list[str]:
    """What to tell a person about an open input request (kind ``input``): the server's message, the fields its
    content takes (:func:`~smith_client.input_form.describe`) and the commands (connection ``options``) that
    answer it."""
    fields = "; ".join(map(describe, form_fields(item.parameters))) or "none"
    lines = [
        f"input {item.request_id} for {call_text(item)} waits for a person: {item.message}",
        f"  content fields: {fields}",
        f"  {respond_commands(options, turn_id, item)}",
    ]
    if options.masked:
        lines.append("(the password in --redis-url is shown as ***: put yours back to run these)")
    return lines


def new_conversation_id() -> str:
    """A fresh conversation id, ``chat-<12 hex>``."""
    return f"chat-{uuid.uuid4().hex[:12]}"


class ChatRepl:
    """The REPL loop over ``client`` (see the module doc). :meth:`run` returns the exit code (0).

    ``conversation_id`` is the first conversation (a fresh one when None);
    ``timeout`` is seconds per turn (None: none); status lines go to ``err``;
    ``redis_url`` is the ``--redis-url`` the person gave (None: none), for the ``smith`` commands printed.
    """

    def __init__(
        self,
        client: SmithClient,
        printer: Printer,
        *,
        agent: str = "default",
        conversation_id: str | None = None,
        timeout: float | None = None,
        err: TextIO = sys.stderr,
        redis_url: str | None = None,
    ) -> None:
        self.client = client
        self.options = CommandOptions(client.keys.prefix, redis_url)
        self.printer = printer
        self.agent = agent
        self.conversation_id = conversation_id or new_conversation_id()
        self.timeout = timeout
        self.err = err
        self._turn: asyncio.Task[bool] | None = None
        self._asking = ""  # while a question is on the terminal: what Ctrl-D does to it

    def _status(self, line: str) -> None:
        self.err.write(line + "\n")
        self.err.flush()

    def _on_interrupt(self) -> None:
        if self._asking:  # its input() thread cannot be interrupted: the answer stays awaited
            self._status(f"\n(answer the question; Ctrl-D {self._asking})")
        elif self._turn is not None and not self._turn.done():
            self._turn.cancel()
        else:
            self._status("\n(type /exit or press Ctrl-D to leave)")
            sys.stdout.write(PROMPT)
            sys.stdout.flush()

    async def run(self) -> int:
        """Read lines until ``/exit`` or end of input."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, self._on_interrupt)
        self._status(f"[conversation {self.conversation_id}] /reset starts a new one, /exit or Ctrl-D leaves")
        try:
            while True:
                try:
                    line = (await asyncio.to_thread(input, PROMPT)).strip()
                except EOFError:
                    return 0
                if line in EXIT_COMMANDS:
                    return 0
                if line == RESET_COMMAND:
                    self.conversation_id = new_conversation_id()
                    self._status(f"[new conversation {self.conversation_id}]")
                elif COMMAND.fullmatch(line):  # a mistyped command is not sent to the model
                    self._status(f"[unknown command {line}: /reset starts a new conversation, /exit leaves]")
                elif line:
                    await self._ask(line)
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    async def _ask(self, line: str) -> None:
        turn = run_turn(
            self.client,
            line,
            conversation_id=self.conversation_id,
            agent=self.agent,
            timeout=self.timeout,
            printer=self.printer,
            decide=self._decide,
            answer=self._answer_input,
            options=self.options,
            err=self.err,
        )
        self._turn = asyncio.create_task(turn)
        try:
            await self._turn
        except asyncio.CancelledError:
            self._status("[turn cancelled]")
        except TurnPausedError as exc:
            for report in paused_report(self.options, exc):
                self._status(report)
        except SmithError as exc:
            self._status(f"[error] {exc.kind}: {exc.message}")
        finally:
            self._turn = None

    async def _decide(self, turn_id: str, pending: list[PendingItem]) -> None:
        """The REPL's :data:`Decider`: asks about each pending call and decides it through the client; raises
        :class:`TurnPausedError` (the turn stays paused) when the person leaves with Ctrl-D."""
        for position, item in enumerate(pending):
            try:
                decision = await self._ask_about(item)
            except EOFError:
                self._status("")
                raise paused_error(turn_id, pending[position:]) from None
            standing = await decide_call(self.client, turn_id, item.call_id, decision)
            if standing != decision:
                self._status(f"[{item.call_id} was decided before: {standing.action}]")

    async def _answer_input(self, turn_id: str, item: PendingItem) -> bool:
        """The REPL's :data:`InputAnswerer`: asks the person (:meth:`_ask_input`) and answers with ``respond``;
        False (the request left open) when the person leaves with Ctrl-D. A request no longer open (answered
        elsewhere, timed out) or an answer refused is one status line."""
        try:
            response = await self._ask_input(item)
        except EOFError:
            self._status("")
            return False
        try:
            await self.client.respond(turn_id, item.request_id, response.action, response.content)
        except (NoPendingCallError, InvalidRequestError) as exc:
            self._status(f"[input {item.request_id} not answered] {exc.kind}: {exc.message}")
        return True

    async def _ask_input(self, item: PendingItem) -> InputResponse:
        """The person's answer to input request ``item``: ``a``/``d``/``c`` (asked again until one of them), and
        with accept each field's value (:func:`~smith_client.input_form.field_value`, asked again until it reads).
        Raises EOFError at the end of input."""
        self._asking = "leaves the request open"
        try:
            action = ""
            while action not in _ACTIONS:
                action = (await asyncio.to_thread(input, "accept, decline or cancel? [a/d/c] ")).strip().lower()
            if _ACTIONS[action] != "accept":
                return input_response(_ACTIONS[action], None)
            values = [(field.name, await self._ask_field(field)) for field in form_fields(item.parameters)]
            return input_response("accept", {name: value for name, value in values if value is not None})
        finally:
            self._asking = ""

    async def _ask_field(self, field: FormField) -> Any:
        """The value the person types for ``field`` (None: left out), asked again, saying why, until it reads."""
        while True:
            try:
                return field_value(field, await asyncio.to_thread(input, f"  {describe(field)}> "))
            except ValueError as exc:
                self._status(f"  ({exc})")

    async def _ask_about(self, item: PendingItem) -> Decision:
        """The person's decision on ``item``: ``y``/``n`` for an approval (asked again until one of them),
        a non-blank line for an external tool's result. Raises EOFError at the end of input."""
        external = item.kind == "external"
        question = f"result of {call_text(item)}> " if external else f"approve {call_text(item)}? [y/n] "
        self._asking = "leaves the turn paused"
        try:
            while True:
                answer = (await asyncio.to_thread(input, question)).strip()
                if external and answer:
                    return Decision(action="result", content=answer)
                if answer.lower() in ("y", "yes"):
                    return Decision(action="approve")
                if answer.lower() in ("n", "no"):
                    return Decision(action="reject", message=REJECTED)
        finally:
            self._asking = ""


__all__ = [
    "ChatRepl",
    "CommandOptions",
    "Decider",
    "InputAnswerer",
    "agent_chain",
    "call_text",
    "decide_call",
    "decide_commands",
    "input_report",
    "leave_paused",
    "new_conversation_id",
    "paused_ahead",
    "paused_report",
    "respond_commands",
    "run_turn",
]
