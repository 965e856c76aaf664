"""The interactive conversation of ``smith chat`` and ``make chat``.

Each line typed is one turn of the current conversation; its events go to a
printer (tokens to stdout, tool status lines to stderr). Commands:
``/reset`` starts a new conversation id, ``/exit`` (or ``/quit``) and Ctrl-D
leave. Ctrl-C during a turn cancels that turn (``TurnHandle.cancel``) and
keeps the REPL; at the prompt it only reminds how to leave.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import uuid
from collections.abc import Callable
from typing import TextIO

from smith_client import SmithClient, SmithError, SmithTimeoutError
from smith_client.events import TURN_COMPLETED, Event

PROMPT = "you> "
EXIT_COMMANDS = ("/exit", "/quit")
RESET_COMMAND = "/reset"
#: A line that is one ``/word`` is a command; any other line (``/usr/bin is a path``) is a message.
COMMAND = re.compile(r"/\w+")

Printer = Callable[[Event], None]


async def run_turn(
    client: SmithClient, text: str, *, conversation_id: str, agent: str, timeout: float | None, printer: Printer
) -> bool:
    """Submit one turn and print its events as they arrive; True when it completed.

    Cancelling the calling task cancels the turn itself, not only the printing;
    so does ``timeout`` (seconds, None: no limit), nobody waiting for the answer
    any more. Raises :class:`SmithError` from the client (:class:`SmithTimeoutError`
    at the timeout).
    """
    handle = await client.submit(text, conversation_id=conversation_id, agent=agent)
    ok = False
    try:
        async for event in handle.events(timeout=timeout):  # replayed from seq 1: nothing missed
            printer(event)
            ok = event.type == TURN_COMPLETED
    except asyncio.CancelledError:
        await asyncio.shield(handle.cancel())
        raise
    except SmithTimeoutError as exc:
        await handle.cancel()
        raise SmithTimeoutError(f"{exc.message}; it was cancelled", **exc.fields) from exc
    return ok


def new_conversation_id() -> str:
    """A fresh conversation id, ``chat-<12 hex>``."""
    return f"chat-{uuid.uuid4().hex[:12]}"


class ChatRepl:
    """The REPL loop over ``client`` (see the module doc). :meth:`run` returns the exit code (0).

    ``conversation_id`` is the first conversation (a fresh one when None);
    ``timeout`` is seconds per turn (None: none); status lines go to ``err``.
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
    ) -> None:
        self.client = client
        self.printer = printer
        self.agent = agent
        self.conversation_id = conversation_id or new_conversation_id()
        self.timeout = timeout
        self.err = err
        self._turn: asyncio.Task[bool] | None = None

    def _status(self, line: str) -> None:
        self.err.write(line + "\n")
        self.err.flush()

    def _on_interrupt(self) -> None:
        if self._turn is not None and not self._turn.done():
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
        )
        self._turn = asyncio.create_task(turn)
        try:
            await self._turn
        except asyncio.CancelledError:
            self._status("[turn cancelled]")
        except SmithError as exc:
            self._status(f"[error] {exc.kind}: {exc.message}")
        finally:
            self._turn = None


__all__ = ["ChatRepl", "new_conversation_id", "run_turn"]
