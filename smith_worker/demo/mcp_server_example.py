"""The bundled example MCP server, built with the official ``mcp`` SDK.

Tools ``echo(text)`` and ``now()``, one resource (``example://info``) and one
prompt (``greet(name)``), served over stdio::

    python -m smith_worker.demo.mcp_server_example      # or: python path/to/mcp_server_example.py

The demo app registers it with ``app.mcp_server("example", command=sys.executable, args=[path])``;
its tools then reach the model as ``mcp_example__echo`` and ``mcp_example__now``.

Two choices keep a call at about half the SDK defaults' latency (BENCHMARKS.md, MCP):

* the handlers are ``async def``: the SDK runs a plain ``def`` tool in a worker
  thread, one thread hand-off per call;
* stdin and stdout are served by the event loop (:func:`serve_stdio`), not by the SDK's
  default ``anyio.wrap_file`` streams, which hand every line read, write and flush
  to a worker thread (three more hand-offs per call). The transport is still the
  SDK's ``stdio_server``, given these streams; when stdin/stdout are not pipes or
  sockets (a terminal, a file) the SDK default is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import os
import stat
import sys
from collections.abc import AsyncIterator

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server

server = MCPServer("agent-smith-example", version="1.0.0", log_level="WARNING")

#: Longest JSON-RPC line read from stdin, bytes.
MAX_LINE = 64 << 20


@server.tool()
async def echo(text: str) -> str:
    """Return `text` unchanged."""
    return text


@server.tool()
async def now() -> str:
    """The current UTC time, ISO 8601 (seconds)."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


@server.resource("example://info", name="info", description="What this server is.", mime_type="text/plain")
async def info() -> str:
    """A short description of this server."""
    return f"Agent Smith example MCP server (pid {os.getpid()}): tools echo and now, prompt greet."


@server.prompt()
async def greet(name: str) -> str:
    """A one-line greeting prompt for `name`."""
    return f"Say hello to {name} in one short sentence."


class _LineReader:
    """stdin lines (text) for ``stdio_server``, read by the event loop."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _LineReader:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", "replace")


class _LineWriter:
    """stdout for ``stdio_server``: ``write`` goes to the pipe at once (buffered by the loop if it is full)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, text: str) -> None:
        self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self._writer.drain()


def _is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@contextlib.asynccontextmanager
async def _loop_stdio() -> AsyncIterator[tuple[_LineReader, _LineWriter]]:
    """Take over fds 0 and 1 for the wire (like the SDK: stray prints go to stderr, reads of stdin get EOF)."""
    loop = asyncio.get_running_loop()
    wire_in, wire_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    reader = asyncio.StreamReader(limit=MAX_LINE)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", buffering=0)
    )
    write_transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", buffering=0)
    )
    try:
        yield _LineReader(reader), _LineWriter(asyncio.StreamWriter(write_transport, protocol, None, loop))
    finally:
        read_transport.close()
        write_transport.close()


async def serve_stdio() -> None:
    """Serve ``server`` over stdio until stdin closes (event-loop pipes when possible, see module doc)."""
    if not (sys.platform != "win32" and _is_pipe(0) and _is_pipe(1)):
        await server.run_stdio_async()
        return
    lowlevel = server._lowlevel_server  # what run_stdio_async serves (the SDK's own Client reads it too)
    async with _loop_stdio() as (stdin, stdout), stdio_server(stdin=stdin, stdout=stdout) as (read, write):  # type: ignore[arg-type]
        await lowlevel.run(read, write, lowlevel.create_initialization_options())


def main() -> None:
    """Serve over stdio until stdin closes.

    With ``SMITH_OTEL=1`` in its environment (a tracing worker passes its ``OTEL_*`` settings on:
    docs/architecture.md, Tracing) each request is a span, a child of the caller's span whose trace context
    the request's ``_meta`` carries (the MCP SDK's server middleware makes it once a tracer provider is set);
    a message without one (the ``notifications/initialized`` of a handshake) is not recorded.
    """
    if os.environ.get("SMITH_OTEL", "").strip().lower() not in ("1", "true", "yes", "on"):
        anyio.run(serve_stdio)
        return
    try:  # imported only then: it brings smith_client along
        from smith_worker.ops import tracing
    except ImportError as exc:  # run as a script beside another smith_worker (or none): serve untraced
        print(f"mcp_server_example: tracing off ({exc})", file=sys.stderr)
        anyio.run(serve_stdio)
        return
    # only spans continuing a caller's trace: ParentBased(root=ALWAYS_OFF), whatever sampler the worker passed on
    # (its sampling decision comes along in the trace context); a handshake makes no one-span trace of its own
    os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_always_off"
    tracing.setup(True, "agent-smith-mcp-example")
    try:
        anyio.run(serve_stdio)
    finally:
        tracing.shutdown()


if __name__ == "__main__":
    main()
