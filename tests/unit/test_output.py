"""An agent's structured output rules (smith_worker/agent/output.py; docs/architecture.md, Structured output):
the mode per step, the request it shapes, what it makes of replies, and the declaration's checks."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from smith_client import AssistantMessage, ConfigurationError, OutputValidationError, ToolCall, ToolMessage, UserMessage
from smith_client.messages import SystemMessage
from smith_worker import SmithApp
from smith_worker.agent.output import OUTPUT_TOOL, RETRY_HEADER, Accepted, Rejected, StructuredOutput
from smith_worker.llm.types import LlmClientConfig, LlmRequest, SamplingParams, ToolSchema


class City(BaseModel):
    name: str
    population: int


ADD = ToolSchema(name="add", parameters={"type": "object", "properties": {"a": {"type": "integer"}}})
NAMED = {"type": "function", "function": {"name": OUTPUT_TOOL}}


def rules(output_type=City, mode="auto", retries=2, **llm) -> StructuredOutput:
    app = SmithApp()
    spec = app.agent("a", output_type=output_type, output_mode=mode, output_retries=retries)
    return StructuredOutput(spec, LlmClientConfig(base_url="http://127.0.0.1:1/v1", model="m", **llm))


def request(*tools: ToolSchema, sampling: SamplingParams | None = None) -> LlmRequest:
    return LlmRequest(messages=[SystemMessage(content="Be brief."), UserMessage(content="Paris?")], tools=list(tools),
                      sampling=sampling)


@pytest.mark.parametrize(("mode", "llm", "tools", "expected"), [
    ("auto", {}, [], "tool"),  # the server is not said to take response_format
    ("auto", {"supports_response_format": True}, [], "response_format"),
    ("auto", {"supports_response_format": True}, [ADD], "response_format"),  # native tools combine with it
    ("auto", {"tool_calling": "json_schema"}, [], "response_format"),
    ("auto", {"tool_calling": "json_schema"}, [ADD], "tool"),  # json_schema tool calling has its own schema
    ("response_format", {"tool_calling": "json_schema"}, [ADD], "tool"),
    ("prompted", {"supports_response_format": True}, [ADD], "prompted"),
    ("tool", {"supports_response_format": True}, [], "tool"),
])
def test_the_mode_of_a_step(mode, llm, tools, expected):
    assert rules(mode=mode, **llm).mode(tools) == expected


def test_the_requests_of_each_mode():
    shaped = rules(supports_response_format=True).shape(request(), None)
    assert shaped.sampling.response_format == {
        "type": "json_schema", "json_schema": {"name": "City", "schema": City.model_json_schema()}
    }
    assert shaped.tools == [] and shaped.messages == request().messages

    alone = rules(mode="tool").shape(request(), None)
    assert [t.name for t in alone.tools] == [OUTPUT_TOOL] and alone.tool_choice == NAMED
    assert alone.tools[0].parameters == City.model_json_schema()
    beside = rules(mode="tool").shape(request(ADD), "auto")
    assert [t.name for t in beside.tools] == ["add", OUTPUT_TOOL] and beside.tool_choice == "required"
    named_add = {"type": "function", "function": {"name": "add"}}
    assert rules(mode="tool").shape(request(ADD), named_add).tool_choice == named_add  # the agent forces a call

    prompted = rules(mode="prompted").shape(request(), None)
    assert prompted.messages[0].content.startswith("Be brief.\n\nAlways respond with a JSON object")
    assert json.dumps(City.model_json_schema(), separators=(",", ":")) in prompted.messages[0].content


def test_a_schema_not_rooted_in_an_object_is_wrapped_in_tool_mode():
    output = rules(output_type={"type": "array", "items": {"type": "integer"}}, mode="tool")
    assert output.tool().parameters["properties"]["response"] == {"type": "array", "items": {"type": "integer"}}
    judged = output.judge(AssistantMessage(tool_calls=[ToolCall(id="c1", name=OUTPUT_TOOL, arguments={"response": [1, 2]})]))
    assert isinstance(judged, Accepted) and judged.output == [1, 2] and judged.message.content == "[1,2]"


def test_conflicts_are_refused():
    with pytest.raises(ConfigurationError, match="response_format"):
        rules().shape(request(sampling=SamplingParams(response_format={"type": "json_object"})), None)
    with pytest.raises(ConfigurationError, match=OUTPUT_TOOL):
        rules(mode="tool").shape(request(ToolSchema(name=OUTPUT_TOOL)), None)


def test_replies_accepted_rejected_or_left_to_the_loop():
    output = rules(mode="tool", retries=1)
    assert output.judge(AssistantMessage(tool_calls=[ToolCall(id="c1", name="add")])) is None
    good = output.judge(AssistantMessage(content='```json\n{"name": "Paris", "population": 3}\n```'))
    assert isinstance(good, Accepted) and good.output == {"name": "Paris", "population": 3}

    bad = AssistantMessage(tool_calls=[ToolCall(id="c1", name=OUTPUT_TOOL, arguments={"name": "P"}),
                                       ToolCall(id="c2", name="add")])
    rejected = output.judge(bad)
    assert isinstance(rejected, Rejected) and rejected.messages[0] == bad
    feedback, not_run = rejected.messages[1:]
    assert isinstance(feedback, ToolMessage) and feedback.is_error and feedback.tool_call_id == "c1"
    assert "population: Field required" in json.loads(feedback.content)["message"]
    assert not_run.tool_call_id == "c2" and "not run" in not_run.content
    with pytest.raises(OutputValidationError) as failed:  # one retry given: the next invalid answer fails
        output.judge(AssistantMessage(content="Paris"))
    assert failed.value.retries == 1 and failed.value.errors[0].startswith("<root>: the answer is not JSON")


def test_a_resumed_attempt_counts_the_retries_given():
    output = rules(retries=2)
    output.seen([AssistantMessage(content="x"), UserMessage(content=f"{RETRY_HEADER}\n- <root>: …"),
                 AssistantMessage(content="y"), UserMessage(content=f"{RETRY_HEADER}\n- <root>: …")])
    assert output.used == 2
    with pytest.raises(OutputValidationError):
        output.judge(AssistantMessage(content="z"))


def test_the_declaration_is_checked():
    app = SmithApp()
    with pytest.raises(ConfigurationError, match="JSON Schema"):
        app.agent("a", output_type={"type": "nonsense"})
    with pytest.raises(ConfigurationError, match="pydantic model"):
        app.agent("b", output_type=int)
    with pytest.raises(ConfigurationError, match="output_mode"):
        app.agent("c", output_type=City, output_mode="grammar")
    with pytest.raises(ConfigurationError, match="output_retries"):
        app.agent("d", output_type=City, output_retries=-1)


class Country(BaseModel):
    capital: City
    cities: list[City]


def test_json_schema_tool_calling_gets_the_output_tool_without_references():
    assert "$defs" in Country.model_json_schema()
    parameters = rules(output_type=Country, mode="tool", tool_calling="json_schema").tool().parameters
    assert "$defs" not in json.dumps(parameters) and "$ref" not in json.dumps(parameters)
    assert parameters["properties"]["cities"]["items"]["properties"]["population"] == {"title": "Population", "type": "integer"}
    native = rules(output_type=Country, mode="tool").tool().parameters
    assert native == Country.model_json_schema()  # native tools take references


class Tree(BaseModel):
    children: list[Tree]


def test_a_recursive_schema_keeps_its_references():
    parameters = rules(output_type=Tree, mode="tool", tool_calling="json_schema").tool().parameters
    assert parameters == Tree.model_json_schema()
