"""A user's code asking for structured output, type-checked by ``mypy --strict``, never run
(``tests/unit/test_output_types.py``).

A ``reveal_type`` line ending ``# expect: T`` must reveal the type ``T`` (module names left out); a line
ending ``# expect-error`` is a misuse mypy must report. No other line may be reported.
"""

from __future__ import annotations

from typing import reveal_type

from pydantic import BaseModel

from smith_client import AssistantMessage, OutputMessage, SmithClient, SyncSmithClient


class City(BaseModel):
    name: str
    population: int


async def use_async() -> None:
    async with SmithClient.from_url() as client:
        city = await client.send("Paris?", conversation_id="c1", agent="city", output_type=City)
        reveal_type(city)  # expect: OutputMessage[City]
        reveal_type(city.output)  # expect: City
        reveal_type(city.output.population)  # expect: int
        reveal_type(city.content)  # expect: str
        reveal_type(await client.send("Paris?", conversation_id="c1"))  # expect: AssistantMessage
        plain: AssistantMessage = city  # an OutputMessage is an AssistantMessage
        print(plain, city.output.mayor)  # expect-error
        await client.send("Paris?", conversation_id="c1", output_type=dict)  # expect-error
        handle = await client.submit("Paris?", conversation_id="c1", agent="city")
        reveal_type(await handle.result(output_type=City))  # expect: OutputMessage[City]
        reveal_type(await handle.result(timeout=60))  # expect: AssistantMessage


def use_sync() -> None:
    with SyncSmithClient.from_url() as client:
        city = client.send("Paris?", conversation_id="c1", agent="city", output_type=City)
        reveal_type(city)  # expect: OutputMessage[City]
        reveal_type(city.output)  # expect: City
        reveal_type(client.send("Paris?", conversation_id="c1"))  # expect: AssistantMessage
        reveal_type(client.submit("Paris?", conversation_id="c1").result(60, output_type=City))  # expect: OutputMessage[City]


def keep(message: OutputMessage[City]) -> int:
    """A user's own annotation agrees with what the client returns."""
    return message.output.population
