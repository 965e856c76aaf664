"""Structured output of an agent (docs/architecture.md, Structured output): what the loop adds to its model
requests, and what it makes of the model's replies.

An agent declared with ``output_type`` (a pydantic model or a JSON Schema dict) ends its turn only with an
answer that validates. Per step, :meth:`StructuredOutput.shape` asks for it in the agent's ``output_mode``:

* ``response_format``: ``response_format: {"type": "json_schema", "json_schema": {name, schema}}``
  (https://platform.openai.com/docs/api-reference/chat/create#chat-create-response_format);
* ``tool``: a ``final_result`` tool whose parameters are the schema (a schema not rooted in an object is
  wrapped as ``{"response": …}``), with ``tool_choice`` ``required`` (named, when it is the only tool); its
  call is never a tool job: a valid one ends the turn, other calls of that reply are dropped;
* ``prompted``: the schema in the system prompt, the answer read as JSON (a Markdown code fence around it
  is tolerated);
* ``auto``: ``response_format`` when the model config says the server supports it
  (``supports_response_format``, or ``tool_calling="json_schema"``, which works through it) and it can be
  combined with the step's tools (never with ``json_schema`` tool calling's own schema), else ``tool``.

:meth:`StructuredOutput.judge` reads a reply: a ``final_result`` call or a text answer that validates
becomes the final message (its ``content`` the output as compact JSON, by alias for a model) with its
``output``; one that fails is appended with the errors for the model (an error tool message for a
``final_result`` call, a user message for a text answer) and the loop goes on, up to ``output_retries``
times; then the turn fails with :class:`~smith_client.errors.OutputValidationError`. A reply of ordinary
tool calls is left to the loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ValidationError

from smith_client.errors import ConfigurationError, OutputValidationError
from smith_client.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage
from smith_client.output import validation_errors
from smith_worker.app import AgentSpec
from smith_worker.llm.types import LlmClientConfig, LlmRequest, SamplingParams, ToolChoice, ToolSchema

#: The output tool's name and description (as Pydantic AI's tool output mode names it).
OUTPUT_TOOL = "final_result"
OUTPUT_TOOL_DESCRIPTION = "The final response which ends this conversation"
#: The property holding a schema not rooted in an object, in the output tool's parameters.
WRAPPED = "response"
#: How a retry message sent to the model begins (also how a resumed attempt counts the retries made).
RETRY_HEADER = "Your answer did not validate against the required output schema:"
#: The prompted mode's instructions, before the schema.
PROMPT = "Always respond with a JSON object that matches this JSON schema, with no text or Markdown before or after:"
#: At most this many validation errors are sent back to the model (and kept in the error).
MAX_ERRORS = 20

Mode = Literal["response_format", "tool", "prompted"]


@dataclass(frozen=True)
class Accepted:
    """A valid answer: ``message`` is the final message to append (and close the run with), ``output`` its JSON."""

    message: AssistantMessage
    output: Any


@dataclass(frozen=True)
class Rejected:
    """An answer that failed validation: ``messages`` (the reply, then what tells the model its errors) are
    appended and the loop calls the model again."""

    messages: list[Message]


class StructuredOutput:
    """The output rules of one agent loop: the agent's ``output_type``, ``output_mode`` and ``output_retries``
    (:class:`~smith_worker.app.AgentSpec`) over its model config ``llm``; counts the retries it gave."""

    def __init__(self, spec: AgentSpec, llm: LlmClientConfig) -> None:
        output_type = spec.output_type
        assert output_type is not None
        self.agent = spec.name
        self.retries = spec.output_retries
        self.used = 0
        self._llm = llm
        self._declared = spec.output_mode
        self._mode: Mode = "response_format"
        self._model: type[BaseModel] | None = None
        self._validator: Any = None
        if isinstance(output_type, dict):
            self.schema = output_type
            self._validator = _json_schema_validator(output_type)
            self._name = str(output_type.get("title") or "output")
        else:
            self._model = output_type
            self.schema = output_type.model_json_schema(by_alias=True)
            self._name = output_type.__name__
        self._name = re.sub(r"[^A-Za-z0-9_-]", "_", self._name)[:64]
        self._wrapped = not _is_object(self.schema)

    # -- the request ----------------------------------------------------------------

    def mode(self, tools: list[ToolSchema]) -> Mode:
        """The mode of a step offering ``tools`` (see the module doc)."""
        mode = self._declared
        combinable = not tools or self._llm.tool_calling == "native"
        if mode == "auto":
            supported = self._llm.supports_response_format or self._llm.tool_calling == "json_schema"
            return "response_format" if supported and combinable else "tool"
        if mode == "response_format" and not combinable:
            return "tool"  # json_schema tool calling constrains the reply with its own schema
        return mode

    def shape(self, request: LlmRequest, agent_choice: ToolChoice) -> LlmRequest:
        """``request`` asking for the output (``agent_choice``: the agent's ``tool_choice`` for this step).

        Raises :class:`ConfigurationError` when the turn's sampling sets its own ``response_format``, or a tool
        of the agent is named ``final_result`` in tool mode.
        """
        self._mode = self.mode(request.tools)
        if request.sampling is not None and request.sampling.response_format is not None:
            raise ConfigurationError(
                f"agent {self.agent!r} has an output_type: a turn's sampling may not set response_format",
                setting="response_format",
            )
        if self._mode == "response_format":
            response_format = {"type": "json_schema", "json_schema": {"name": self._name, "schema": self.schema}}
            sampling = (request.sampling or SamplingParams()).model_copy(update={"response_format": response_format})
            return request.model_copy(update={"sampling": sampling})
        if self._mode == "prompted":
            return request.model_copy(update={"messages": _with_instructions(request.messages, self.prompt())})
        if any(tool.name == OUTPUT_TOOL for tool in request.tools):
            raise ConfigurationError(
                f"agent {self.agent!r}: a tool named {OUTPUT_TOOL!r} clashes with its output tool",
                setting="output_mode",
            )
        tools = [*request.tools, self.tool()]
        return request.model_copy(update={"tools": tools, "tool_choice": _choice(agent_choice, len(tools))})

    def tool(self) -> ToolSchema:
        """The output tool of the tool mode. With json_schema tool calling, whose reply schema nests each tool's
        parameters (:mod:`smith_worker.llm.json_schema_tools`), local references (``$ref``) to ``$defs`` are inlined."""
        parameters = self.schema
        if self._wrapped:
            parameters = {"type": "object", "properties": {WRAPPED: self.schema}, "required": [WRAPPED]}
        if self._llm.tool_calling == "json_schema":
            parameters = _inlined(parameters)
        return ToolSchema(name=OUTPUT_TOOL, description=OUTPUT_TOOL_DESCRIPTION, parameters=parameters)

    def prompt(self) -> str:
        """The prompted mode's instructions."""
        return f"{PROMPT}\n{orjson.dumps(self.schema).decode()}"

    @staticmethod
    def hides(name: str) -> bool:
        """True for the output tool's calls: their ``tool_call.*`` events are not published (no tool runs)."""
        return name == OUTPUT_TOOL

    # -- the reply ------------------------------------------------------------------

    def seen(self, done: list[Any]) -> None:
        """Count the retries this turn gave before (``done``: its messages after the user message), so a resumed
        attempt does not give them again."""
        self.used = sum(1 for message in done if _is_retry(message))

    def judge(self, reply: AssistantMessage) -> Accepted | Rejected | None:
        """What ``reply`` is (see the module doc): :class:`Accepted`, :class:`Rejected`, or None for ordinary
        tool calls. Raises :class:`OutputValidationError` for an invalid answer once the retries are used."""
        calls = [call for call in reply.tool_calls if call.name == OUTPUT_TOOL]
        if reply.tool_calls and not calls:
            return None
        if calls:
            arguments = calls[0].arguments
            value, errors = self._validate(arguments.get(WRAPPED) if self._wrapped else arguments)
        else:
            value, errors = self._validate_text(reply.content)
        if not errors:
            text = orjson.dumps(value).decode()
            return Accepted(AssistantMessage(content=text, usage=reply.usage), value)
        self._count(errors)
        feedback = "\n".join([RETRY_HEADER, *(f"- {error}" for error in errors), self._fix()])
        if not calls:
            return Rejected([reply, UserMessage(content=feedback)])
        answers: list[Message] = [
            ToolMessage(
                tool_call_id=call.id,
                name=call.name,
                content=_error_content(feedback if call is calls[0] else "not run: the answer was invalid"),
                is_error=True,
            )
            for call in reply.tool_calls
        ]
        return Rejected([reply, *answers])

    def output_of(self, final: AssistantMessage) -> Any:
        """The output of an answer appended by an earlier attempt (None when it does not validate)."""
        value, errors = self._validate_text(final.content)
        return None if errors else value

    def _fix(self) -> str:
        if self._mode == "tool":
            return f"Call {OUTPUT_TOOL} again with arguments that fix these errors."
        return "Fix the errors and answer again with the JSON object only."

    def _count(self, errors: list[str]) -> None:
        if self.used >= self.retries:
            shown = "; ".join(errors[:3])
            raise OutputValidationError(
                f"agent {self.agent!r}: the answer did not validate after {self.retries} retries: {shown}",
                errors=errors,
                retries=self.retries,
            )
        self.used += 1

    def _validate_text(self, text: str) -> tuple[Any, list[str]]:
        try:
            value = orjson.loads(_unfenced(text))
        except orjson.JSONDecodeError as exc:
            return None, [f"<root>: the answer is not JSON ({exc.msg})"]
        return self._validate(value)

    def _validate(self, value: Any) -> tuple[Any, list[str]]:
        """``value`` validated: its JSON (normalized by the model, if one) and ``[]``, or None and its errors."""
        if self._model is not None:
            try:
                return self._model.model_validate(value).model_dump(mode="json", by_alias=True), []
            except ValidationError as exc:
                return None, validation_errors(exc)[:MAX_ERRORS]
        errors = [
            f"{error.json_path.removeprefix('$.') if error.path else '<root>'}: {error.message}"
            for error in self._validator.iter_errors(value)
        ]
        return (None, errors[:MAX_ERRORS]) if errors else (value, [])


def _json_schema_validator(schema: dict[str, Any]) -> Any:
    """A validator of ``schema`` (its ``$schema``'s draft, else 2020-12; checked when the agent was declared)."""
    import jsonschema  # the worker's: only agents with a JSON Schema output load it

    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)


