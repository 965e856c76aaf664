"""Streamable HTTP MCP servers on loopback: session id, JSON and SSE, bearer token.

One process (tests/support/mcp_servers/http_server.py) runs two official-SDK servers on free
127.0.0.1 ports: one answering with JSON bodies, one with SSE streams.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time

import pytest

from smith_client.errors import McpError, McpProtocolError, SmithError, TransportError
from smith_worker.mcp import LifecycleEvent, LifecycleKind, ServerConfig, ServerHandle
from tests.support.mcp_servers import HTTP_SERVER

TOKEN = "tok-5d1f9c0e-very-secret"


class HttpServers:
    """The server process; :meth:`restart` replaces it on the same ports (sessions are forgotten)."""

    def __init__(self, *flags: str) -> None:
        self.ports = (0, 0)
        self.flags = flags
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> HttpServers:
        self.proc = subprocess.Popen([sys.executable, HTTP_SERVER, "--token", TOKEN, "--ports", *map(str, self.ports),
                                      *self.flags], stdout=subprocess.PIPE, text=True)
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


async def test_a_tools_call_answered_by_a_dropped_connection_is_not_resent(http_ports):
    """The server drops the TCP connection of a ``tools/call``
    without answering; the call fails with one typed error and is never resent (counted server-side)."""
    handle = ServerHandle(http_config("web-drop", http_ports[0], backoff_base=0.05))
    try:
        with pytest.raises(TransportError) as info:
            await handle.call_tool("drop_connection", {})
        assert "not retried" in info.value.message
        assert (await handle.call_tool("echo", {"text": "next"})).content == "next"  # a new connection
        seen = (await handle.call_tool("seen_requests", {})).structured["result"]
    finally:
        await handle.close()
    assert [r["status"] for r in seen if r["tool"] == "drop_connection"] == ["dropped"]


async def _seen(handle: ServerHandle) -> list[dict]:
    return (await handle.call_tool("seen_requests", {})).structured["result"]


async def test_503_twice_then_discovery_succeeds_after_two_backoffs(caplog):
    """HTTP 503, 503, then 200: discovery succeeds after two backoffs of the HTTP retry policy
    (0.5 s + U(0, 0.25 s), then 1 s + U(0, 0.25 s); gaps checked with a generous ceiling)."""
    caplog.set_level(logging.WARNING, logger="agent_smith.mcp")
    servers = HttpServers("--fail-first", "2").start()
    handle = ServerHandle(http_config("web-503", servers.ports[0]))
    try:
        catalog = await handle.catalog()
        seen = await _seen(handle)
    finally:
        await handle.close()
        servers.stop()
    assert "mcp_web-503__echo" in catalog.tool_names()
    first = [r for r in seen if r["method"] == "POST"][:3]
    assert [(r["rpc"], r["status"]) for r in first] == [("initialize", 503), ("initialize", 503), ("initialize", 200)]
    gaps = [b["at"] - a["at"] for a, b in zip(first, first[1:])]
    assert 0.5 <= gaps[0] < 0.75 * 5 and 1.0 <= gaps[1] < 1.25 * 5
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == 2 and "HTTP 503" in retries[0] and "retry 1/3" in retries[0] and "retry 2/3" in retries[1]


@pytest.mark.parametrize("stale_status", [404, 400])
async def test_server_restarted_while_idle_with_a_call_every_second(stale_status):
    """An SDK-built server is stopped and restarted on the same port while the pool
    is idle; calls keep arriving every second. The stale session (HTTP 404 from the SDK; HTTP 400 with a
    JSON-RPC error without id, as server-everything answers) ends the connection (``disconnected``) and a
    new session is made: the first call after the restart succeeds or fails with one typed error, every
    later call succeeds."""
    servers = HttpServers("--stale-status", str(stale_status)).start()
    handle = ServerHandle(http_config(f"web-stale-{stale_status}", servers.ports[0]))
    heard: list[LifecycleEvent] = []

    async def listener(event):
        if isinstance(event, LifecycleEvent):
            heard.append(event)

    handle.events.listeners.append(listener)
    outcomes: list[object] = []
    try:
        for i in range(4):
            if i == 1:
                await asyncio.to_thread(servers.restart)  # between calls: nothing in flight
            tick = time.monotonic()
            try:
                outcomes.append((await handle.call_tool("echo", {"text": f"call {i}"})).content)
            except SmithError as exc:
                outcomes.append(exc)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        seen = await _seen(handle)
        await handle.events.drain()
    finally:
        await handle.close()
        servers.stop()
    assert outcomes[0] == "call 0"
    first, later = outcomes[1], outcomes[2:]
    assert first == "call 1" or isinstance(first, TransportError), first
    assert later == ["call 2", "call 3"]
    kinds = [(e.kind, e.fields.get("reason"), e.fields.get("generation")) for e in heard]
    assert (LifecycleKind.DISCONNECTED, "session expired", 1) in kinds  # it left the ready state, and said so
    assert kinds.index((LifecycleKind.DISCONNECTED, "session expired", 1)) < kinds.index(
        (LifecycleKind.CONNECTED, None, 2))
    stale = [r for r in seen if r["session"] and r["status"] == stale_status]
    assert stale and len({r["session"] for r in seen if r["session"] and r["status"] != stale_status}) == 1


async def test_failed_calls_do_not_suppress_the_health_ping(http_ports):
    """Requests that keep failing are no proof of a healthy session, so the health ping
    still runs after ``health_interval`` seconds without a success (pings counted server-side)."""
    handle = ServerHandle(http_config("web-ping", http_ports[0], health_interval=0.5))
    try:
        await handle.catalog()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # a failing request every 0.1 s
            with pytest.raises(McpProtocolError):
                await handle.get_prompt("no-such-prompt")
            await asyncio.sleep(0.1)
        seen = await _seen(handle)
    finally:
        await handle.close()
    session = seen[-1]["session"]  # this connection's requests (the server's list is shared by the module)
    assert [r for r in seen if r["session"] == session and r["rpc"] == "ping"]


async def test_a_forgotten_session_resends_read_only_requests_but_not_a_tools_call(http_ports):
    """The server forgets our session (here: a DELETE for it from elsewhere); a ``ping``
    answered 404 is sent once more on a new session and succeeds; a ``tools/call`` answered 404 becomes one
    typed error (not resent) and the next call succeeds."""
    import httpx2

    url = f"http://127.0.0.1:{http_ports[0]}/mcp"
    handle = ServerHandle(http_config("web-forgot", http_ports[0]))

    async def forget_session() -> None:
        session = (await _seen(handle))[-1]["session"]
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as other:
            assert (await other.delete(url, headers={"mcp-session-id": session})).status_code == 200

    try:
        await handle.catalog()
        await forget_session()
        await handle.ping()  # read-only: resent on the next connection
        assert handle.connection.generation == 2
        await forget_session()
        with pytest.raises(TransportError) as info:
            await handle.call_tool("echo", {"text": "lost"})
        assert "session expired" in info.value.message and "not retried" in info.value.message
        assert (await handle.call_tool("echo", {"text": "next"})).content == "next"
        seen = await _seen(handle)
    finally:
        await handle.close()
    # the lost tools/call was sent once, never again: the next echo the server saw is the "next" call
    assert [r["status"] for r in seen if r["tool"] == "echo"][-2:] == [404, 200]
    assert [r["status"] for r in seen if r["rpc"] == "ping"][-2:] == [404, 200]
