"""The arq job serializer pair, shared by the client and the workers.

Job payloads are JSON (orjson), never pickle: a web app must not unpickle
what a worker wrote, and payloads stay readable in Redis. arq also stores job
results with this serializer; values that are not JSON-able (an exception
result, for instance) are stored as their ``repr`` instead of failing, since
the project keeps its own results and never reads arq's.
"""

from __future__ import annotations

from typing import Any

import orjson


def job_serializer(value: Any) -> bytes:
    """Encode an arq job or result as JSON bytes (``repr`` for anything not JSON-able)."""
    return orjson.dumps(value, default=repr)


def job_deserializer(raw: bytes) -> Any:
    """Decode what :func:`job_serializer` wrote."""
    return orjson.loads(raw)
