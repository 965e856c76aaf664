"""Tool calling for servers without native tool support (``LlmClientConfig.tool_calling="json_schema"``).

Some OpenAI-compatible servers drop ``tools`` or reject ``tool_calls`` and
``role: "tool"`` (llama.cpp with a chat template lacking a tool section, vLLM
without a tool-call parser, older gateways). In this mode the request carries
no tools; instead:

* the tools are described in the system message and the reply is constrained
  by one ``response_format: {"type": "json_schema", ...}`` (see
  :func:`reply_schema`) allowing, per ``tool_choice``,
  ``{"tool_call": {"name": N, "arguments": {...}}}`` (one call),
  ``{"tool_calls": [{"name": N, "arguments": {...}}, ...]}`` (parallel calls)
  or ``{"answer": "text"}`` (the final answer);
* earlier tool calls go to the server as assistant content holding that JSON,
  and tool results as one ``user`` message per run of tool messages, holding
  ``{"tool_results": [{"name", "content"[, "is_error"]}]}`` (:func:`wire_messages`);
* the reply is mapped back to ``tool_calls`` (fresh ``call_…`` ids) or
  content (:class:`JsonReplyReader`); while it streams, the ``answer`` string
  is decoded incrementally (:class:`AnswerScanner`) so only its text reaches
  token events — never the JSON around it.

``tool_choice``: ``"auto"`` / ``None`` → any of the three; ``"required"`` →
a call (one or parallel); a named tool → exactly one call of that tool;
``"none"`` → an answer only. A reply that is not a JSON object (a server that
ignores ``response_format``) is taken as plain answer text.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from smith_client.errors import ConfigurationError, ParseError
from smith_client.messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolMessage, UserMessage
from smith_worker.llm.types import (
    LlmRequest,
    LlmResponse,
    SamplingParams,
    StreamEvent,
    StreamFinished,
    StreamTokenDelta,
    StreamToolCallCompleted,
    StreamToolCallStarted,
    ToolChoice,
    ToolSchema,
)
from smith_worker.llm.wire import parse_arguments

TOOL_CALL = "tool_call"
TOOL_CALLS = "tool_calls"
ANSWER = "answer"
TOOL_RESULTS = "tool_results"

OnEvent = Callable[[StreamEvent], Awaitable[None] | None]

_FORMS = {
    TOOL_CALL: '{"tool_call": {"name": <tool name>, "arguments": {<its arguments>}}} to call one tool',
    TOOL_CALLS: '{"tool_calls": [<one such call>, ...]} to call several tools at once',
    ANSWER: '{"answer": "<your reply>"} to reply to the user',
}


# -- the request ----------------------------------------------------------------


def _named_tool(tool_choice: ToolChoice) -> str | None:
    return tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None


def allowed_forms(tool_choice: ToolChoice) -> list[str]:
    """The reply forms ``tool_choice`` allows, in schema order (see the module doc)."""
    if tool_choice == "none":
        return [ANSWER]
    if _named_tool(tool_choice) is not None:
        return [TOOL_CALL]
    if tool_choice == "required":
        return [TOOL_CALL, TOOL_CALLS]
    return [TOOL_CALL, TOOL_CALLS, ANSWER]


def _offered(tools: list[ToolSchema], tool_choice: ToolChoice) -> list[ToolSchema]:
    named = _named_tool(tool_choice)
    if named is None:
        return tools
    chosen = [tool for tool in tools if tool.name == named]
    if not chosen:
        raise ConfigurationError(f"tool_choice names {named!r}, which is not among the tools", setting="tool_choice")
    return chosen


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _one_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def reply_schema(tools: list[ToolSchema], tool_choice: ToolChoice) -> dict[str, Any]:
    """The JSON Schema of the reply for ``tools`` under ``tool_choice``.

    Each call is ``{"name": {"const": tool}, "arguments": <tool parameters>}``.
    Raises ``ConfigurationError`` when a named ``tool_choice`` is not among ``tools``.
    """
    call = _one_of(
        [_object({"name": {"const": t.name}, "arguments": t.parameters}) for t in _offered(tools, tool_choice)]
    )
    shapes = {
        TOOL_CALL: _object({TOOL_CALL: call}),
        TOOL_CALLS: _object({TOOL_CALLS: {"type": "array", "items": call, "minItems": 1}}),
        ANSWER: _object({ANSWER: {"type": "string"}}),
    }
    return _one_of([shapes[form] for form in allowed_forms(tool_choice)])


def tool_prompt(tools: list[ToolSchema], tool_choice: ToolChoice) -> str:
    """The system-message text describing the tools and the reply forms allowed by ``tool_choice``."""
    forms = allowed_forms(tool_choice)
    lines = []
    if forms != [ANSWER]:
        lines.append("Tools you can call:")
        for tool in _offered(tools, tool_choice):
            parameters = orjson.dumps(tool.parameters.get("properties", {})).decode()
            lines.append(f"- {tool.name}: {tool.description} Parameters: {parameters}")
    lines.append("Reply with one JSON object: " + "; or ".join(_FORMS[form] for form in forms) + ".")
    return "\n".join(lines)


def _call_json(call: ToolCall) -> dict[str, Any]:
    return {"name": call.name, "arguments": call.arguments}


def _assistant_content(message: AssistantMessage) -> str:
    """The JSON the model produced for ``message`` (a call, parallel calls) or its text."""
    calls = message.tool_calls
    if not calls:
        return message.content
    if len(calls) == 1:
        return orjson.dumps({TOOL_CALL: _call_json(calls[0])}).decode()
    return orjson.dumps({TOOL_CALLS: [_call_json(call) for call in calls]}).decode()


def _tool_results(messages: list[ToolMessage]) -> UserMessage:
    results = []
    for message in messages:
        result: dict[str, Any] = {"name": message.name, "content": message.content}
        if message.is_error:
            result["is_error"] = True
        results.append(result)
    return UserMessage(content=orjson.dumps({TOOL_RESULTS: results}).decode())


def wire_messages(messages: list[Message], instructions: str | None) -> list[Message]:
    """``messages`` without tool fields: calls as assistant JSON, each run of tool results as one user message.

    ``instructions`` (the :func:`tool_prompt`), when given, is appended to the
    leading system message (or becomes one).
    """
    out: list[Message] = []
    results: list[ToolMessage] = []
    for message in messages:
        if isinstance(message, ToolMessage):
            results.append(message)
            continue
        if results:
            out.append(_tool_results(results))
            results = []
        if isinstance(message, AssistantMessage) and message.tool_calls:
            message = AssistantMessage(content=_assistant_content(message), usage=message.usage)
        out.append(message)
    if results:
        out.append(_tool_results(results))
    if instructions:
        if out and isinstance(out[0], SystemMessage):
            out[0] = SystemMessage(content=f"{out[0].content}\n\n{instructions}")
        else:
            out.insert(0, SystemMessage(content=instructions))
    return out


def rewrite_request(req: LlmRequest, defaults: SamplingParams) -> LlmRequest:
    """``req`` as a plain chat request: no ``tools``/``tool_choice``, the reply schema as ``response_format``.

    ``defaults`` are the client's default sampling (to detect a conflicting
    ``response_format``). Raises ``ConfigurationError`` when the request's
    merged sampling sets its own ``response_format`` while tools are offered,
    or a named ``tool_choice`` is not among the tools.
    """
    if not req.tools:
        return LlmRequest(messages=wire_messages(req.messages, None), sampling=req.sampling)
    if defaults.merged_with(req.sampling).response_format is not None:
        raise ConfigurationError(
            "response_format cannot be combined with tools when tool_calling is json_schema",
            setting="response_format",
        )
    schema = reply_schema(req.tools, req.tool_choice)
    # no "strict": OpenAI's strict mode refuses a root anyOf; llama.cpp and vLLM constrain decoding either way
    response_format = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    sampling = (req.sampling or SamplingParams()).model_copy(update={"response_format": response_format})
    messages = wire_messages(req.messages, tool_prompt(req.tools, req.tool_choice))
    return LlmRequest(messages=messages, sampling=sampling)


# -- the reply ------------------------------------------------------------------

_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_WHITESPACE = " \t\r\n"


class _StringDecoder:
    """Decodes the body of a JSON string character by character (RFC 8259 §7), across chunk boundaries."""

    def __init__(self) -> None:
        self._escape: str | None = None  # the escape being read, after the backslash
        self._high: int | None = None  # a high surrogate waiting for its low half
        self.closed = False

    def feed(self, ch: str) -> str:
        """Decode one character of the string body; sets :attr:`closed` at the closing quote."""
        if self._escape is None:
            if ch == "\\":
                self._escape = ""
                return ""
            if ch == '"':
                self.closed = True
                return self._flush_high()
            return self._flush_high() + ch
        self._escape += ch
        if self._escape[0] != "u":
            decoded = _SIMPLE_ESCAPES.get(self._escape, self._escape)
            self._escape = None
            return self._flush_high() + decoded
        if len(self._escape) < 5:
            return ""
        code = int(self._escape[1:], 16)
        self._escape = None
        return self._code_point(code)

    def _code_point(self, code: int) -> str:
        if 0xD800 <= code <= 0xDBFF:
            pending = self._flush_high()
            self._high = code
            return pending
        if 0xDC00 <= code <= 0xDFFF and self._high is not None:
            high, self._high = self._high, None
            return chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00))
        return self._flush_high() + chr(code)

    def _flush_high(self) -> str:
        if self._high is None:
            return ""
        high, self._high = self._high, None
        return chr(high)  # a lone surrogate, as json.loads keeps it


class AnswerScanner:
    """Streams the text of the top-level ``"answer"`` string of a JSON reply as it arrives.

    :meth:`feed` takes the next piece of the reply's raw text and returns the
    answer text it completes (possibly ``""``); the work is linear in the
    reply's length. A reply whose first non-blank character is not ``{`` is
    plain text and passed through unchanged (:attr:`plain`).
    """

    def __init__(self) -> None:
        self.plain: bool | None = None  # unknown until the first non-blank character
        self._held = ""  # leading blanks, until plain or JSON is known
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._key: list[str] | None = None  # the top-level key being read
        self._last_key = ""
        self._after_colon = False
        self._expect_key = False
        self._answer: _StringDecoder | None = None
        self.answer_text: list[str] = []

    def feed(self, text: str) -> str:
        """The answer text completed by ``text``."""
        out: list[str] = []
        for ch in text:
            piece = self._char(ch)
            if piece:
                out.append(piece)
        emitted = "".join(out)
        if emitted and not self.plain:
            self.answer_text.append(emitted)
        return emitted

    def _char(self, ch: str) -> str:
        if self.plain is None:
            if ch in _WHITESPACE:
                self._held += ch
                return ""
            self.plain = ch != "{"
            if self.plain:
                return self._held + ch
        elif self.plain:
            return ch
        if self._answer is not None:
            return self._answer_char(ch)
        self._structure(ch)
        return ""

    def _answer_char(self, ch: str) -> str:
        assert self._answer is not None
        decoded = self._answer.feed(ch)
        if self._answer.closed:
            self._answer = None
        return decoded

    def _structure(self, ch: str) -> None:
        """Track strings, nesting and the current top-level key outside the answer string."""
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif ch == "\\":
                self._escaped = True
            elif ch == '"':
                self._in_string = False
                if self._key is not None:
                    self._last_key, self._key = "".join(self._key), None
                return
            if self._key is not None:
                self._key.append(ch)
            return
        if ch == '"':
            if self._depth == 1 and self._after_colon and self._last_key == ANSWER:
                self._answer = _StringDecoder()
                self._after_colon = False
                return
            self._in_string = True
            if self._depth == 1 and self._expect_key:
                self._key, self._expect_key = [], False
            self._after_colon = False
        elif ch in "{[":
            self._depth += 1
            self._expect_key = self._depth == 1
            self._after_colon = False
        elif ch in "}]":
            self._depth -= 1
        elif ch == ",":
            self._expect_key = self._depth == 1
            self._after_colon = False
        elif ch == ":":
            self._after_colon = self._depth == 1
        elif ch not in _WHITESPACE:
            self._after_colon = False


@dataclass
class DecodedReply:
    """A reply mapped back: the answer text, or the tool calls (with fresh ids)."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


