"""What ``smith`` prints for a person to run or read: the commands deciding a paused turn carry the connection
options given (a password masked), and ``smith pending``'s columns fit their content."""

from __future__ import annotations

from smith_client.cli import _table
from smith_client.errors import TurnPausedError
from smith_client.events import PendingItem
from smith_client.repl import CommandOptions, paused_report


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
