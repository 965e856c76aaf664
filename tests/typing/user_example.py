"""A user's code on the public client API, type-checked by ``mypy --strict`` and pyright, never run
(``tests/unit/test_public_types.py``).

A ``reveal_type`` line ending ``# expect: T`` must reveal the type ``T`` in both
checkers (module names left out); a line ending ``# expect-error`` is a misuse
both must report. No other line may be reported.
"""

from __future__ import annotations

from typing import reveal_type

from smith_client import AssistantMessage, Event, SmithClient, SyncSmithClient, TurnHandle


async def use_async() -> None:
    async with SmithClient.from_url(prefix="demo", socket_timeout=5.0) as client:
        reveal_type(client)  # expect: SmithClient
        reveal_type(await client.send("What is 17*23?", conversation_id="c1", timeout=60))  # expect: AssistantMessage
        reveal_type(client.stream("And times 2?", conversation_id="c1"))  # expect: AsyncGenerator[Event, None]
        async for event in client.stream("And times 2?", conversation_id="c1", agent="default"):
            reveal_type(event)  # expect: Event
            print(event.seq, event.type, event.payload)
        reveal_type(await client.submit("long task", conversation_id="c2"))  # expect: TurnHandle
        handle = await client.submit("long task", conversation_id="c2", turn_id="order-42", multitask="enqueue")
        async for event in client.turn(handle.turn_id).events(after_seq=17):
            print(event.seq)
        reveal_type(await handle.cancel())  # expect: str
        reveal_type(await handle.status())  # expect: str
        reveal_type(await handle.result(timeout=60))  # expect: AssistantMessage
        reveal_type(await client.history("c1"))  # expect: list[Message]
        reveal_type(await client.active_skills("c1"))  # expect: list[str]
        await client.clear("c1")
        await client.send("hi")  # expect-error
        unawaited: AssistantMessage = client.send("hi", conversation_id="c1")  # expect-error
        print(unawaited)
        await client.send("hi", conversation_id="c1", timeout="soon")  # expect-error


def use_sync() -> None:
    with SyncSmithClient.from_url() as client:
        reveal_type(client)  # expect: SyncSmithClient
        reveal_type(client.send("What is 17*23?", conversation_id="c1"))  # expect: AssistantMessage
        reveal_type(client.stream("And times 2?", conversation_id="c1"))  # expect: Generator[Event, None, None]
        events = client.stream("And times 2?", conversation_id="c1")
        for event in events:
            print(event.seq, event.type)
            break
        events.close()
        reveal_type(client.submit("long task", conversation_id="c2"))  # expect: SyncTurnHandle
        handle = client.submit("long task", conversation_id="c2")
        reveal_type(handle.result(timeout=60))  # expect: AssistantMessage
        reveal_type(client.turn(handle.turn_id).events())  # expect: Generator[Event, None, None]
        reveal_type(client.history("c1"))  # expect: list[Message]
        client.clear("c1")
        handle_not_result: AssistantMessage = client.submit("hi", conversation_id="c1")  # expect-error
        print(handle_not_result)


async def keep(handle: TurnHandle, event: Event) -> AssistantMessage:
    """A user's own annotations agree with what the client returns."""
    print(event.terminal)
    return await handle.result()