def _new_call(raw: Any) -> ToolCall:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise ParseError(f"json_schema reply: a tool call needs a name, got {str(raw)[:200]}")
    arguments = raw.get("arguments", {})
    if not isinstance(arguments, dict):
        arguments = parse_arguments(arguments, tool_name=raw["name"])
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=raw["name"], arguments=arguments)


def decode_reply(text: str, scanner: AnswerScanner | None = None) -> DecodedReply:
    """Map the raw reply ``text`` to an answer or tool calls.

    Plain text (not a JSON object) is the answer. A JSON reply cut short
    inside its answer (e.g. ``max_tokens``) keeps the answer text streamed
    so far (``scanner``). Raises ``ParseError`` for any other malformed reply.
    """
    if not text.lstrip().startswith("{"):
        return DecodedReply(content=text)
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if scanner is not None and scanner.answer_text:
            return DecodedReply(content="".join(scanner.answer_text))
        raise ParseError(f"json_schema reply is not valid JSON ({exc.msg}): {text[:200]}") from exc
    if isinstance(data.get(ANSWER), str):
        return DecodedReply(content=data[ANSWER])
    if isinstance(data.get(TOOL_CALL), dict):
        return DecodedReply(tool_calls=[_new_call(data[TOOL_CALL])])
    if isinstance(data.get(TOOL_CALLS), list) and data[TOOL_CALLS]:
        return DecodedReply(tool_calls=[_new_call(raw) for raw in data[TOOL_CALLS]])
    raise ParseError(f"json_schema reply has no answer, tool_call or tool_calls: {text[:200]}")