def _is_object(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` is rooted in an object, itself or through a root ``$ref`` (a recursive pydantic model's)."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = (schema.get("$defs") or {}).get(ref[8:])
        return isinstance(target, dict) and target.get("type") == "object"
    return schema.get("type") == "object"


#: Nesting of references :func:`_inlined` follows; a deeper (recursive) schema keeps its references.
MAX_REF_DEPTH = 32


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its local references (``"$ref": "#/$defs/Name"``) replaced by their definitions, and no
    ``$defs``; a recursive schema (references nested deeper than :data:`MAX_REF_DEPTH`) is returned as it is."""
    definitions = schema.get("$defs")
    if not isinstance(definitions, dict):
        return schema

    def resolve(node: Any, depth: int) -> Any:
        if depth > MAX_REF_DEPTH:
            raise RecursionError
        if isinstance(node, list):
            return [resolve(item, depth) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in definitions:
            rest = {key: value for key, value in node.items() if key != "$ref"}
            return resolve({**definitions[ref[8:]], **rest}, depth + 1)
        return {key: resolve(value, depth) for key, value in node.items() if key != "$defs"}

    try:
        resolved: dict[str, Any] = resolve(schema, 0)
    except RecursionError:
        return schema
    return resolved


def _choice(agent_choice: ToolChoice, tools: int) -> ToolChoice:
    """The tool mode's ``tool_choice``: the agent's when it forces a call (``required``, a named tool), else
    ``required``, or the output tool by name when it is the only tool."""
    if agent_choice == "required" or isinstance(agent_choice, dict):
        return agent_choice
    return {"type": "function", "function": {"name": OUTPUT_TOOL}} if tools == 1 else "required"


def _with_instructions(messages: list[Message], text: str) -> list[Message]:
    """``messages`` with ``text`` at the end of the leading system message (or as one)."""
    if messages and isinstance(messages[0], SystemMessage):
        return [SystemMessage(content=f"{messages[0].content}\n\n{text}"), *messages[1:]]
    return [SystemMessage(content=text), *messages]


def _unfenced(text: str) -> str:
    """``text`` without a Markdown code fence around it."""
    stripped = text.strip()
    fenced = re.fullmatch(r"```[\w-]*\s*\n(.*)\n\s*```", stripped, re.S)
    return fenced.group(1) if fenced else stripped


def _error_content(message: str) -> str:
    return orjson.dumps({"error": True, "message": message}).decode()


def _is_retry(message: Any) -> bool:
    if isinstance(message, UserMessage):
        return message.content.startswith(RETRY_HEADER)
    if isinstance(message, ToolMessage) and message.name == OUTPUT_TOOL and message.is_error:
        return True
    return False


def structured_output(spec: AgentSpec, llm: LlmClientConfig) -> StructuredOutput | None:
    """The output rules of ``spec``'s loop, None for an agent without an ``output_type``."""
    return None if spec.output_type is None else StructuredOutput(spec, llm)
