"""Native tools: normalization, schemas, timeouts, truncation, registry (docs/architecture.md, Tool calls)."""

import asyncio
import functools
import logging

import orjson
import pytest
from pydantic import BaseModel

from smith_client.errors import ConfigurationError
from smith_worker.app import SmithApp
from smith_worker.tools.function import (
    ToolContext,
    ToolRegistry,
    ToolResult,
    make_tool,
    normalize_result,
    schema_from_signature,
    truncate_content,
)


def ctx(name="t"):
    return ToolContext(call_id="c1", tool_name=name)


class Point(BaseModel):
    x: int
    y: int


@pytest.mark.parametrize(
    "value, content, structured",
    [
        ("text", "text", None),
        ({"a": 1}, '{"a":1}', {"a": 1}),
        ([1, 2], "[1,2]", [1, 2]),
        (3.5, "3.5", 3.5),
        (Point(x=1, y=2), '{"x":1,"y":2}', {"x": 1, "y": 2}),
    ],
)
def test_normalize_result(value, content, structured):
    result = normalize_result(value)
    assert (result.content, result.structured, result.is_error) == (content, structured, False)


def test_normalize_keeps_tool_result_and_rejects_unserializable():
    given = ToolResult(content="x", is_error=True)
    assert normalize_result(given) is given
    bad = normalize_result(object())
    assert bad.is_error and orjson.loads(bad.content)["error"] is True


async def test_sync_tool_runs_in_a_thread_and_async_tool_is_awaited():
    loop_thread = None

    def sync_tool(a: int) -> str:
        import threading

        return threading.current_thread().name

    async def async_tool(a: int) -> int:
        nonlocal loop_thread
        loop_thread = asyncio.current_task()
        return a * 2

    sync_result = await make_tool(sync_tool).invoke({"a": 1}, ctx())
    assert sync_result.content != "MainThread"
    assert (await make_tool(async_tool).invoke({"a": 4}, ctx())).content == "8"
    assert loop_thread is not None


async def test_tool_context_is_injected_not_taken_from_arguments():
    def with_ctx(x: int, context: ToolContext) -> str:
        return f"{x}:{context.call_id}"

    tool = make_tool(with_ctx)
    assert "context" not in tool.schema.parameters["properties"]
    assert (await tool.invoke({"x": 2}, ctx())).content == "2:c1"


async def test_exception_and_bad_arguments_become_error_results():
    def boom() -> None:
        raise RuntimeError("kaput")

    result = await make_tool(boom).invoke({}, ctx())
    assert result.is_error and orjson.loads(result.content) == {"error": True, "message": "RuntimeError: kaput"}
    wrong_args = await make_tool(boom).invoke({"unexpected": 1}, ctx())
    assert wrong_args.is_error and "unexpected" in wrong_args.content


async def test_timeout_cancels_the_tool_and_reports_it():
    cancelled = asyncio.Event()

    async def slow() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    result = await make_tool(slow, timeout=0.05).invoke({}, ctx())
    assert result.is_error and "timed out after 0.05 s" in result.content
    assert cancelled.is_set()


def test_schema_from_type_hints():
    def f(a: int, b: str = "x", c: list[float] | None = None) -> None: ...

    schema = schema_from_signature(f)
    assert schema["type"] == "object"
    assert schema["required"] == ["a"]
    assert schema["properties"]["a"] == {"type": "integer"}
    assert schema["properties"]["b"]["default"] == "x"


def test_author_schema_is_kept_and_bad_root_warns(caplog):
    caplog.set_level(logging.WARNING, "agent_smith.tool")
    tool = make_tool(lambda: 1, name="one", parameters={"type": "array"})
    assert tool.schema.parameters == {"type": "array"}
    assert "not {'type': 'object'}" in caplog.text


def test_truncation_keeps_utf8_boundary_and_adds_marker():
    text = "é" * 10  # 20 bytes
    out = truncate_content(text, 5)
    assert out == "éé\n…[truncated, original size 20 bytes]"
    assert truncate_content("short", 100) == "short"


