"""What ``smith`` prints for a person to run or read: the commands deciding a paused turn or answering an input
request carry the connection options given (a password masked), ``smith pending``'s columns fit their content,
and what a person types for an input request's field reads as its type."""

from __future__ import annotations

import re

import pytest

from smith_client.cli import _table
from smith_client.errors import TurnPausedError
from smith_client.events import PendingItem
from smith_client.input_form import field_value, form_fields
from smith_client.repl import CommandOptions, input_report, paused_report


def report(options: CommandOptions) -> list[str]:
    item = PendingItem(call_id="call_a", tool="delete", arguments={"x": 1}, kind="approval")
    return paused_report(options, TurnPausedError("paused", turn_id="t1", pending=[item.model_dump()]))


def test_the_printed_commands_carry_the_redis_url_given_with_its_password_masked():
    assert report(CommandOptions("smith"))[2] == (
        "    smith approve --prefix smith t1 call_a [--arguments JSON]  or  "
        "smith reject --prefix smith t1 call_a [--message TEXT]"
    )
    plain = report(CommandOptions("p", "redis://10.0.0.5:6380/2"))
    assert plain[2].startswith("    smith approve --prefix p --redis-url redis://10.0.0.5:6380/2 t1 call_a ")
    assert plain[-1] == "smith pending --prefix p --redis-url redis://10.0.0.5:6380/2 t1 lists the calls still waiting"
    secret = report(CommandOptions("p", "rediss://app:s3cret@cache:6380/0?password=other"))
    assert "s3cret" not in "\n".join(secret) and "other" not in "\n".join(secret)
    assert "--redis-url 'rediss://app:***@cache:6380/0?password=***' t1" in secret[-2]
    assert secret[-1] == "(the password in --redis-url is shown as ***: put yours back to run these)"


def test_pending_columns_are_as_wide_as_their_content():
    rows = [("call_care/call_del_0123456789abcdef", "approval", "guarded_delete", "hitl_lead > careful", "{}"),
            ("c1", "external", "pick", "hitl_lead", '{"hint":"sky"}')]  # fmt: skip
    header, *lines = _table(("call", "kind", "tool", "agent", "arguments"), rows)
    for column in ("kind", "tool", "agent", "arguments"):
        starts = {line.index(row[("call", "kind", "tool", "agent", "arguments").index(column)])
                  for line, row in zip(lines, rows, strict=True)}  # fmt: skip
        assert starts == {header.index(column)}
    assert lines[1].endswith('hitl_lead            {"hint":"sky"}')


def test_an_input_request_is_printed_with_its_fields_and_the_respond_commands():
    schema = {"type": "object", "required": ["colour"], "properties": {
        "colour": {"type": "string", "enum": ["red", "blue"], "description": "the ink"},
        "width": {"type": "integer", "title": "Width"}, "bold": {"type": "boolean", "default": False}}}  # fmt: skip
    item = PendingItem(call_id="call_a", tool="mcp_x__pen", arguments={"p": 1}, kind="input", parameters=schema,
                       request_id="r1", message="Which pen?")  # fmt: skip
    assert input_report(CommandOptions("p", "redis://h:6379/0"), "t1", item) == [
        'input r1 for mcp_x__pen({"p":1}) waits for a person: Which pen?',
        "  content fields: colour (one of red|blue, required: the ink); width (integer: Width); bold (y/n, default n)",
        "  smith respond --prefix p --redis-url redis://h:6379/0 t1 r1 accept --content JSON  or  "
        "smith respond --prefix p --redis-url redis://h:6379/0 t1 r1 decline",
    ]
    masked = input_report(CommandOptions("p", "redis://:pw@h:6379/0"), "t1", item)
    assert "pw" not in "\n".join(masked) and masked[-1].startswith("(the password in --redis-url is shown as ***")


def test_a_typed_field_value_is_read_by_its_type_and_refused_with_what_it_takes():
    colour, width, size, bold, note = form_fields({"required": ["colour", "width"], "properties": {
        "colour": {"type": "string", "enum": ["red", "blue"]}, "width": {"type": "integer"},
        "size": {"type": "number"}, "bold": {"type": "boolean", "default": True},
        "note": {"type": "string"}}})  # fmt: skip
    read = [field_value(colour, " red "), field_value(width, "3"), field_value(size, "2.5"), field_value(size, "2")]
    assert read == ["red", 3, 2.5, 2]
    assert [field_value(bold, "n"), field_value(bold, "YES"), field_value(bold, ""), field_value(note, "")] == [
        False, True, True, None]  # an empty answer is the default, else the field is left out  # fmt: skip
    for field, text, says in ((colour, "green", "colour takes one of red|blue"), (colour, "", "colour is required"),
                              (width, "2.5", "width takes an integer"), (size, "nan", "size takes a number"),
                              (bold, "maybe", "bold takes y or n")):  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(says)):
            field_value(field, text)