async def _deliver(on_event: OnEvent, event: StreamEvent) -> None:
    result = on_event(event)
    if inspect.isawaitable(result):
        await result


class JsonReplyReader:
    """Maps one json_schema reply back to the native shape, streamed or not.

    As the ``on_event`` of a stream (:meth:`on_event`): token deltas carry
    only the answer's text; at the end, one ``StreamToolCallStarted`` and one
    ``StreamToolCallCompleted`` per decoded call, then ``StreamFinished``
    (``finish_reason="tool_calls"`` when there are calls). :meth:`finish`
    maps the client's response the same way (same call ids).
    """

    def __init__(self, downstream: OnEvent | None = None) -> None:
        self._downstream = downstream
        self._scanner = AnswerScanner()
        self._raw: list[str] = []
        self._decoded: DecodedReply | None = None

    def _decode(self, text: str) -> DecodedReply:
        if self._decoded is None:
            self._decoded = decode_reply(text, self._scanner)
        return self._decoded

    async def on_event(self, event: StreamEvent) -> None:
        """Translate one stream event and pass the results downstream."""
        assert self._downstream is not None
        if isinstance(event, StreamTokenDelta):
            self._raw.append(event.text)
            text = self._scanner.feed(event.text)
            if text:
                await _deliver(self._downstream, StreamTokenDelta(text))
        elif isinstance(event, StreamFinished):
            decoded = self._decode("".join(self._raw))
            calls = list(enumerate(decoded.tool_calls))
            for index, call in calls:
                await _deliver(self._downstream, StreamToolCallStarted(call.id, call.name, index))
            for index, call in calls:
                await _deliver(self._downstream, StreamToolCallCompleted(index, call.arguments, call.id, call.name))
            await _deliver(self._downstream, StreamFinished(_finish_reason(event.finish_reason, decoded), event.usage))
        else:  # native tool-call events cannot occur: no tools were sent
            await _deliver(self._downstream, event)

    def finish(self, response: LlmResponse) -> LlmResponse:
        """``response`` (whose content is the raw reply) as an answer or tool calls. Raises ``ParseError``."""
        decoded = self._decode(response.message.content)
        message = AssistantMessage(content=decoded.content, tool_calls=decoded.tool_calls, usage=response.message.usage)
        return LlmResponse(
            message=message,
            finish_reason=_finish_reason(response.finish_reason, decoded),
            reasoning_content=response.reasoning_content,
            model=response.model,
        )


def _finish_reason(reason: str, decoded: DecodedReply) -> str:
    return "tool_calls" if decoded.tool_calls and reason in ("", "stop") else reason


__all__ = [
    "ANSWER",
    "TOOL_CALL",
    "TOOL_CALLS",
    "TOOL_RESULTS",
    "AnswerScanner",
    "DecodedReply",
    "JsonReplyReader",
    "allowed_forms",
    "decode_reply",
    "reply_schema",
    "rewrite_request",
    "tool_prompt",
    "wire_messages",
]
