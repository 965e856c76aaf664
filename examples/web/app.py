"""A resumable browser relay in front of Agent Smith: FastAPI + server-sent events.

Routes:

* ``POST /conversations/{id}/turns`` with JSON ``{"text": ..., "agent": "default"}`` and an optional
  ``Idempotency-Key`` header, which becomes the turn id (a double-clicked send attaches to the same turn).
  Answers 202 ``{"turn_id", "events"}``; a bad request is 422, a busy conversation or a reused key 409.
* ``GET /turns/{id}/events``: ``text/event-stream`` of the turn's events, each an SSE message whose
  ``id:`` is the event's ``seq`` and whose ``data:`` is the event JSON (its ``type`` inside, as the
  Vercel AI SDK frames parts). The cursor is the ``Last-Event-ID`` header (``EventSource`` sends it when
  it reconnects) or ``?after=`` (for fetch clients and for a page reload); the stream replays what
  came after it from the replay log, follows live, and closes after the terminal event. A finished turn
  whose events were all delivered answers 204, which stops ``EventSource`` from reconnecting (WHATWG
  HTML, server-sent events). When Redis fails mid-stream the stream just ends (logged) and the browser
  reconnects after its last ``seq``; while Redis is unreachable the route answers 503 with
  ``Retry-After`` (RFC 9110, 15.6.4), for a turn Redis no longer has 404, for events no longer kept 410.
  A comment line is sent every ``SMITH_WEB_HEARTBEAT`` seconds (default 15) to keep proxies from
  closing an idle stream; ``X-Accel-Buffering: no`` stops nginx buffering it.
* ``POST /turns/{id}/cancel``: stop the turn (closing the tab only disconnects, it never cancels).
* A turn paused for a person (its stream carries ``turn.paused`` and stays open; docs/architecture.md,
  Pausing for a person): ``GET /turns/{id}/pending`` lists the calls it waits on (404 for a turn Redis does
  not have); ``POST /turns/{id}/calls/{call_id}/approve`` with an optional body ``{"arguments": {...}}``
  (edited, checked against the tool's schema; no body: as the model asked), ``.../reject`` with an optional
  ``{"message": ...}``, ``.../result`` with ``{"result": ..., "is_error": false}`` for an external tool decide
  one call each (409 for a call the turn does not wait on, 422 for a bad or too large value). Each answers
  the decision that stands with ``"ignored": true`` when the call was decided before, differently (this
  request changed nothing). The last decision resumes the turn on any worker, and the same stream goes on.
* An MCP server asking for input during a tool call (its stream carries ``input.requested``; the turn keeps
  running; docs/architecture.md, Pausing for a person: MCP elicitation): ``GET /turns/{id}/pending`` lists the
  open requests too (kind ``input``), and ``POST /turns/{id}/inputs/{request_id}`` with ``{"action": "accept",
  "content": {...}}`` (checked against the requested schema), ``{"action": "decline"}`` or ``{"action":
  "cancel"}`` answers one (409 for a request no longer open, 422 for a bad action or content); it answers what
  was sent, and the stream carries ``input.answered``.
* ``GET /``: the page (``index.html``).

The relay holds no state, so any web process can serve any turn. Configuration: ``SMITH_REDIS_URL``,
``SMITH_PREFIX``. Run it with ``make web`` (workers and the embedded model included) or
``uvicorn examples.web.app:app`` against a running deployment.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel, StrictBool, StrictStr
from sse_starlette import EventSourceResponse, ServerSentEvent

from smith_client import ConflictError, InvalidRequestError, SmithClient, SmithError, UnknownAgentError
from smith_client.approvals import Decision, approval, rejection, tool_result
from smith_client.errors import (
    ConversationBusyError,
    EventsTrimmedError,
    NoPendingCallError,
    TransportError,
    TurnNotFoundError,
)
from smith_client.turn_record import MISSING, TERMINAL_STATUSES

PAGE = Path(__file__).with_name("index.html")
#: Seconds between heartbeat comments on an event stream (sse-starlette's default, 15).
HEARTBEAT_SECONDS = float(os.environ.get("SMITH_WEB_HEARTBEAT", "15"))
#: Reconnection delay the page's EventSource is told to use (SSE ``retry:``), milliseconds.
RETRY_MS = 1000
#: Seconds a client is told to wait (``Retry-After``) when Redis is unreachable (503).
RETRY_AFTER_SECONDS = 1

logger = logging.getLogger("agent_smith.web")

_STATUS = {
    InvalidRequestError: 422,
    UnknownAgentError: 422,
    ConflictError: 409,
    ConversationBusyError: 409,
    NoPendingCallError: 409,
    TurnNotFoundError: 404,
    EventsTrimmedError: 410,
    TransportError: 503,  # Redis is unreachable: try again later
}


class ApproveIn(BaseModel):
    """Body of ``POST /turns/{id}/calls/{call_id}/approve``: edited arguments, or none to run the call as asked."""

    arguments: dict[str, Any] | None = None


#: What the model is told of a call rejected with no message.
REJECTED_BY_USER = "rejected by the user"


class RejectIn(BaseModel):
    """Body of ``POST /turns/{id}/calls/{call_id}/reject``: what the model is told."""

    message: StrictStr = REJECTED_BY_USER


class ResultIn(BaseModel):
    """Body of ``POST /turns/{id}/calls/{call_id}/result``: an external tool's result (``is_error`` a JSON
    boolean: ``"yes"`` is refused, not read as true)."""

    result: Any
    is_error: StrictBool = False


class RespondIn(BaseModel):
    """Body of ``POST /turns/{id}/inputs/{request_id}``: the answer to an MCP server's request for input."""

    action: StrictStr
    content: dict[str, Any] | None = None


