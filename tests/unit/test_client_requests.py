"""Both clients refuse unknown turn options and calls after ``close()`` with typed errors (QA fixes 9, 10)."""

from __future__ import annotations

import fakeredis
import pytest

from smith_client import InvalidRequestError, SmithClient, TransportError
from smith_client.sync_client import SyncSmithClient


async def test_an_unknown_option_is_an_invalid_request_naming_it():
    client = SmithClient(fakeredis.FakeAsyncRedis(), prefix="t")
    for call in (lambda: client.send("hi", conversation_id="c1", bogus=1),
                 lambda: client.submit("hi", conversation_id="c1", bogus=1)):
        with pytest.raises(InvalidRequestError, match="bogus") as err:
            await call()
        assert err.value.fields["field"] == "bogus"
    with pytest.raises(InvalidRequestError, match="bogus"):
        async for _ in client.stream("hi", conversation_id="c1", bogus=1):
            pass


async def test_a_bad_id_is_quoted_cut_short_in_the_error():
    client = SmithClient(fakeredis.FakeAsyncRedis(), prefix="t")
    with pytest.raises(InvalidRequestError) as err:
        await client.send("hi", conversation_id="x" * 5000)
    assert err.value.fields["field"] == "conversation_id"
    assert "got 'xxxx" in err.value.message and len(err.value.message) < 200  # not the 5000 characters


def test_an_unknown_option_is_refused_by_the_sync_client_too():
    redis = fakeredis.FakeRedis()
    client = SyncSmithClient(redis, prefix="t")
    with pytest.raises(InvalidRequestError, match="bogus") as err:
        client.send("hi", conversation_id="c1", bogus=1)
    assert err.value.fields["field"] == "bogus"
    assert redis.keys("*") == []  # refused before anything was enqueued


def test_the_sync_client_refuses_calls_after_close():
    client = SyncSmithClient(fakeredis.FakeRedis(), prefix="t")
    assert client.history("c1") == []
    client.close()
    with pytest.raises(TransportError, match="closed"):
        client.history("c1")
    with pytest.raises(TransportError, match="closed"):
        client.send("hi", conversation_id="c1", timeout=1)


async def test_the_async_client_refuses_calls_after_close():
    client = SmithClient(fakeredis.FakeAsyncRedis(), prefix="t")
    assert await client.history("c1") == []
    await client.aclose()
    with pytest.raises(TransportError, match="closed"):
        await client.history("c1")
    with pytest.raises(TransportError, match="closed"):
        await client.send("hi", conversation_id="c1", timeout=1)
