"""Opening an MCP transport with the official SDK: stdio child or Streamable HTTP (MCP 2025-06-18, transports: https://modelcontextprotocol.io/specification/2025-06-18/basic/transports).

:func:`open_transport` is an async context manager yielding the SDK's
``(read_stream, write_stream)`` pair. It must be entered and exited in the
same task (the SDK's task groups require it):
the pool's owner task does both.

stdio: the child runs under :mod:`smith_worker.mcp.launcher` (parent-death
SIGKILL, pid announced on stderr) unless ``pdeathsig`` is off. Its stderr
goes to a pipe drained by :class:`StderrCapture` into the
``agent_smith.mcp`` logger (DEBUG, redacted), keeping the last lines for
``disconnected`` events (the SDK needs a real file descriptor there).
Shutdown is the SDK's: close stdin, 2 s grace, SIGTERM to the process
group, 2 s, SIGKILL; the pool SIGKILLs a hung server itself first.

HTTP: an ``httpx2`` client with the bearer token and extra headers over
:class:`~smith_worker.mcp.http.McpHttpTransport` (retries,
stale-session detection); the SDK keeps the ``Mcp-Session-Id`` and sends a
DELETE on close.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import IO, Any, TextIO, cast

from smith_worker.mcp.config import ServerConfig
from smith_worker.mcp.launcher import PID_MARKER
from smith_worker.ops import tracing
from smith_worker.ops.retry import RetryPolicy

logger = logging.getLogger("agent_smith.mcp")

LAUNCHER = str(Path(__file__).with_name("launcher.py"))

#: Lines of server stderr kept for ``disconnected`` events.
STDERR_TAIL = 50
#: HTTP read timeout floor, seconds: request-scoped SSE responses stay open while a tool runs.
HTTP_READ_TIMEOUT = 300.0


def launcher_argv(config: ServerConfig) -> list[str]:
    """The stdio command line: the server's argv, behind the launcher when ``pdeathsig`` is on."""
    if not config.pdeathsig:
        return config.argv()
    return [sys.executable, "-I", "-S", LAUNCHER, str(os.getpid()), *config.argv()]


class StderrCapture:
    """A pipe for a stdio server's stderr, drained line by line into the log.

    Learns the server pid from the launcher's marker line (:attr:`pid`).
    Use :attr:`file` as the SDK's ``errlog``; call :meth:`spawned` once the
    child exists (closes the parent's write end) and :meth:`close` at the end.
    """

    def __init__(self, config: ServerConfig) -> None:
        self._config = config
        read_fd, write_fd = os.pipe()
        self.file: IO[str] = os.fdopen(write_fd, "w")
        self._read_file = os.fdopen(read_fd, "rb")
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self.pid: int | None = None
        self._task: asyncio.Task[None] | None = None

    def spawned(self) -> None:
        """The child holds the write end now: close ours and start draining."""
        self.file.close()
        self._task = asyncio.get_running_loop().create_task(self._drain(), name=f"mcp-stderr-{self._config.alias}")

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), self._read_file)
        try:
            while line := await reader.readline():
                self._on_line(line.decode("utf-8", "replace").rstrip("\n"))
        except (ValueError, OSError):  # an over-long line or a closed pipe: stop draining
            pass
        finally:
            transport.close()

    def _on_line(self, text: str) -> None:
        if text.startswith(PID_MARKER) and self.pid is None:
            with contextlib.suppress(ValueError):
                self.pid = int(text[len(PID_MARKER) :])
            return
        text = self._config.redact(text)
        self.tail.append(text)
        logger.debug("MCP server %r stderr: %s", self._config.alias, text)

    def tail_text(self) -> str:
        """The last stderr lines, redacted, newline-joined."""
        return "\n".join(self.tail)

    async def close(self) -> None:
        """Stop draining (after reading what is left, at most 0.5 s) and close both ends."""
        if not self.file.closed:
            self.file.close()
        if self._task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(0.5):
                    await asyncio.shield(self._task)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        else:
            self._read_file.close()

    def kill(self) -> None:
        """SIGKILL the server's process group now (a hung or stopped server); no-op without a pid."""
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def open_stdio(config: ServerConfig, capture: StderrCapture) -> AsyncIterator[Any]:
    """Spawn the server (through the launcher) with the SDK's ``stdio_client``."""
    from mcp.client.stdio import StdioServerParameters, stdio_client

    argv = launcher_argv(config)
    # tracing on: the server gets this worker's OTEL_* settings (docs/architecture.md, Tracing)
    env = {**tracing.child_env(), **(config.env or {})}
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=config.cwd)
    async with stdio_client(params, errlog=cast(TextIO, capture.file)) as streams:
        capture.spawned()
        yield streams


@contextlib.asynccontextmanager
async def open_http(config: ServerConfig, on_session_lost: Callable[[str], None]) -> AsyncIterator[Any]:
    """Connect with the SDK's ``streamable_http_client`` over an ``httpx2`` client carrying the auth headers.

    ``on_session_lost(reason)`` is called when the server answers our session id with 400/404.
    """
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from smith_worker.mcp.http import McpHttpTransport

    timeout = httpx2.Timeout(config.connect_timeout, read=max(HTTP_READ_TIMEOUT, config.request_timeout + 5.0))
    transport = McpHttpTransport(config.alias, RetryPolicy(max_retries=config.max_retries), on_session_lost)
    async with httpx2.AsyncClient(headers=config.http_headers(), timeout=timeout, transport=transport) as client:
        assert config.url is not None
        async with streamable_http_client(config.url, http_client=client) as streams:
            yield streams[0], streams[1]


def open_transport(
    config: ServerConfig, capture: StderrCapture | None, on_lost: Callable[[str], None]
) -> contextlib.AbstractAsyncContextManager[Any]:
    """The transport of ``config``: :func:`open_stdio` (needs ``capture``) or :func:`open_http`.

    ``on_lost(reason)``: the transport saw the connection end (HTTP: the server lost our session).
    """
    if config.kind == "stdio":
        assert capture is not None
        return open_stdio(config, capture)
    return open_http(config, on_lost)
