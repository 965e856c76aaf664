"""Native tools: registration, schemas, invocation and result normalization (docs/architecture.md, Tool calls).

A tool is a Python callable called as ``fn(**arguments)``; a parameter
annotated :class:`ToolContext` is injected instead of taken from the
arguments. Sync callables run in a thread of the tool worker's pool, or with
``isolation="process"`` in a pool process that is killed at the timeout
(:mod:`smith_worker.tools.isolation`: Python cannot stop a thread, so an
overrunning sync tool's thread runs on); async ones are awaited. Results normalize to :class:`ToolResult`:

* ``str`` → text content;
* :class:`ToolResult` → unchanged;
* any other JSON-able value → compact JSON content, and the value kept as ``structured``;
* a raised exception → an error result (never a turn failure); a raised
  :class:`~smith_client.errors.ToolError` gives the model its own message, ``kind`` and
  ``retryable`` instead of the exception's type and text;
* a raised :class:`RetryWithMessage` → an error result that hands the model a correction and invites it to
  call again (``retry_requested``), within the calling agent's ``tool_retries``.

An ``idempotent`` tool registered with ``retries`` and ``retry_on`` is run again, after a backoff, when an
attempt raises one of the ``retry_on`` exceptions, all attempts within the call's one timeout; the model sees
only the last attempt's outcome (docs/architecture.md, Tool calls).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict, get_type_hints

import orjson
from pydantic import BaseModel, ConfigDict, create_model

from smith_client.errors import ConfigurationError, SmithTimeoutError, ToolError
from smith_client.messages import AssistantMessage, Message, ToolMessage
from smith_client.validation import shown
from smith_worker.llm.types import ToolSchema
from smith_worker.ops.retry import RetryPolicy

if TYPE_CHECKING:
    from smith_worker.tools.isolation import ToolExecutors

#: Where a sync tool runs: a thread of the worker (default) or a pool process killed at its timeout.
Isolation = Literal["thread", "process"]

logger = logging.getLogger("agent_smith.tool")

#: Default tool timeout in seconds.
DEFAULT_TOOL_TIMEOUT = 30.0
#: Default cap on a tool result's content, in UTF-8 bytes.
DEFAULT_RESULT_MAX_BYTES = 64 * 1024
#: A tool's name: a function name as chat-completions servers take it (OpenAI: ``^[a-zA-Z0-9_-]{1,64}$``).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
#: Default base of a tool's retry backoff, seconds (as the HTTP retry policy's, docs/architecture.md).
DEFAULT_TOOL_BACKOFF = 0.5
#: Default of ``AgentConfig.tool_retries``: corrections (:class:`RetryWithMessage`) a tool may ask of the model
#: in a row (as pydantic-ai's ``retries``, whose default is 1).
DEFAULT_TOOL_RETRIES = 1

#: How long a tool waits before retry ``n`` (1-based): a base in seconds (``base · 2^(n-1) + U(0, 0.25 s)``,
#: capped at 8 s, the HTTP retry policy's schedule; 0: no wait) or a callable ``n -> seconds``.
Backoff = float | Callable[[int], float]


class RetryWithMessage(Exception):  # noqa: N818  # the public name: what the tool asks for, not an error kind
    """Raised by a tool to hand the model a correction and let it call again (compare pydantic-ai's ``ModelRetry``).

    The call's tool message is an error whose content is ``{"error": true, "message": <message>,
    "kind": "RetryWithMessage", "retries_left": n}``: ``n`` more corrections the tool may still ask for. A
    tool may ask for at most the calling agent's ``AgentConfig.tool_retries`` (default 1) corrections in
    a row within a turn (a call of it that does not raise this one starts the count again); past that, the
    call's tool message is an ordinary tool error (``kind`` ``ToolError``, ``retryable`` false), never a
    turn failure (docs/architecture.md, Tool calls). ``message`` is the text for the model.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def retry_delay(backoff: Backoff, number: int) -> float:
    """Seconds to wait before retry ``number`` (1-based) of a tool by its ``backoff`` (see :data:`Backoff`)."""
    if callable(backoff):
        return max(0.0, float(backoff(number)))
    return RetryPolicy(backoff_base=backoff).backoff(number) if backoff > 0 else 0.0


