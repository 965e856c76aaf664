"""External tools: the model calls them, their results come from outside (docs/architecture.md, Pausing for a person).

``app.external_tool("pick_file", description=..., parameters=...)`` declares one; an agent lists it in its
``tools`` like a Python tool. A call never becomes a tool job: the turn pauses with the call pending
(kind ``external``), and a client gives its result (``submit_tool_result``), which becomes the call's tool
message when the turn resumes. So :class:`ExternalTools` offers schemas only; its :meth:`ExternalTools.call`
is never reached by a routed call.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from smith_client.errors import ConfigurationError
from smith_worker.llm.types import ToolSchema
from smith_worker.tools.function import ToolContext, ToolResult, check_schema, checked_tool_name, error_result
from smith_worker.tools.source import SourceContext

#: The source id of external tools (their calls run nowhere in the fleet).
EXTERNAL = "external"


def parameters_schema(parameters: dict[str, Any] | type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema of an external tool's ``parameters``: given as a schema, or a pydantic model's."""
    if isinstance(parameters, type) and issubclass(parameters, BaseModel):
        schema = parameters.model_json_schema()
        schema.pop("title", None)
        return schema
    if isinstance(parameters, dict):
        return parameters
    raise ConfigurationError(
        f"external tool parameters must be a JSON schema or a pydantic model, got {parameters!r}", setting="parameters"
    )


class ExternalTools:
    """The external tools of an app (only ``allowed`` names in a view) as a :class:`ToolSource`."""

    name = EXTERNAL

    def __init__(self, schemas: dict[str, ToolSchema] | None = None, allowed: list[str] | None = None) -> None:
        self._schemas = schemas if schemas is not None else {}
        self._allowed = allowed

    def add(self, name: str, description: str, parameters: dict[str, Any] | type[BaseModel]) -> ToolSchema:
        """Declare external tool ``name``. Raises :class:`ConfigurationError` for a bad name or schema, or a
        name declared twice."""
        checked_tool_name(self.add, name)  # the name rule of Python tools (the callable is unused: a name is given)
        if name in self._schemas:
            raise ConfigurationError(f"external tool {name!r} is already declared", setting="external_tool")
        schema = parameters_schema(parameters)
        check_schema(name, schema)
        self._schemas[name] = ToolSchema(name=name, description=description, parameters=schema)
        return self._schemas[name]

    def restricted(self, allowed: list[str]) -> ExternalTools:
        """The view of the external tools named in ``allowed`` (an agent's ``tools``), in that order."""
        return ExternalTools(self._schemas, [name for name in allowed if name in self._schemas])

    def __contains__(self, name: object) -> bool:
        return name in self._schemas

    async def start(self, ctx: SourceContext) -> None:
        """Nothing to start: the calls run outside."""

    def owns(self, tool_name: str) -> bool:
        """True for a declared external tool (an allowed one, in a view)."""
        return tool_name in self._schemas and (self._allowed is None or tool_name in self._allowed)

    def timeout_for(self, tool_name: str) -> float | None:
        """None: an external call has no budget of its own (its wait is the agent's ``approval_timeout``)."""
        return None

    def idempotent(self, tool_name: str) -> bool:
        """False: a call runs outside, once."""
        return False

    def approval(self, tool_name: str) -> bool:
        """False: a call waits for its result, not for an approval (its route is ``external``)."""
        return False

    async def schemas(self, asking: ToolContext | None = None) -> list[ToolSchema]:
        """The schemas of the (allowed) external tools, in declaration order (a view: its ``allowed`` order)."""
        names = self._allowed if self._allowed is not None else list(self._schemas)
        return [self._schemas[name] for name in names]

    async def call(self, tool_name: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Never reached by a routed call (its result comes from a client); an error result if a job named it."""
        return error_result(f"external tool {tool_name!r} runs outside the fleet; its result comes from a client")

    async def close(self) -> None:
        """Nothing to release."""