class TurnIn(BaseModel):
    """Body of ``POST /conversations/{id}/turns``."""

    text: str
    agent: str = "default"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    url = os.environ.get("SMITH_REDIS_URL", "redis://127.0.0.1:6379/0")
    async with SmithClient.from_url(url, prefix=os.environ.get("SMITH_PREFIX", "smith")) as client:
        app.state.smith = client
        yield


app = FastAPI(title="Agent Smith web relay", lifespan=lifespan)


@app.exception_handler(SmithError)
async def smith_error(request: Request, exc: SmithError) -> JSONResponse:
    """A typed client error as JSON ``{"error": {kind, message, fields}}`` with a matching status
    (503 comes with ``Retry-After``)."""
    status = _STATUS.get(type(exc), 502)
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else None
    if isinstance(exc, TransportError):  # its message names Redis's address: the log keeps it, not the browser
        logger.warning("%s %s: %s", request.method, request.url.path, exc.message)
        exc = TransportError("the service is unreachable for a moment; try again")
    return JSONResponse({"error": exc.to_payload()}, status_code=status, headers=headers)


@app.exception_handler(RequestValidationError)
async def request_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's own request checks (a missing or mistyped field) answered like every other error:
    ``InvalidRequestError``, 422, naming the first bad field (e.g. ``body.text``)."""
    problems = exc.errors()
    field = ".".join(map(str, problems[0]["loc"])) if problems else ""
    message = "; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in problems) or "invalid request"
    return await smith_error(request, InvalidRequestError(message, field=field))


def _smith(request: Request) -> SmithClient:
    return request.app.state.smith


@app.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(PAGE)


@app.post("/conversations/{conversation_id}/turns", status_code=202)
async def start_turn(
    conversation_id: str,
    body: TurnIn,
    request: Request,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> dict[str, str]:
    """Start a turn in the background; answers its id and where its events are."""
    try:
        handle = await _smith(request).submit(
            body.text, conversation_id=conversation_id, agent=body.agent, turn_id=idempotency_key
        )
    except InvalidRequestError as exc:  # the browser sent no turn_id: name the header it did send
        if exc.fields.get("field") != "turn_id":
            raise
        message = exc.message.replace("turn_id", "Idempotency-Key", 1)
        raise InvalidRequestError(message, field="Idempotency-Key") from None
    return {"turn_id": handle.turn_id, "events": f"/turns/{handle.turn_id}/events"}


def _cursor(last_event_id: str | None, after: int | None) -> int:
    """The ``seq`` of the last event the browser has: ``Last-Event-ID`` first, then ``?after=``, else 0.
    Raises :class:`InvalidRequestError` naming the one given when it is not a seq (a whole number >= 0)."""
    field, raw = ("Last-Event-ID", last_event_id) if last_event_id not in (None, "") else ("after", after)
    try:
        cursor = int(raw or 0)
    except ValueError:
        cursor = -1
    if cursor < 0:
        raise InvalidRequestError(f"{field} must be an event seq (a whole number >= 0), got {raw!r}", field=field)
    return cursor


@app.get("/turns/{turn_id}/events", response_model=None)
async def turn_events(
    turn_id: str,
    request: Request,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """The turn's events after the cursor as SSE; 204 when the turn is over and nothing is left to send."""
    smith = _smith(request)
    cursor = _cursor(last_event_id, after)
    handle = smith.turn(turn_id)
    status = await handle.status()
    last = await smith.events.last_seq(turn_id)
    if status == MISSING and last == 0:
        raise TurnNotFoundError(f"no turn {turn_id!r} (never submitted, or expired)", turn_id=turn_id)
    if status in TERMINAL_STATUSES and cursor >= last:
        return Response(status_code=204)
    await smith.events.read(turn_id, cursor, count=1)  # EventsTrimmedError (410) now, not mid-stream

    async def messages() -> AsyncIterator[ServerSentEvent]:
        yield ServerSentEvent(comment="stream open", retry=RETRY_MS)
        sent = cursor
        try:
            async for event in handle.events(after_seq=cursor):  # ends after the terminal event
                yield ServerSentEvent(data=event.model_dump_json(), id=str(event.seq))
                sent = event.seq
        except SmithError as exc:  # too late for an error status: end the stream, the browser reconnects
            logger.warning("turn %s: event stream ended after seq %d: %s", turn_id, sent, exc)

    return EventSourceResponse(messages(), ping=HEARTBEAT_SECONDS)


