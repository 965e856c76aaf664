"""Key hygiene: after 500 turns no project key lives forever without an owner."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import pytest

from smith_client.hygiene import conversation_keys, keys_without_ttl
from smith_worker.testing import Reply, Script

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]


async def test_500_turns_leave_no_key_without_ttl_or_owner(client, scenario, redis_url, prefix):
    _, plain = scenario(Script(Reply.text("ok")))
    _, tools = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 1})]), Reply.text("2")))
    run = uuid.uuid4().hex[:6]

    async def conversation(n: int) -> None:
        for i in range(20):  # 25 conversations x 20 turns, one in five with a tool job
            marker = tools if i % 5 == 0 else plain
            await client.send(f"{marker} {i}", conversation_id=f"hyg-{run}-{n}", agent="default", timeout=60)

    await asyncio.gather(*(conversation(n) for n in range(25)))
    assert await keys_without_ttl(client.redis, client.keys) == []
    # the scan does see a key that would live forever
    await client.redis.set(f"{prefix}:probe", "x")
    assert await keys_without_ttl(client.redis, client.keys) == [f"{prefix}:probe"]
    await client.redis.delete(f"{prefix}:probe")

    report = await conversation_keys(client.redis, client.keys, f"hyg-{run}-0")
    kinds = {info.key.rsplit(":", 1)[-1] for info in report}
    assert {"history", "state", "log", "seq"} <= kinds
    assert any(":toolres:" in info.key for info in report)
    assert all(info.ttl > 0 for info in report)
    proc = subprocess.run(
        [sys.executable, "-c", "from smith_client.cli import smith_main; smith_main()", "--redis-url", redis_url,
         "--prefix", prefix, "--conversation", f"hyg-{run}-0", "keys"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0 and f"{prefix}:conv:hyg-{run}-0:history" in proc.stdout
