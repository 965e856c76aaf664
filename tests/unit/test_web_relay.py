"""The web relay example (examples/web/app.py) in process, against a private redis-server that stops mid-stream."""

from __future__ import annotations

import asyncio
import logging

import httpx

from examples.web.app import app
from smith_client import SmithClient
from smith_client.events import TokenData
from smith_client.keys import Keys
from smith_worker.local.processes import start_redis_server

PREFIX = "relay"


async def subscribers(client: SmithClient, channel: str) -> int:
    return dict(await client.redis.pubsub_numsub(channel))[channel.encode()]


async def test_a_stream_whose_redis_stops_ends_cleanly_and_a_reconnect_gets_503(tmp_path, monkeypatch, caplog):
    """No error escapes once the response started (the ASGI transport would raise it here): the stream ends
    after the events it sent, logged; asking again while Redis is down answers 503 with ``Retry-After``."""
    server, url = start_redis_server(log_path=tmp_path / "redis.log")
    try:
        async with SmithClient.from_url(url, prefix=PREFIX) as client:
            turn_id = (await client.submit("hi", conversation_id="c1")).turn_id  # queued: no worker takes it
            for text in ("a", "b"):
                await client.events.publish(turn_id, TokenData(text=text))
            monkeypatch.setattr(app.state, "smith", client, raising=False)  # what the app's lifespan sets
            caplog.set_level(logging.WARNING, logger="agent_smith.web")
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://relay") as http:
                stream = asyncio.create_task(http.get(f"/turns/{turn_id}/events?after=0", timeout=30))
                channel = Keys(PREFIX).turn_events_channel(turn_id)
                async with asyncio.timeout(10):
                    while await subscribers(client, channel) == 0:  # the relay sent the log and follows live
                        await asyncio.sleep(0.05)
                await asyncio.to_thread(server.stop)
                reply = await stream
                again = await http.get(f"/turns/{turn_id}/events", headers={"Last-Event-ID": "2"})
    finally:
        server.stop()
    ids = [line for line in reply.text.splitlines() if line.startswith("id:")]
    assert reply.status_code == 200 and ids == ["id: 1", "id: 2"]
    assert f"turn {turn_id}: event stream ended after seq 2: Redis: " in caplog.text
    assert again.status_code == 503 and again.headers["retry-after"] == "1"
    assert again.json()["error"]["kind"] == "TransportError"

