"""MCP configuration, public tool names and catalogs (docs/architecture.md, MCP; no server needed)."""

from __future__ import annotations

import re

import pytest

from smith_client.errors import ConfigurationError
from smith_worker.app import SmithApp
from smith_worker.mcp import Catalog, ServerConfig
from smith_worker.mcp.catalog import Discovery, build_catalog, hashed_name, public_names, read_resource_name, sanitize

NAME_RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def tool(name: str, description: str = "") -> dict:
    return {"name": name, "description": description, "inputSchema": {"type": "object", "properties": {}}}


@pytest.mark.parametrize("kwargs", [
    {"alias": "Bad"}, {"alias": "a__b"}, {"alias": "x" * 33}, {"alias": "ok"},
    {"alias": "ok", "command": "x", "url": "http://h"}, {"alias": "ok", "url": "ftp://h"},
    {"alias": "ok", "command": "x", "bearer_token": "t"}, {"alias": "ok", "command": "x", "request_timeout": 0},
    {"alias": "ok", "command": "x", "idle_timeout": -1},
])
def test_invalid_configs_are_rejected(kwargs):
    with pytest.raises(ConfigurationError):
        ServerConfig(**kwargs)


def test_config_kind_defaults_and_secret_handling():
    stdio = ServerConfig("fs", command="server", args=["--x"], env={"API_TOKEN": "envsecret", "MODE": "plain"})
    http = ServerConfig("web", url="https://mcp.example/mcp", bearer_token="tok3n",
                        headers={"X-Api-Key": "k3y", "X-Trace": "visible"})
    assert (stdio.kind, stdio.concurrency, http.kind, http.concurrency) == ("stdio", 8, "http", 16)
    assert http.http_headers() == {"X-Api-Key": "k3y", "X-Trace": "visible", "Authorization": "Bearer tok3n"}
    assert set(http.secrets()) == {"tok3n", "k3y"} and stdio.secrets() == ["envsecret"]
    assert "tok3n" not in repr(http) and "k3y" not in repr(http)
    assert http.redact("Authorization: Bearer tok3n") == "Authorization: Bearer <redacted>"
    assert stdio.describe() == "stdio: server --x"


def test_names_are_sanitized_shortened_and_deterministic():
    tools = ["echo", "ns.tool/x", "ns_tool_x", "read_resource", "t" * 80, "u" * 80]
    names = public_names("srv", tools)
    assert names == public_names("srv", list(reversed(tools)))  # order-independent
    assert all(NAME_RULE.match(n) for n in names)
    assert set(names.values()) == set(tools)
    assert names["mcp_srv__echo"] == "echo"
    # "ns.tool/x" sorts before "ns_tool_x": it keeps the plain name, the later one is hashed
    assert names["mcp_srv__ns_tool_x"] == "ns.tool/x"
    assert names[hashed_name("srv", "ns_tool_x")] == "ns_tool_x"
    # the reader's name is reserved
    assert read_resource_name("srv") not in names
    assert names[hashed_name("srv", "read_resource")] == "read_resource"
    long_names = [n for n, original in names.items() if original in ("t" * 80, "u" * 80)]
    assert len(long_names) == 2 and all(len(n) == 64 for n in long_names)
    assert sanitize("a b.c/d") == "a_b_c_d"


def test_allow_and_deny_filter_original_names_deny_wins(caplog):
    discovery = Discovery(tools=[tool("echo"), tool("now"), tool("rm")], resources=[{"uri": "x://1", "name": "one"}],
                          resources_supported=True)
    config = ServerConfig("fs", command="s", allow=["echo", "rm", "typo"], deny=["rm"])
    catalog = build_catalog(config, discovery)
    assert catalog.tool_names() == ["mcp_fs__echo"]  # the reader is filtered like a tool named read_resource
    assert "typo" in caplog.text  # a name the server does not offer is reported
    with_reader = build_catalog(ServerConfig("fs", command="s", allow=["echo", "read_resource"]), discovery)
    assert with_reader.tool_names() == ["mcp_fs__echo", "mcp_fs__read_resource"]
    assert with_reader.resolve("mcp_fs__echo") == "echo" and with_reader.is_reader("mcp_fs__read_resource")
    no_reader = build_catalog(ServerConfig("fs", command="s", deny=["read_resource"]), discovery)
    assert no_reader.tool_names() == ["mcp_fs__echo", "mcp_fs__now", "mcp_fs__rm"]
    assert ServerConfig("fs", command="s", allow=[]).allowed("echo") is True  # an empty allow list allows all


def test_catalog_schemas_and_cache_roundtrip():
    discovery = Discovery(tools=[tool("echo", "Echo it")], resources=[{"uri": f"r://{i}", "name": f"n{i}"}
                                                                     for i in range(30)],
                          templates=[{"uriTemplate": "r://{id}", "name": "by id"}], resources_supported=True)
    catalog = build_catalog(ServerConfig("fs", command="s"), discovery)
    echo, reader = catalog.schemas
    assert (echo.name, echo.description) == ("mcp_fs__echo", "Echo it")
    assert reader.parameters["required"] == ["uri"]
    assert "r://19" in reader.description and "r://20" not in reader.description and "10 more" in reader.description
    assert "template r://{id}" in reader.description
    assert Catalog.schemas_from_json(catalog.to_json()) == catalog.schemas
    with pytest.raises(ValueError):
        Catalog.schemas_from_json(b'{"v": 99}')


def test_app_mcp_server_registers_a_source_agents_can_use():
    app = SmithApp()
    source = app.mcp_server("example", command="python", args=["server.py"], deny=["now"])
    app.agent("a", sources=["example"])
    assert app.sources["example"] is source
    assert app.source("source:example") is source
    assert app.source("source:other") is None
    assert app.sources_for(app.get_agent("a"))[1:] == [source]  # after the agent's Python tools
    # connect + request + the time a call may wait for a person (elicitation_timeout; docs/architecture.md, MCP)
    assert source.timeout_for("mcp_example__echo") == 20.0 + 30.0 + 300.0
    with pytest.raises(ConfigurationError):
        app.mcp_server("example", command="python")