def test_registry_order_and_collision():
    reg = ToolRegistry()
    first = make_tool(lambda: 1, name="a")
    assert reg.add(first) and reg.add(make_tool(lambda: 2, name="b"))
    assert not reg.add(make_tool(lambda: 3, name="a"))
    assert reg.find("a") is first  # the first registration wins
    assert [s.name for s in reg.schemas()] == ["a", "b"]
    assert [s.name for s in reg.schemas(["b"])] == ["b"] and len(reg) == 2


def test_app_registration_errors():
    app = SmithApp()

    @app.tool
    def add(a: int, b: int) -> int:
        """Add two numbers.

        More text that is not part of the description."""
        return a + b

    assert app.tools.find("add").schema.description == "Add two numbers."
    with pytest.raises(ConfigurationError):
        app.tool(add)
    with pytest.raises(ConfigurationError):
        app.agent("x", tools=["missing"])
    with pytest.raises(ConfigurationError):
        app.agent("bad name!")
    with pytest.raises(ConfigurationError):
        make_tool(add, name="z", timeout=0)
    spec = app.agent("a", tools=[add], tool_choice="required")
    assert spec.tools == ["add"]
    assert spec.tool_choice_for(0) == "required" and spec.tool_choice_for(1) == "auto"
    with pytest.raises(ConfigurationError):
        app.agent("a")


def test_mcp_server_takes_pool_options():
    app = SmithApp()
    source = app.mcp_server("fs", command="true", connect_timeout=2.0, idempotent_tools=["read"])
    assert (source.config.connect_timeout, source.config.idempotent_tools) == (2.0, ("read",))
    with pytest.raises(ConfigurationError):
        app.mcp_server("other", command="true", connect_timeout=-1)
    with pytest.raises(TypeError):
        app.mcp_server("third", command="true", no_such_option=1)


async def test_native_tools_are_a_tool_source_with_agent_views():
    from smith_worker.tools.native import NativeTools
    from smith_worker.tools.source import ToolSource

    reg = ToolRegistry()
    reg.add(make_tool(lambda a: a * 2, name="double", timeout=3.0, idempotent=True))
    reg.add(make_tool(lambda: "x", name="other"))
    native = NativeTools(reg)
    assert isinstance(native, ToolSource)
    view = native.restricted(["double"])
    assert view.owns("double") and not view.owns("other") and native.owns("other")
    assert (view.timeout_for("double"), view.idempotent("double"), view.idempotent("other")) == (3.0, True, False)
    assert [s.name for s in await view.schemas()] == ["double"]
    ctx = ToolContext(call_id="c", tool_name="double", budget=3.0)
    assert (await view.call("double", {"a": 21}, ctx)).content == "42"
    assert (await view.call("other", {}, ctx)).is_error  # not this agent's tool
    skill = native.named({"skill__echo": make_tool(lambda text: text, name="echo")})
    assert skill.owns("skill__echo") and (await skill.call("skill__echo", {"text": "hi"}, ctx)).content == "hi"
    assert [s.name for s in await skill.schemas()] == ["skill__echo"] and not skill.owns("double")


def test_a_tool_needs_a_name_a_lambda_or_partial_has_none():
    app = SmithApp()
    for nameless in (lambda x: x, functools.partial(pow, 2)):
        with pytest.raises(ConfigurationError, match="a tool needs a name: .* register it with name=") as info:
            app.tool(nameless)
        assert info.value.setting == "name"
    assert len(app.tools) == 0  # nothing registered as "<lambda>"
    app.tool(lambda x: x, name="echo")  # an explicit name is enough
    assert app.tools.names() == ["echo"]
    with pytest.raises(ConfigurationError, match=r"tool name must be 1-64 characters from \[A-Za-z0-9_-\], got 'a b'"):
        app.tool(name="a b")(lambda: 1)