@dataclass
class ToolResult:
    """A tool's outcome: ``content`` text, ``is_error``, optional ``structured`` JSON value;
    ``retry_requested`` when the tool raised :class:`RetryWithMessage` (counted by the turn)."""

    content: str
    is_error: bool = False
    structured: Any = None
    retry_requested: bool = False


@dataclass
class ToolContext:
    """What a running tool may know about its call. Inject it by annotating a parameter.

    ``budget`` is the tool's timeout in seconds; ``deadline`` the matching
    ``time.monotonic()`` instant; ``worker_id`` the process running it;
    ``agent_path`` and ``call_path`` where the calling agent sits in its tree
    (as on events, :mod:`smith_client.events`; ``turn_id`` is the root turn's); ``context`` the turn's
    caller context (``send(..., context=...)``): None without one, the JSON object, or an instance of the
    app's ``context_type`` (docs/architecture.md, Caller context).
    ``retry`` how many corrections (:class:`RetryWithMessage`) this tool asked of the model in a row
    before this call, of at most ``tool_retries`` (the calling agent's ``AgentConfig.tool_retries``).
    ``step`` and ``index`` where the call is in its agent's run (the model step, the
    call's place in that step's calls) and ``position`` that agent's place in its tree
    (``""`` for the root; as on a tool job, :class:`~smith_client.jobs.ToolJob`). ``tenant`` is the turn's
    (``send(..., tenant=)``; None: none; docs/architecture.md, Tenants).
    """

    call_id: str
    tool_name: str
    turn_id: str = ""
    conversation_id: str = ""
    agent: str = ""
    budget: float = DEFAULT_TOOL_TIMEOUT
    deadline: float = 0.0
    worker_id: str = ""
    agent_path: list[str] = field(default_factory=list)
    call_path: list[str] = field(default_factory=list)
    step: int = 0
    index: int = 0
    position: str = ""
    logger: logging.Logger = field(default_factory=lambda: logger)
    context: Any = None
    tenant: str | None = None
    retry: int = 0
    tool_retries: int = DEFAULT_TOOL_RETRIES

    def remaining(self) -> float:
        """Seconds left before the tool's timeout (never negative)."""
        return max(0.0, self.deadline - time.monotonic())


#: Whether a call of a tool waits for a person's approval (docs/architecture.md, Pausing for a person): always
#: (True), never (False), or as a callable decides per call from the call's :class:`ToolContext` and arguments.
Approval = bool | Callable[[ToolContext, dict[str, Any]], bool | Awaitable[bool]]


def error_content(message: str, **details: Any) -> str:
    """Compact JSON error content for a tool message: ``{"error":true,"message":...}`` and ``details``'s
    JSON-able items after them. See docs/architecture.md, Tool calls."""
    return orjson.dumps({"error": True, "message": message, **details}).decode()


def error_result(message: str, **details: Any) -> ToolResult:
    """An error :class:`ToolResult` with compact JSON content (see :func:`error_content`)."""
    return ToolResult(content=error_content(message, **details), is_error=True)


