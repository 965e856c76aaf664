"""A TCP proxy in front of a redis-server that counts back-and-forths: a request is what a client sends
after the server answered its previous one (a command, a pipeline or a MULTI … EXEC sent together), so
a pipeline counts once however many commands it holds (docs/architecture.md, One turn's path)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from smith_client import scripts
from smith_client.scripts import PUBLISH_BATCH


def script_names() -> dict[str, str]:
    """The project's Lua scripts by sha (``EVALSHA <sha>`` → ``<name>.lua``): those the worker roles load."""
    import smith_worker.queue.worker  # noqa: F401  (its roles import every module that defines a script)

    return {script.sha: f"{script.name}.lua" for script in scripts._ALL}


Reader, Writer = asyncio.StreamReader, asyncio.StreamWriter


@dataclass
class _Connection:
    answered: bool = True  # the server replied since the client last wrote (or nothing was sent yet)


def first_command(data: bytes) -> str:
    """The name of the first command in a RESP request (``EVALSHA <sha>`` for a script call), upper case."""
    parts = data.split(b"\r\n")
    name = parts[2].decode(errors="replace").upper() if len(parts) > 2 else "?"
    if name in ("EVALSHA", "MULTI") and len(parts) > 6:  # a script's sha, a transaction's first command
        return f"{name} {parts[4 if name == 'EVALSHA' else 5].decode(errors='replace')}"
    return name


#: Requests a turn does not wait for (docs/architecture.md, One turn's path): a worker's wait for wake-up
#: tokens, subscriptions, and the token events published while the model stream is read.
NOT_WAITED_FOR = ("BLPOP", "SUBSCRIBE", "UNSUBSCRIBE", "PSUBSCRIBE", "PUNSUBSCRIBE", f"EVALSHA {PUBLISH_BATCH.sha}")


@dataclass
class RequestCounter:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (host, port). While :attr:`counting`, each request not in
    :data:`NOT_WAITED_FOR` is recorded in :attr:`requests` (its first command); counting stops by itself
    when a ``turn.completed`` event passes to a subscriber."""

    target: tuple[str, int]
    requests: list[str] = field(default_factory=list)
    counting: bool = False
    names: dict[str, str] = field(default_factory=script_names)
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> RequestCounter:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def start(self) -> None:
        """Count from now until the next ``turn.completed`` reaches a subscriber."""
        self.requests, self.counting = [], True

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self.target)
        connection = _Connection()
        for pump in (
            self._requests(client_reader, server_writer, connection),
            self._replies(server_reader, client_writer, connection),
        ):
            task = asyncio.create_task(pump)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: _Connection
    ) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(1 << 16):
                if connection.answered and self.counting:
                    name = first_command(data)
                    if not name.startswith(NOT_WAITED_FOR):
                        command, _, sha = name.partition(" ")
                        self.requests.append(f"{command} {self.names.get(sha, sha)}".strip())
                connection.answered = False
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _replies(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: _Connection
    ) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(1 << 16):
                connection.answered = True
                if self.counting and b'"type":"turn.completed"' in data:
                    self.counting = False
                writer.write(data)
                await writer.drain()
        writer.close()
