"""Two Streamable HTTP MCP servers (official SDK, uvicorn) in one process on 127.0.0.1 free ports.

One answers with JSON bodies (``json_response=True``), the other with SSE
streams. Both require ``Authorization: Bearer <--token>`` (401 otherwise)
and record every request (method, ``Mcp-Session-Id``, whether the bearer
token matched (never the token itself), ``X-Lab``, response content type), which the ``seen_requests`` tool returns.
Tools: ``echo``, ``seen_requests``, ``slow(seconds)``.

Prints ``PORTS <json_port> <sse_port>`` on stdout once listening (``--ports`` binds given ones,
e.g. to restart on the same ports).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
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

    return server


def guard(app: Any, token: str, seen: list[dict[str, Any]]) -> Any:
    """ASGI wrapper: bearer check and request recording."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        authorized = headers.get("authorization") == f"Bearer {token}"
        entry = {"method": scope["method"], "session": headers.get("mcp-session-id"),
                 "authorized": authorized, "x_lab": headers.get("x-lab"), "content_type": None}
        seen.append(entry)
        if not authorized:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return

        async def recording_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                for k, v in message.get("headers", []):
                    if k.decode().lower() == "content-type":
                        entry["content_type"] = v.decode()
            await send(message)

        await app(scope, receive, recording_send)

    return asgi


def listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)  # connections queue from now on, so the PORTS line means "ready"
    return sock


async def main(token: str, ports_wanted: list[int]) -> None:
    servers, ports = [], []
    for (name, json_response), port in zip((("lab-json", True), ("lab-sse", False)), ports_wanted):
        seen: list[dict[str, Any]] = []
        app = build(name, seen).streamable_http_app(json_response=json_response)
        sock = listen(port)
        ports.append(sock.getsockname()[1])
        config = uvicorn.Config(guard(app, token, seen), log_level="warning", lifespan="on")
        servers.append(uvicorn.Server(config).serve(sockets=[sock]))
    print("PORTS", *ports, flush=True)
    await asyncio.gather(*servers)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--token", required=True)
    parser.add_argument("--ports", type=int, nargs=2, default=[0, 0], help="ports to bind (0: any free port)")
    flags = parser.parse_args()
    asyncio.run(main(flags.token, flags.ports))
