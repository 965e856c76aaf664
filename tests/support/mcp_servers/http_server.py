"""Two Streamable HTTP MCP servers (official SDK, uvicorn) in one process on 127.0.0.1 free ports.

One answers with JSON bodies (``json_response=True``), the other with SSE
streams. Both require ``Authorization: Bearer <--token>`` (401 otherwise)
and record every request (HTTP method, ``Mcp-Session-Id``, whether the bearer
token matched (never the token itself), ``X-Lab``, response status and content type, the
server's monotonic arrival time ``at``, the JSON-RPC method and the ``tools/call`` tool name),
which the ``seen_requests`` tool returns.
Tools: ``echo``, ``seen_requests``, ``slow(seconds)``, ``drop_connection`` (never answered: the
TCP connection is aborted when its ``tools/call`` arrives).

Failure modes: ``--fail-first N`` answers the first N POSTs of each server with HTTP 503;
``--stale-status 400`` answers a session id this process did not issue with HTTP 400 and a
JSON-RPC error without id, as ``@modelcontextprotocol/server-everything`` does (the SDK's own
answer is 404 "Session not found").

Prints ``PORTS <json_port> <sse_port>`` on stdout once listening (``--ports`` binds given ones,
e.g. to restart on the same ports).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer


def build(name: str, seen: list[dict[str, Any]]) -> MCPServer:
    server = MCPServer(name, version="1.0.0", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Return `text`."""
        return text

    @server.tool()
    def seen_requests() -> list[dict[str, Any]]:
        """Requests this server has received."""
        return list(seen)

    @server.tool()
    async def slow(seconds: float) -> str:
        """Sleep `seconds`."""
        await asyncio.sleep(seconds)
        return "slept"

    @server.tool()
    def drop_connection() -> str:
        """Never runs: the request's connection is dropped before it reaches the server."""
        return "unreachable"

    return server


async def read_body(receive: Any) -> tuple[bytes, Any]:
    """The whole request body, and a ``receive`` that replays it before passing through (disconnects)."""
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


def rpc_of(body: bytes) -> tuple[str | None, str | None]:
    """``(JSON-RPC method, tool name of a tools/call)`` of a request body."""
    try:
        data = json.loads(body)
    except ValueError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    params = data.get("params") if isinstance(data.get("params"), dict) else {}
    return data.get("method"), params.get("name") if data.get("method") == "tools/call" else None


async def respond(send: Any, status: int, body: bytes, content_type: bytes = b"application/json") -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]})
    await send({"type": "http.response.body", "body": body})


def guard(app: Any, token: str, seen: list[dict[str, Any]], flags: argparse.Namespace) -> Any:
    """ASGI wrapper: bearer check, request recording and the failure modes chosen by ``flags``."""
    sessions: set[str] = set()  # ids this process issued
    failures = {"left": flags.fail_first}

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        cycle = receive.__self__  # uvicorn's RequestResponseCycle (receive is its bound method)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        authorized = headers.get("authorization") == f"Bearer {token}"
        session = headers.get("mcp-session-id")
        entry = {"method": scope["method"], "session": session, "authorized": authorized,
                 "x_lab": headers.get("x-lab"), "content_type": None, "status": None, "at": time.monotonic(),
                 "rpc": None, "tool": None}
        seen.append(entry)
        if scope["method"] == "POST":
            body, receive = await read_body(receive)
            entry["rpc"], entry["tool"] = rpc_of(body)

        async def recording_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
                for k, v in message.get("headers", []):
                    if k.decode().lower() == "content-type":
                        entry["content_type"] = v.decode()
                    if k.decode().lower() == "mcp-session-id":
                        sessions.add(v.decode())
            await send(message)

        if not authorized:
            return await respond(recording_send, 401, b"unauthorized", b"text/plain")
        if failures["left"] > 0 and scope["method"] == "POST":
            failures["left"] -= 1
            return await respond(recording_send, 503, b"try again later", b"text/plain")
        if entry["tool"] == "drop_connection":  # no answer at all: the TCP connection is dropped
            entry["status"] = "dropped"
            return cycle.transport.abort()  # uvicorn's request cycle owns the connection's transport
        if flags.stale_status == 400 and session is not None and session not in sessions:
            # @modelcontextprotocol/server-everything's answer to an unknown session id
            return await respond(recording_send, 400, json.dumps({
                "jsonrpc": "2.0", "id": None,
                "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"}}).encode())
        await app(scope, receive, recording_send)

    return asgi


def listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)  # connections queue from now on, so the PORTS line means "ready"
    return sock


async def main(token: str, ports_wanted: list[int], flags: argparse.Namespace) -> None:
    servers, ports = [], []
    for (name, json_response), port in zip((("lab-json", True), ("lab-sse", False)), ports_wanted):
        seen: list[dict[str, Any]] = []
        app = build(name, seen).streamable_http_app(json_response=json_response)
        sock = listen(port)
        ports.append(sock.getsockname()[1])
        config = uvicorn.Config(guard(app, token, seen, flags), log_level="warning", lifespan="on")
        servers.append(uvicorn.Server(config).serve(sockets=[sock]))
    print("PORTS", *ports, flush=True)
    await asyncio.gather(*servers)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--token", required=True)
    parser.add_argument("--ports", type=int, nargs=2, default=[0, 0], help="ports to bind (0: any free port)")
    parser.add_argument("--fail-first", type=int, default=0, help="answer the first N POSTs with 503")
    parser.add_argument("--stale-status", type=int, choices=[400, 404], default=404,
                        help="status for an unknown session id (404: the SDK's own answer)")
    flags = parser.parse_args()
    asyncio.run(main(flags.token, flags.ports, flags))
