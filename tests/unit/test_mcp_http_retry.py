"""The MCP HTTP transport's retry table and stale-session rules (docs/architecture.md, HTTP retry policy).

Fast unit tests of :class:`~smith_worker.mcp.http.McpHttpTransport` in front of a scripted
``httpx2.MockTransport`` (the network below it, not the SDK); sleeps are recorded, not waited.
The same behaviour against real SDK servers is in test_mcp_http.py.
"""

from __future__ import annotations

import httpx2
import orjson
import pytest

from smith_worker.mcp.http import McpHttpTransport, rpc_method, says_session_lost
from smith_worker.ops.retry import RetryPolicy

JITTER = 0.1  # rng() = 0.4 → 0.4 * 0.25 s


class Script:
    """Replies in order: an ``httpx2.Response`` or an exception to raise; records the requests."""

    def __init__(self, *replies: httpx2.Response | Exception) -> None:
        self.replies = list(replies)
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def transport(script: Script, lost: list[str], sleeps: list[float], **policy) -> McpHttpTransport:
    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    return McpHttpTransport("web", RetryPolicy(**policy), lost.append, inner=httpx2.MockTransport(script),
                            sleep=sleep, rng=lambda: 0.4)


async def send(t: McpHttpTransport, method: str, session: str | None = None) -> httpx2.Response:
    headers = {"mcp-session-id": session} if session else {}
    async with httpx2.AsyncClient(transport=t) as client:
        return await client.post("http://mcp.test/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method},
                                 headers=headers)


def refused() -> httpx2.ConnectError:
    return httpx2.ConnectError("connection refused")


@pytest.mark.parametrize("method", ["initialize", "tools/list", "tools/call"])
async def test_connect_failures_are_retried_with_backoff_for_every_method(method):
    script, lost, sleeps = Script(refused(), refused(), httpx2.Response(200, json={})), [], []
    assert (await send(transport(script, lost, sleeps), method)).status_code == 200
    assert sleeps == [0.5 + JITTER, 1.0 + JITTER] and len(script.requests) == 3


async def test_5xx_and_429_follow_the_table_and_retries_run_out():
    script = Script(httpx2.Response(503), httpx2.Response(429, headers={"Retry-After": "2"}), httpx2.Response(500),
                    httpx2.Response(502))
    lost, sleeps = [], []
    response = await send(transport(script, lost, sleeps), "resources/read")
    assert response.status_code == 502  # 3 retries used: the last answer goes to the SDK as it is
    assert sleeps == [0.5 + JITTER, 2.0, 2.0 + JITTER]


async def test_retry_after_beyond_the_cap_is_not_waited_for():
    script, lost, sleeps = Script(httpx2.Response(429, headers={"Retry-After": "30"})), [], []
    assert (await send(transport(script, lost, sleeps), "ping")).status_code == 429
    assert sleeps == []


async def test_a_tools_call_that_may_have_reached_the_server_is_never_resent():
    for reply in (httpx2.Response(503), httpx2.RemoteProtocolError("server disconnected without a response")):
        script, lost, sleeps = Script(reply, httpx2.Response(200, json={})), [], []
        t = transport(script, lost, sleeps)
        if isinstance(reply, Exception):
            with pytest.raises(httpx2.RemoteProtocolError):
                await send(t, "tools/call")
        else:
            assert (await send(t, "tools/call")).status_code == 503
        assert len(script.requests) == 1 and sleeps == []
    # the same broken connection on a read-only request is resent
    script, lost, sleeps = Script(httpx2.RemoteProtocolError("gone"), httpx2.Response(200, json={})), [], []
    assert (await send(transport(script, lost, sleeps), "prompts/get")).status_code == 200
    assert len(script.requests) == 2


def _rpc_error(code: int, message: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


@pytest.mark.parametrize(("status", "body", "expected"), [
    (404, _rpc_error(-32600, "Session not found"), True),  # the SDK's server
    (400, _rpc_error(-32000, "Bad Request: No valid session ID provided"), True),  # server-everything
    (404, b"<html>not found</html>", True),
    (400, _rpc_error(-32602, "Invalid params: text is required"), False),  # about the request, not the session
    (400, _rpc_error(-32600, "Bad Request: Unsupported protocol version"), False),
    (404, _rpc_error(-32600, "Not Found"), True),
    (404, _rpc_error(-32601, "Method not found"), False),
    (500, _rpc_error(-32603, "session store exploded"), False),
])
def test_which_answers_mean_a_lost_session(status, body, expected):
    assert says_session_lost(status, body) is expected


async def test_a_stale_session_is_reported_before_the_sdk_sees_the_answer_and_not_retried():
    body = _rpc_error(-32600, "Session not found")
    script, lost, sleeps = Script(httpx2.Response(404, content=body, headers={"content-type": "application/json"})), [], []
    response = await send(transport(script, lost, sleeps), "tools/list", session="abc")
    assert lost == ["session expired"] and response.status_code == 404 and response.content == body
    # without a session id a 404 is only an answer (e.g. METHOD_NOT_FOUND from a gateway)
    script = Script(httpx2.Response(404, content=body))
    await send(transport(script, lost, sleeps), "tools/list")
    assert lost == ["session expired"] and sleeps == []


def test_rpc_method_of_a_request():
    post = httpx2.Request("POST", "http://h/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "tools/call"})
    assert rpc_method(post) == "tools/call"
    assert rpc_method(httpx2.Request("GET", "http://h/mcp")) is None
    assert rpc_method(httpx2.Request("POST", "http://h/mcp", content=b"[1, 2]")) is None


def test_json_rpc_errors_that_say_the_session_is_unknown():
    from mcp.shared.exceptions import MCPError

    from smith_worker.mcp.errors import is_session_terminated

    assert is_session_terminated(MCPError(code=-32600, message="Session terminated"))  # the SDK's 404
    assert is_session_terminated(MCPError(code=-32000, message="Bad Request: No valid session ID provided"))
    assert is_session_terminated(MCPError(code=-32600, message="Session not found"))
    assert not is_session_terminated(MCPError(code=-32602, message="Invalid params: session_name is required"))
    assert not is_session_terminated(ValueError("session not found"))  # not a JSON-RPC error
