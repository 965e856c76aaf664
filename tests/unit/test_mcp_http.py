"""Streamable HTTP MCP servers on loopback (issue 5 acceptance 4): session id, JSON and SSE, bearer token.

One process (tests/support/mcp_servers/http_server.py) runs two official-SDK servers on free
127.0.0.1 ports: one answering with JSON bodies, one with SSE streams.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from smith_client.errors import McpError
from smith_worker.mcp import ServerConfig, ServerHandle
from tests.support.mcp_servers import HTTP_SERVER

TOKEN = "tok-5d1f9c0e-very-secret"


class HttpServers:
    """The server process; :meth:`restart` replaces it on the same ports (sessions are forgotten)."""

    def __init__(self) -> None:
        self.ports = (0, 0)
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> HttpServers:
        self.proc = subprocess.Popen([sys.executable, HTTP_SERVER, "--token", TOKEN, "--ports", *map(str, self.ports)],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["PORTS"], line
        self.ports = (int(line[1]), int(line[2]))
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="module")
def http_servers():
    servers = HttpServers().start()
    yield servers
    servers.stop()


@pytest.fixture(scope="module")
def http_ports(http_servers):
    return http_servers.ports


def http_config(alias: str, port: int, token: str = TOKEN, **options) -> ServerConfig:
    return ServerConfig(alias, url=f"http://127.0.0.1:{port}/mcp", bearer_token=token,
                        headers={"X-Lab": "lab-header"}, **options)


@pytest.mark.parametrize("mode", ["json", "sse"])
async def test_session_id_kept_bearer_sent_and_both_response_kinds(http_ports, mode, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, SDK and HTTP client included
    port = http_ports[0] if mode == "json" else http_ports[1]
    handle = ServerHandle(http_config(f"web-{mode}", port))
    try:
        catalog = await handle.catalog()
        assert handle.connection.init.protocol_version == "2025-06-18"
        assert "mcp_web-" + mode + "__echo" in catalog.tool_names()
        for i in range(3):
            assert (await handle.call_tool("echo", {"text": f"h{i}"})).content == f"h{i}"
        seen = (await handle.call_tool("seen_requests", {})).structured["result"]
    finally:
        await handle.close()
    posts = [r for r in seen if r["method"] == "POST"]
    session_ids = {r["session"] for r in posts[1:]}
    assert posts[0]["session"] is None and len(session_ids) == 1 and None not in session_ids  # kept across requests
    assert all(r["authorized"] and r["x_lab"] == "lab-header" for r in seen)  # bearer token and headers sent
    expected = "application/json" if mode == "json" else "text/event-stream"
    # initialize, the listings and the 3 echo calls were answered in this server's style
    # (only the notifications/initialized POST gets a bodiless 202)
    answered = [r for r in posts if (r["content_type"] or "").startswith(expected)]
    assert len(answered) >= 5 and len(answered) >= len(posts) - 1
    assert TOKEN not in caplog.text  # never logged, at any level, by anyone
    assert caplog.records  # (the capture did see the traffic)


async def test_wrong_token_is_a_typed_error_without_the_token(http_ports, caplog):
    caplog.set_level(logging.DEBUG)
    handle = ServerHandle(http_config("web-bad", http_ports[0], token="wrong-token-123", backoff_base=30))
    try:
        with pytest.raises(McpError) as info:
            await handle.catalog()
    finally:
        await handle.close()
    assert "wrong-token-123" not in info.value.message and "wrong-token-123" not in caplog.text


async def test_a_restarted_server_gets_a_new_session_after_one_retry(http_servers):
    """The old session is gone (HTTP 404, or the stream ends): a read-only request reconnects and is sent
    once more; later calls use the new session (runs last: it restarts the module's server)."""
    handle = ServerHandle(http_config("web-restart", http_servers.ports[0], backoff_base=0.05))
    try:
        assert (await handle.call_tool("echo", {"text": "before"})).content == "before"
        first = handle.connection.generation
        http_servers.restart()
        await handle.ping(deadline=time.monotonic() + 10)  # read-only: retried on the new connection
        assert handle.connection.generation > first
        assert (await handle.call_tool("echo", {"text": "after"})).content == "after"
        seen = (await handle.call_tool("seen_requests", {})).structured["result"]
    finally:
        await handle.close()
    sessions = {r["session"] for r in seen if r["session"]}
    assert len(sessions) == 1  # the new server only ever saw the new session (after its initialize)
