"""A stdio MCP server for pool tests.

Tools: ``echo``, ``now``, ``pid``, ``slow(seconds, tag)`` (logs start / cancelled / done to
``$LAB_LOG``; also as ``slow_idempotent``), ``crash`` (``os._exit``), ``fail`` (raises → ``isError``), ``stats``
(structured only), ``embedded`` (text + blob resource), ``picture`` (image), ``notify``
(a ``notifications/message``), ``add_tool(name)`` (registers a tool and sends
``notifications/tools/list_changed``), ``progress(steps)`` (``steps`` progress notifications),
``sample`` (asks the client for ``sampling/createMessage``; returns the JSON-RPC error and its
round-trip ms), ``sample_text(prompt)`` (asks the client to sample ``prompt``; returns the text or the error),
``ask(question)`` (asks the client for a ``name`` with ``elicitation/create``; returns the action and the name),
``client_capabilities``, plus a dotted and a very long tool name.
Resources ``lab://info`` (text) and ``lab://blob`` (binary). Prompts ``greet`` and ``picture``.

Flags: ``--noisy`` writes non-JSON lines on stdout (at start and before every message);
``--ignore-eof`` keeps running after stdin closes (until SIGTERM/SIGKILL).
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import time

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.server.stdio import stdio_server
from pydantic import BaseModel

server = MCPServer("lab", version="1.0.0", log_level="WARNING")
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


def _log(line: str) -> None:
    path = os.environ.get("LAB_LOG")
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")


@server.tool()
def echo(text: str) -> str:
    """Return `text`."""
    return text


@server.tool()
def now() -> str:
    """Current time."""
    return time.strftime("%Y-%m-%dT%H:%M:%S")


@server.tool()
def pid() -> int:
    """This server's pid."""
    return os.getpid()


@server.tool()
async def slow(seconds: float, tag: str = "") -> str:
    """Sleep `seconds`; logs start, cancelled and done."""
    _log(f"start {tag}")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _log(f"cancelled {tag}")
        raise
    _log(f"done {tag}")
    return f"slept {seconds}"


server.add_tool(slow, name="slow_idempotent", description="Like slow; the tests mark it idempotent.")


@server.tool()
def crash() -> str:
    """Exit the process at once."""
    os._exit(3)


@server.tool()
def fail(reason: str = "bad input") -> str:
    """Always fails (an isError result)."""
    raise ValueError(reason)


@server.tool(structured_output=True)
def stats() -> dict[str, int]:
    """A structured result."""
    return {"calls": 3, "errors": 0}


@server.tool()
def embedded() -> list[types.ContentBlock]:
    """Text plus an embedded text resource and a blob resource."""
    return [
        types.TextContent(type="text", text="see attached"),
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(uri="lab://note", text="note body")),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
            uri="lab://bin", blob=base64.b64encode(b"\x00" * 10).decode(), mime_type="application/octet-stream")),
    ]


@server.tool()
def picture() -> list[types.ContentBlock]:
    """An image."""
    return [types.ImageContent(type="image", data=PNG, mime_type="image/png")]


@server.tool()
async def notify(message: str, ctx: Context) -> str:
    """Send a log notification, then answer."""
    await ctx.info(message)
    return "notified"


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Register tool `name` (echo-like) and announce the changed list."""
    def extra(text: str = "") -> str:
        return f"{name}:{text}"

    server.add_tool(extra, name=name, description=f"dynamic tool {name}")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
async def progress(steps: int, ctx: Context) -> str:
    """Report `steps` progress notifications, then answer."""
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, f"step {step}")
    return f"{steps} steps"


@server.tool()
async def sample(ctx: Context) -> dict[str, object]:
    """Ask the client to sample (it declared no sampling capability): the error it answers and how fast."""
    started = time.monotonic()
    try:
        await ctx.session.create_message([types.SamplingMessage(
            role="user", content=types.TextContent(type="text", text="hi"))], max_tokens=5)
    except Exception as exc:  # the client refuses: MCPError(code, message)
        return {"code": getattr(exc, "code", None), "message": str(exc),
                "ms": round((time.monotonic() - started) * 1000, 1)}
    return {"code": None, "message": "the client sampled", "ms": None}


class Name(BaseModel):
    name: str


@server.tool()
async def ask(question: str, ctx: Context) -> dict[str, object]:
    """Ask the person for a name (elicitation/create): the action the client answered and the name given."""
    result = await ctx.elicit(question, Name)
    return {"action": result.action, "name": result.data.name if result.action == "accept" else None}


@server.tool()
async def sample_text(prompt: str, ctx: Context) -> dict[str, object]:
    """Ask the client to sample `prompt`: the text and model it answered, or its error."""
    try:
        result = await ctx.session.create_message([types.SamplingMessage(
            role="user", content=types.TextContent(type="text", text=prompt))], max_tokens=50)
    except Exception as exc:  # the client refused: MCPError(code, message)
        return {"error": str(exc), "code": getattr(exc, "code", None)}
    content = result.content
    return {"text": getattr(content, "text", None), "model": result.model}


@server.tool()
def client_capabilities(ctx: Context) -> dict[str, object]:
    """The capabilities the client declared in ``initialize``."""
    params = ctx.session.client_params
    return params.capabilities.model_dump(by_alias=True, exclude_none=True) if params else {}


@server.tool(name="ns.tool/with-dots")
def dotted() -> str:
    """A tool whose name needs sanitizing."""
    return "dotted"


@server.tool(name="a_really_long_tool_name_that_goes_on_and_on_and_on_past_the_provider_limit")
def long_name() -> str:
    """A tool whose public name must be shortened."""
    return "long"


@server.resource("lab://info", name="info", description="Lab server facts.", mime_type="text/plain")
def info() -> str:
    return f"lab server pid {os.getpid()}"


@server.resource("lab://blob", name="blob", mime_type="application/octet-stream")
def blob() -> bytes:
    return b"\x00\x01\x02"


@server.prompt()
def greet(name: str) -> str:
    """Greet someone."""
    return f"Hello {name}!"


@server.prompt(name="picture")
def picture_prompt() -> list[UserMessage]:
    """A prompt with image content (not text)."""
    return [UserMessage(content=types.ImageContent(type="image", data=PNG, mime_type="image/png"))]


class NoisyStdout:
    """An async text file that writes a non-JSON line before every message."""

    def __init__(self) -> None:
        self._out = anyio.wrap_file(sys.stdout)

    async def write(self, text: str) -> int:
        await self._out.write("this is not JSON\n")
        return await self._out.write(text)

    async def flush(self) -> None:
        await self._out.flush()


async def serve(noisy: bool) -> None:
    lowlevel = server._lowlevel_server
    options = lowlevel.create_initialization_options(NotificationOptions(tools_changed=True))
    if noisy:
        print("lab server starting (not JSON)", flush=True)
        async with stdio_server(stdout=NoisyStdout()) as (read, write):
            await lowlevel.run(read, write, options)
    else:
        async with stdio_server() as (read, write):
            await lowlevel.run(read, write, options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--noisy", action="store_true")
    parser.add_argument("--ignore-eof", action="store_true")
    flags = parser.parse_args()
    anyio.run(serve, flags.noisy)
    if flags.ignore_eof:
        while True:  # stdin closed: a well-behaved server would exit here
            time.sleep(3600)


if __name__ == "__main__":
    main()
