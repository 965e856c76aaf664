"""The app of the structured output tests (``tests.support.output_app:app``): agents declared with an
``output_type`` (docs/architecture.md, Structured output)."""

from __future__ import annotations

from pydantic import BaseModel

from smith_worker import SmithApp

app = SmithApp()


class City(BaseModel):
    """The output the tests ask for."""

    name: str
    population: int


#: The same output as a JSON Schema (the prompted agent's ``output_type``).
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}


@app.tool(timeout=5.0)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# a server that takes response_format (native tool calling): the auto mode uses it
app.agent("city_rf", output_type=City, llm={"supports_response_format": True})
# the final_result tool, beside an ordinary tool
app.agent("city_tool", output_type=City, output_mode="tool", tools=[add])
# json_schema tool calling with a tool: auto takes the final_result tool, through the JSON reply form
app.agent("city_json_tools", output_type=City, tools=[add], llm={"tool_calling": "json_schema"})
# a JSON Schema in the system prompt, one retry only
app.agent("answer_prompted", output_type=ANSWER_SCHEMA, output_mode="prompted", output_retries=1)
# the embedded model (its workers' environment says tool_calling=json_schema): response_format
app.agent("city_local", system_prompt="You answer with facts about cities.", output_type=City)