def normalize_result(value: Any) -> ToolResult:
    """Normalize what a tool returned. Non-JSON-able values become an error result."""
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(content=value)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    try:
        return ToolResult(content=orjson.dumps(value).decode(), structured=value)
    except TypeError as exc:
        return error_result(f"tool returned a value that is not JSON-able: {exc}")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub_surrogates(text: str) -> str:
    """``text`` with each lone surrogate (not encodable as UTF-8) replaced by U+FFFD, as a UTF-8 decoder would."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def bounded_structured(value: Any, max_bytes: int) -> Any:
    """A tool's ``structured`` value to store: ``None`` when its compact JSON exceeds ``max_bytes`` bytes.

    The model only ever sees the (truncated) content, so an oversized value is
    dropped; a ``{"_done": true, ...}`` sentinel (docs/architecture.md, Tool calls) keeps ``_done``
    and ``final_message``, which end the turn.
    """
    if value is None:
        return None
    try:
        size = len(orjson.dumps(value))
    except TypeError:
        return None
    if size <= max_bytes:
        return value
    if isinstance(value, dict) and value.get("_done") is True:
        return {"_done": True, "final_message": value.get("final_message", "")}
    return None


TRUNCATION_MARKER = "\n…[truncated, original size {size} bytes]"


def truncate_content(content: str, max_bytes: int = DEFAULT_RESULT_MAX_BYTES) -> str:
    """Cut ``content`` to ``max_bytes`` UTF-8 bytes on a character boundary, then add the truncation marker.

    The marker (``\\n…[truncated, original size N bytes]``, docs/architecture.md, Tool calls) comes
    after the allowance, so the result may exceed ``max_bytes`` by its length.
    """
    raw = content.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return content
    kept = raw[:max_bytes].decode("utf-8", "ignore")  # "ignore" drops a cut multi-byte tail
    return kept + TRUNCATION_MARKER.format(size=len(raw))


def _context_params(fn: Callable[..., Any]) -> list[str]:
    hints = get_type_hints(fn)
    return [name for name, hint in hints.items() if hint is ToolContext and name != "return"]


def schema_from_signature(fn: Callable[..., Any]) -> dict[str, Any]:
    """Derive a JSON Schema object for ``fn``'s parameters from its type hints (pydantic)."""
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if hints.get(name) is ToolContext or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = ... if param.default is param.empty else param.default
        fields[name] = (hints.get(name, Any), default)
    model = create_model(f"{fn.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    schema: dict[str, Any] = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


def check_schema(name: str, parameters: Any) -> None:
    """Warn (never raise) when ``parameters`` is not an object-rooted JSON Schema."""
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        logger.warning("tool %r: parameters schema root is not {'type': 'object'}", name)
    elif not isinstance(parameters.get("properties", {}), dict):
        logger.warning("tool %r: parameters schema 'properties' is not an object", name)


@dataclass
class Tool:
    """A registered native tool: its schema, callable and options.

    ``timeout`` is seconds (None: the calling agent's ``default_tool_timeout``,
    or :data:`DEFAULT_TOOL_TIMEOUT` outside an agent); ``idempotent`` tells the runtime a call may be
    safely re-run after a crash (docs/architecture.md, Fault model); ``isolation`` where a sync
    tool runs (see :mod:`smith_worker.tools.isolation`); ``needs_approval`` whether a call waits for a
    person first (:data:`Approval`); ``retries`` how many times a call is run again when an attempt
    raises one of ``retry_on`` (exception classes), after ``backoff`` (:data:`Backoff`), all within
    the call's timeout (an idempotent tool only, see :func:`make_tool`).
    """

    schema: ToolSchema
    fn: Callable[..., Any]
    timeout: float | None = None
    idempotent: bool = False
    context_params: list[str] = field(default_factory=list)
    isolation: Isolation = "thread"
    needs_approval: Approval = False
    retries: int = 0
    retry_on: tuple[type[BaseException], ...] = ()
    backoff: Backoff = DEFAULT_TOOL_BACKOFF

    @property
    def name(self) -> str:
        """The tool's name as the model sees it."""
        return self.schema.name

    async def invoke(
        self,
        arguments: dict[str, Any],
        ctx: ToolContext,
        timeout: float | None = None,
        executors: ToolExecutors | None = None,
    ) -> ToolResult:
        """Call the tool within ``timeout`` seconds (default: its own) and normalize the outcome.

        Never raises, except ``asyncio.CancelledError`` when the job is aborted.
        On timeout the tool's task is cancelled; a sync tool's thread cannot be
        stopped and runs to its end, counted as overrunning by ``executors``
        (the tool worker's; default :func:`~smith_worker.tools.isolation.default_executors`),
        while a process-isolated tool's process is killed. The budget covers every attempt of a
        retrying tool (:meth:`_attempts`) and the waits between them.
        """
        budget = timeout if timeout is not None else self.timeout or DEFAULT_TOOL_TIMEOUT
        deadline = asyncio.timeout(budget)
        try:
            async with deadline:
                return normalize_result(await self._attempts(arguments, ctx, budget, executors, deadline.when()))
        except TimeoutError as exc:
            if not deadline.expired():  # the tool's own TimeoutError, not our budget
                return error_result(f"{type(exc).__name__}: {exc}")
            err = SmithTimeoutError(f"tool {self.name!r} timed out after {budget:g} s", "tool", budget)
            return error_result(err.message)
        except RetryWithMessage as exc:
            return correction_result(self.name, exc.message, ctx)
        except ToolError as exc:  # the tool's own account of its failure, told to the model as it is
            fields = {"tool_name": exc.tool_name or self.name, "retryable": exc.retryable}
            return error_result(exc.message, kind=exc.kind, **fields)
        except Exception as exc:  # a crashing tool becomes an error result, never a turn failure
            logger.info("tool %r raised %s: %s", self.name, type(exc).__name__, exc)
            return error_result(f"{type(exc).__name__}: {exc}")

    async def _attempts(
        self,
        arguments: dict[str, Any],
        ctx: ToolContext,
        budget: float,
        executors: ToolExecutors | None,
        deadline: float | None,
    ) -> Any:
        """Run the tool, again after a backoff while an attempt raises one of ``retry_on`` and retries are
        left, and the wait ends before ``deadline`` (event-loop time); else the last attempt's exception is
        raised. Each retry is logged (WARNING on ``agent_smith.tool``); :class:`RetryWithMessage` never
        retries here (it is the model's to act on)."""
        loop = asyncio.get_running_loop()
        number = 0
        while True:
            remaining = budget if deadline is None else max(0.0, deadline - loop.time())
            try:
                return await self._call(arguments, ctx, remaining, executors, deadline)
            except self.retry_on as exc:
                if isinstance(exc, RetryWithMessage) or number >= self.retries:
                    raise
                number += 1
                delay = retry_delay(self.backoff, number)
                if deadline is not None and loop.time() + delay >= deadline:
                    logger.warning(
                        "tool %r attempt %d raised %s: no time left for a retry", self.name, number, type(exc).__name__
                    )
                    raise
                logger.warning(
                    "tool %r attempt %d of %d raised %s: %s; retrying in %.2f s",
                    self.name,
                    number,
                    self.retries + 1,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _call(
        self,
        arguments: dict[str, Any],
        ctx: ToolContext,
        budget: float,
        executors: ToolExecutors | None,
        deadline: float | None,
    ) -> Any:
        kwargs = dict(arguments)
        for name in self.context_params:
            kwargs[name] = ctx
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        if executors is None:
            from smith_worker.tools.isolation import default_executors  # late: pebble only where tools run

            executors = default_executors()
        if self.isolation == "process":
            result = await executors.run_in_process(self.fn, kwargs, budget)
        else:
            result = await executors.run_in_thread(self.fn, kwargs, deadline)
        if inspect.isawaitable(result):
            return await result
        return result


def correction_result(tool_name: str, message: str, ctx: ToolContext) -> ToolResult:
    """The error result of a call whose tool raised :class:`RetryWithMessage` with ``message``: within the
    calling agent's allowance (``ctx.retry < ctx.tool_retries``) the correction, with the corrections still
    left; past it an ordinary tool error (docs/architecture.md, Tool calls). Either way ``retry_requested``,
    so the turn keeps counting, and ``corrections``: the corrections in a row this one makes, which a resumed
    attempt reads back (:func:`corrections_in`)."""
    corrections = ctx.retry + 1
    if ctx.retry < ctx.tool_retries:
        left = ctx.tool_retries - corrections
        content = error_content(message, kind="RetryWithMessage", retries_left=left, corrections=corrections)
    else:
        exceeded = f"{message} (tool {tool_name!r} asked for more than tool_retries={ctx.tool_retries} corrections)"
        content = error_content(
            exceeded, kind="ToolError", tool_name=tool_name, retryable=False, corrections=corrections
        )
    return ToolResult(content=content, is_error=True, retry_requested=True)


def corrections_in(messages: Sequence[Message]) -> dict[str, int]:
    """Per tool name, the corrections in a row its calls asked of the model by the end of ``messages`` (a
    turn's stored messages, oldest first): the ``corrections`` of its last step's correction
    (:func:`correction_result`), 0 when its calls in that step asked none. How a resumed attempt goes on
    counting where the previous one stopped (docs/architecture.md, Tool calls)."""
    counts: dict[str, int] = {}
    step: dict[str, int] = {}
    for message in messages:
        if isinstance(message, AssistantMessage) and message.tool_calls:
            counts.update(step)
            step = dict.fromkeys((call.name for call in message.tool_calls), 0)
        elif isinstance(message, ToolMessage) and message.is_error and message.name in step:
            step[message.name] = max(step[message.name], _corrections_of(message.content))
    counts.update(step)
    return counts


def _corrections_of(content: str) -> int:
    """The ``corrections`` field of an error tool message's JSON ``content`` (0: none, or not JSON)."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return 0
    value = data.get("corrections") if isinstance(data, dict) else None
    return value if isinstance(value, int) else 0


def checked_tool_name(fn: Callable[..., Any], name: str | None) -> str:
    """``name``, else ``fn``'s ``__name__``, if it matches :data:`TOOL_NAME`.

    Raises :class:`ConfigurationError` (``setting="name"``) for a callable without a name of its own
    (a lambda, a ``functools.partial``, a callable object) and no ``name``, or a name servers refuse.
    """
    if name is None:
        name = getattr(fn, "__name__", None)
        if not isinstance(name, str) or name == "<lambda>":
            raise ConfigurationError(
                f"a tool needs a name: {shown(fn)} has none of its own; register it with name=...", setting="name"
            )
    if not TOOL_NAME.match(name):
        raise ConfigurationError(
            f"tool name must be 1-64 characters from [A-Za-z0-9_-], got {shown(name)}", setting="name"
        )
    return name


class ToolOptions(TypedDict, total=False):
    """The options of :func:`make_tool` (and of ``@app.tool(...)``, which passes them on)."""

    name: str | None
    description: str | None
    parameters: dict[str, Any] | None
    timeout: float | None
    idempotent: bool
    isolation: Isolation
    needs_approval: Approval
    retries: int
    retry_on: type[BaseException] | tuple[type[BaseException], ...]
    backoff: Backoff


def _checked_retries(
    retries: int, retry_on: type[BaseException] | tuple[type[BaseException], ...], backoff: Backoff, idempotent: bool
) -> tuple[type[BaseException], ...]:
    """``retry_on`` as a tuple, once the retry options are consistent (see :func:`make_tool`)."""
    on = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    if not all(isinstance(cls, type) and issubclass(cls, BaseException) for cls in on):
        raise ConfigurationError(f"retry_on must be exception classes, got {retry_on!r}", setting="retry_on")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigurationError(f"tool retries must be an int >= 0, got {retries!r}", setting="retries")
    if retries and not idempotent:
        raise ConfigurationError(
            "retries re-run the tool: declare it idempotent=True (safe to run twice)", setting="retries"
        )
    if retries and not on:
        raise ConfigurationError("retries need retry_on: the exceptions that call for a retry", setting="retry_on")
    if not callable(backoff) and (isinstance(backoff, bool) or not isinstance(backoff, int | float) or backoff < 0):
        raise ConfigurationError(
            f"backoff must be seconds >= 0 or a callable(retry) -> seconds, got {backoff!r}", setting="backoff"
        )
    return on


def make_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
    isolation: Isolation = "thread",
    needs_approval: Approval = False,
    retries: int = 0,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    backoff: Backoff = DEFAULT_TOOL_BACKOFF,
) -> Tool:
    """Wrap a callable as a :class:`Tool`.

    ``parameters`` is an author-supplied JSON Schema; without it one is derived
    from the type hints. ``description`` defaults to the docstring's first paragraph.
    ``isolation="process"`` runs a sync function in a pool process killed at
    its timeout (:mod:`smith_worker.tools.isolation`). ``needs_approval`` (:data:`Approval`) makes a call
    wait for a person. ``retries`` (≥ 0) re-runs a call whose attempt raised one of ``retry_on`` (an
    exception class or a tuple of them; none by default), waiting ``backoff`` (:data:`Backoff`) before each
    retry, all within the call's timeout. Raises :class:`ConfigurationError` for a non-positive timeout, an
    unknown isolation, process isolation of an ``async def``, a ``needs_approval`` that is neither a bool nor
    a callable, ``retries`` on a tool not declared ``idempotent`` or without ``retry_on``, a bad ``backoff``,
    or a bad name (:func:`checked_tool_name`).
    """
    on = _checked_retries(retries, retry_on, backoff, idempotent)
    if not isinstance(needs_approval, bool) and not callable(needs_approval):
        raise ConfigurationError(
            f"needs_approval must be a bool or a callable(ctx, arguments), got {needs_approval!r}",
            setting="needs_approval",
        )
    if timeout is not None and timeout <= 0:
        raise ConfigurationError(f"tool timeout must be positive, got {timeout}", setting="timeout")
    if isolation not in ("thread", "process"):
        raise ConfigurationError(
            f"tool isolation must be 'thread' or 'process', got {isolation!r}", setting="isolation"
        )
    if isolation == "process" and inspect.iscoroutinefunction(fn):
        raise ConfigurationError(
            "isolation='process' is for sync functions; an async tool can be cancelled", setting="isolation"
        )
    tool_name = checked_tool_name(fn, name)
    doc = (description if description is not None else inspect.getdoc(fn) or "").strip()
    schema_params = parameters if parameters is not None else schema_from_signature(fn)
    check_schema(tool_name, schema_params)
    return Tool(
        schema=ToolSchema(name=tool_name, description=doc.split("\n\n")[0], parameters=schema_params),
        fn=fn,
        timeout=None if timeout is None else float(timeout),
        idempotent=idempotent,
        context_params=_context_params(fn),
        isolation=isolation,
        needs_approval=needs_approval,
        retries=retries,
        retry_on=on,
        backoff=backoff if callable(backoff) else float(backoff),
    )


class ToolRegistry:
    """Tools by name, in insertion order."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def add(self, tool: Tool) -> bool:
        """Register ``tool``; return False (and keep the existing one) on a name collision."""
        if tool.name in self._tools:
            logger.warning("tool name collision: %r is already registered", tool.name)
            return False
        self._tools[tool.name] = tool
        return True

    def find(self, name: str) -> Tool | None:
        """The tool registered as ``name``, or None."""
        return self._tools.get(name)

    def schemas(self, names: list[str] | None = None) -> list[ToolSchema]:
        """Schemas in insertion order, optionally only for ``names``."""
        return [t.schema for t in self._tools.values() if names is None or t.name in names]

    def all(self) -> list[Tool]:
        """Every registered tool, in registration order."""
        return list(self._tools.values())

    def names(self) -> list[str]:
        """Registered tool names, in insertion order."""
        return list(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools
