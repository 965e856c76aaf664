"""Value types of the LLM client and its stream events.

Everything here is plain data: pydantic models for configuration, requests
and responses, frozen dataclasses for the stream events delivered to an
``on_event`` callback while a streamed response is arriving.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from smith_client.jobs import Sampling
from smith_client.messages import AssistantMessage, Message, TokenUsage
from smith_worker.ops.redaction import register_secrets, url_credentials

#: Most connections a worker process opens at once to one model endpoint (scheme, host and port), by default
#: (``SMITH_LLM_MAX_CONNECTIONS``; httpx's default pool size too): a request finding them all busy waits for one.
DEFAULT_MAX_CONNECTIONS = 100

#: Default cap on one response body, in bytes (4 MiB).
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
#: A call that has no data yet ends this many ``request_timeout`` after it started (``silence_budget``): one
#: retry of a silent attempt, not ``max_retries`` of them, so the retries never multiply the longest silence.
SILENCE_TIMEOUTS = 2


def check_base_url(value: str) -> str:
    """``value`` if it is an ``http://`` or ``https://`` URL with a host (and a numeric port, if any).

    Raises ``ValueError`` otherwise: a server that cannot be reached must fail the worker's start, not each turn.
    """
    parts = urlsplit(value)
    parts.port  # noqa: B018  # parses the port: raises ValueError unless it is a number in 0-65535
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http:// or https:// URL with a host")  # not quoted: it may carry a password
    return value


class ToolSchema(BaseModel):
    """A function tool offered to the model.

    ``parameters`` is the JSON Schema of the arguments object
    (``{"type": "object", "properties": {...}}``).
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        """The chat-completions ``tools[]`` entry.

        ``{"type": "function", "function": {name, description, parameters}}``.
        """
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


class SamplingParams(Sampling):
    """Sampling knobs: the contract's :class:`~smith_client.jobs.Sampling`, plus merging.

    ``extra`` holds provider-specific request fields merged last into the
    body; a reserved key (``model``, ``messages``, ``tools``, ``tool_choice``,
    ``stream``) is refused (docs/architecture.md, Model requests).
    """

    def merged_with(self, override: SamplingParams | None) -> SamplingParams:
        """These params (the defaults) with ``override``'s set fields applied.

        A field of ``override`` wins when it is not ``None`` (``stop``: when
        non-empty); ``extra`` dicts are merged key by key, ``override`` winning.
        """
        if override is None:
            return self
        return SamplingParams(
            temperature=_first_set(override.temperature, self.temperature),
            top_p=_first_set(override.top_p, self.top_p),
            max_tokens=_first_set(override.max_tokens, self.max_tokens),
            stop=list(override.stop or self.stop),
            response_format=_first_set(override.response_format, self.response_format),
            extra={**self.extra, **override.extra},
        )


def _first_set(value: Any, fallback: Any) -> Any:
    return fallback if value is None else value


class LlmClientConfig(BaseModel):
    """How to reach one OpenAI-compatible chat-completions server.

    * ``base_url`` includes ``/v1`` (like the OpenAI SDK); requests go to
      ``{base_url}/chat/completions``.
    * ``request_timeout`` (seconds, 60): the budget of each network phase of one
      attempt (connect, write, and the wait for each read — for a stream, the
      longest wait for the next SSE data line: keep-alive comments and blank
      lines do not reset it).
    * :attr:`silence_budget` (``2 × request_timeout``, not settable): until its
      first data arrives (an SSE data line; a non-streamed response's whole
      body), a call ends within it, all attempts and retry waits included,
      whatever ``max_retries`` (``SmithTimeoutError``, operation
      ``chat_completions``, ``budget`` = the silence budget); so a silent model
      fails a call in 120 s with the defaults, not in 4 × 60 s plus backoffs.
    * ``response_timeout`` (seconds, 300): the bound on one whole response,
      retries included; when it fires the call raises ``SmithTimeoutError``
      (operation ``llm.response``) and is not retried. Once data
      flows it is the only bound of a long answer besides ``request_timeout``
      between data lines; one below the silence budget bounds the silence too.
    * ``max_retries``: retries after the first attempt (3 → up to 4 attempts).
    * ``max_retry_after`` (seconds): the longest ``Retry-After`` honoured; a
      longer one fails at once.
    * ``backoff_base`` (seconds): first backoff delay; doubled per retry,
      plus jitter uniform in [0, 0.25 s), capped at 8 s.
    * ``include_usage``: ask streamed responses for a final usage frame
      (``stream_options: {"include_usage": true}``).
    * ``tool_calling``: ``"native"`` sends ``tools`` / ``tool_choice`` and
      reads ``tool_calls``; ``"json_schema"`` is for servers without native
      tool support: no ``tools`` are sent, the reply is constrained by one
      ``response_format`` JSON schema (see
      :mod:`smith_worker.llm.json_schema_tools`). Env ``SMITH_LLM_TOOL_CALLING``.
    * ``supports_response_format``: the server honours ``response_format: {"type": "json_schema", ...}``
      (OpenAI, llama.cpp, vLLM do); an agent's ``output_mode="auto"`` then asks for its structured output
      that way (docs/architecture.md, Structured output). ``tool_calling="json_schema"`` implies it.
    * ``max_response_bytes``: the most bytes read of one response body
      (streamed or not, error bodies included); past it the call fails with
      ``ParseError`` (``offset`` = the limit), after at most one more read.
    * ``rpm`` / ``tpm``: the endpoint's limits, requests and tokens per minute, shared by every worker of the
      deployment (:mod:`smith_worker.llm.rate_limit`; docs/architecture.md, Model rate limits); None: no limit
      (and no Redis command). ``rate_burst`` (seconds, 60): how many seconds' worth of that allowance may be
      spent at once (60: the whole minute's, as a provider's token bucket; 0: evenly spaced requests, for a
      provider that counts a sliding window). Env ``SMITH_LLM_RPM``, ``SMITH_LLM_TPM``, ``SMITH_LLM_RATE_BURST``.
    * ``api_key`` and credentials in ``base_url`` (``http://user:pw@host/v1``)
      are registered as secrets (:func:`~smith_worker.ops.redaction.register_secrets`);
      userinfo is removed from ``base_url`` and sent as
      ``Authorization: Basic`` instead (unless ``api_key`` is set, which is
      sent as ``Bearer``), so neither appears in a URL that is logged.
    """

    model_config = ConfigDict(extra="forbid")
    _basic_auth: str | None = PrivateAttr(default=None)

    base_url: Annotated[str, AfterValidator(check_base_url)]
    model: str
    api_key: str | None = None
    request_timeout: float = Field(default=60.0, gt=0)
    response_timeout: float = Field(default=300.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    max_retry_after: float = Field(default=60.0, ge=0)
    backoff_base: float = Field(default=0.5, ge=0)
    default_sampling: SamplingParams = Field(default_factory=SamplingParams)
    include_usage: bool = True
    tool_calling: Literal["native", "json_schema"] = "native"
    supports_response_format: bool = False
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, gt=0)
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    rate_burst: float = Field(default=60.0, ge=0)

    def model_post_init(self, _context: Any) -> None:
        """Move userinfo out of ``base_url`` into a Basic credential; register the secrets."""
        url, user, password = url_credentials(self.base_url)
        if user is not None:
            self.base_url = url
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            self._basic_auth = f"Basic {token}"
            register_secrets(password, token)
        register_secrets(self.api_key)

    @property
    def silence_budget(self) -> float:
        """Seconds a call may go without data, all its attempts included: ``2 × request_timeout`` (see above)."""
        return SILENCE_TIMEOUTS * self.request_timeout

    @property
    def authorization(self) -> str | None:
        """The ``Authorization`` header value: ``Bearer <api_key>``, else Basic from the URL's userinfo, else None."""
        return f"Bearer {self.api_key}" if self.api_key else self._basic_auth

    @property
    def rate_limited(self) -> bool:
        """Whether the endpoint has a fleet-wide limit (``rpm`` or ``tpm``)."""
        return self.rpm is not None or self.tpm is not None

    @property
    def chat_completions_url(self) -> str:
        """``{base_url}/chat/completions`` (a trailing ``/`` on ``base_url`` is ignored)."""
        return f"{self.base_url.rstrip('/')}/chat/completions"


ToolChoice = Literal["auto", "required", "none"] | dict[str, Any] | None


class LlmRequest(BaseModel):
    """One model call.

    ``tool_choice`` is ``None`` (server default), ``"auto"``, ``"required"``,
    ``"none"`` or ``{"type": "function", "function": {"name": str}}``; it is
    sent only when ``tools`` is non-empty. ``sampling`` overrides the
    config's ``default_sampling`` field by field.
    """

    messages: list[Message]
    tools: list[ToolSchema] = Field(default_factory=list)
    sampling: SamplingParams | None = None
    tool_choice: ToolChoice = None

    @field_validator("tool_choice")
    @classmethod
    def _check_tool_choice(cls, value: Any) -> Any:
        if isinstance(value, dict):
            function = value.get("function")
            if (
                value.get("type") != "function"
                or not isinstance(function, dict)
                or not isinstance(function.get("name"), str)
            ):
                raise ValueError('tool_choice object must be {"type": "function", "function": {"name": str}}')
        return value


class LlmResponse(BaseModel):
    """The result of one model call: the assistant message (with usage when
    reported), the server's ``finish_reason`` (``""`` when none was sent) and
    any ``reasoning_content`` (kept apart from ``message.content``); ``model`` the model the server says
    answered (its ``model`` field, ``""`` when none was sent)."""

    message: AssistantMessage
    finish_reason: str = ""
    reasoning_content: str = ""
    model: str = ""


@dataclass(frozen=True)
class StreamTokenDelta:
    """A piece of assistant text, delivered as soon as it arrives."""

    text: str


@dataclass(frozen=True)
class StreamReasoningDelta:
    """A piece of the model's reasoning (a delta's ``reasoning_content``, as llama.cpp, vLLM and DeepSeek send
    it, or ``reasoning``), delivered as soon as it arrives; never part of the message's ``content``."""

    text: str


@dataclass(frozen=True)
class StreamToolCallStarted:
    """A tool call's id and name became known (its arguments are still arriving).

    ``index`` identifies the call within the response (the server's
    ``tool_calls[].index`` when it gives a fresh one).
    """

    id: str
    name: str
    index: int


@dataclass(frozen=True)
class StreamToolCallCompleted:
    """A tool call's arguments, parsed once at the end of the stream.

    Emitted for every call in ``index`` order, just before :class:`StreamFinished`.
    """

    index: int
    arguments: dict[str, Any] = field(hash=False)
    id: str = ""
    name: str = ""


@dataclass(frozen=True)
class StreamFinished:
    """The stream ended (``[DONE]`` or EOF after a ``finish_reason``); always the last event."""

    finish_reason: str
    usage: TokenUsage | None = None


StreamEvent = StreamTokenDelta | StreamReasoningDelta | StreamToolCallStarted | StreamToolCallCompleted | StreamFinished


__all__ = [
    "LlmClientConfig",
    "LlmRequest",
    "LlmResponse",
    "SamplingParams",
    "StreamEvent",
    "StreamFinished",
    "StreamReasoningDelta",
    "StreamTokenDelta",
    "StreamToolCallCompleted",
    "StreamToolCallStarted",
    "ToolChoice",
    "ToolSchema",
]