@app.post("/turns/{turn_id}/cancel")
async def cancel_turn(turn_id: str, request: Request) -> dict[str, str]:
    """Ask the turn to stop; answers ``{"outcome"}`` as :meth:`TurnHandle.cancel` does (404 for an unknown turn)."""
    outcome = await _smith(request).turn(turn_id).cancel()
    if outcome == "missing":
        raise TurnNotFoundError(f"no turn {turn_id!r} (never submitted, or expired)", turn_id=turn_id)
    return {"outcome": outcome}


@app.get("/turns/{turn_id}/pending")
async def pending_calls(turn_id: str, request: Request) -> list[dict[str, Any]]:
    """The calls the paused turn waits on (``[]`` when it is not paused; 404 for an unknown turn)."""
    return [item.model_dump() for item in await _smith(request).pending(turn_id)]


def _answer(standing: Decision, asked: Decision) -> dict[str, Any]:
    """A decision route's answer: the decision that stands, and ``ignored``: true when it is not the one
    asked for (the call was decided before, differently; the request changed nothing)."""
    return {**standing.model_dump(), "ignored": standing != asked}


@app.post("/turns/{turn_id}/calls/{call_id}/approve")
async def approve_call(turn_id: str, call_id: str, request: Request, body: ApproveIn | None = None) -> dict[str, Any]:
    """Approve one pending call, with edited arguments or (no body) as asked; answers the decision that stands."""
    arguments = body.arguments if body is not None else None
    return _answer(await _smith(request).approve(turn_id, call_id, arguments), approval(arguments))


@app.post("/turns/{turn_id}/calls/{call_id}/reject")
async def reject_call(turn_id: str, call_id: str, request: Request, body: RejectIn | None = None) -> dict[str, Any]:
    """Reject one pending call; the model gets ``message`` (no body: :data:`REJECTED_BY_USER`) as the call's error."""
    message = body.message if body is not None else REJECTED_BY_USER
    return _answer(await _smith(request).reject(turn_id, call_id, message=message), rejection(message))


@app.post("/turns/{turn_id}/calls/{call_id}/result")
async def call_result(turn_id: str, call_id: str, body: ResultIn, request: Request) -> dict[str, Any]:
    """Give an external tool's call its result."""
    decision = await _smith(request).submit_tool_result(turn_id, call_id, body.result, is_error=body.is_error)
    return _answer(decision, tool_result(body.result, body.is_error))


@app.post("/turns/{turn_id}/inputs/{request_id}")
async def respond_input(turn_id: str, request_id: str, body: RespondIn, request: Request) -> dict[str, Any]:
    """Answer one open input request (an MCP elicitation) of the running turn; answers the answer sent."""
    answer = await _smith(request).respond(turn_id, request_id, body.action, body.content)
    return answer.model_dump(exclude_none=True)
