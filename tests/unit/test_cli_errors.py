"""The command-line tools print one ``PROG: Kind: message`` line, never a traceback, and exit non-zero."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from smith_worker.local.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
SMITH = "from smith_client.cli import smith_main; smith_main()"


def run(code_or_module: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, *code_or_module], env=environ, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def assert_one_clean_line(result: subprocess.CompletedProcess[str], prefix: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["status", "keys"])
def test_smith_with_redis_unreachable_prints_a_transport_error(command):
    result = run(["-c", SMITH, "--conversation", "c1", command], SMITH_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    assert_one_clean_line(result, "smith: TransportError: ")


@pytest.mark.parametrize("command", ["status", "keys", "ask"])
@pytest.mark.parametrize("url", ["bogus://127.0.0.1/0", "redis://127.0.0.1:notaport/0"])
def test_smith_with_a_malformed_url_prints_a_configuration_error_naming_it(command, url):
    result = run(["-c", SMITH, "--conversation", "c1", command, *(["hi"] if command == "ask" else [])],
                 SMITH_REDIS_URL=url)
    assert_one_clean_line(result, "smith: ConfigurationError: SMITH_REDIS_URL ")


@pytest.mark.parametrize(("variable", "value", "named"), [
    ("SMITH_TURN_MAX_JOBS", "abc", "SMITH_TURN_MAX_JOBS"),
    ("SMITH_TURN_MAX_JOBS", "0", "SMITH_TURN_MAX_JOBS must be a whole number of at least 1,"),  # never takes a turn
    ("SMITH_TOOL_MAX_JOBS", "-3", "SMITH_TOOL_MAX_JOBS must be a whole number of at least 1,"),
    ("SMITH_TURN_MAX_ATTEMPTS", "0", "SMITH_TURN_MAX_ATTEMPTS must be a whole number of at least 1,"),
    ("SMITH_LLM_TOOL_CALLING", "bogus", "SMITH_LLM_TOOL_CALLING must be native or json_schema,"),  # not at every turn
    ("SMITH_REDIS_URL", "bogus://x", "SMITH_REDIS_URL"),
])
def test_smith_worker_with_bad_configuration_prints_one_line(variable, value, named):
    result = run(["-m", "smith_worker", "tests.support.app:app", "--queue", "turns"], **{variable: value})
    assert_one_clean_line(result, f"smith-worker: ConfigurationError: {named} ")


@pytest.mark.parametrize(("variable", "value"), [
    ("SMITH_LOG_LEVEL", "LOUD"),  # was logging's ValueError traceback
    ("SMITH_LLM_BASE_URL", "notaurl"),  # was a worker failing every turn
    ("SMITH_FALLBACK_POLL", "0"),  # was an idle worker spinning on its queue
    ("SMITH_FALLBACK_POLL", "-1"),
])
def test_smith_worker_refuses_a_bad_setting_at_once_in_one_line(variable, value):
    """The installed ``smith-worker`` script: it exits (a started worker would run past the 60 s ``timeout``
    of :func:`run`, failing the test) with exit code 1 and one line naming the variable and quoting the value."""
    script = str(Path(sys.executable).parent / "smith-worker")
    result = subprocess.run([script, "tests.support.app:app", "--queue", "turns"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), **{variable: value}))
    assert result.returncode == 1
    assert_one_clean_line(result, f"smith-worker: ConfigurationError: {variable} must be ")
    assert result.stderr.rstrip().endswith(f"got {value!r}")


@pytest.mark.parametrize("module", ["smith_worker.demo.run", "smith_worker.demo.chat", "examples.web.run"])
def test_make_demo_chat_and_web_refuse_a_bad_setting_in_one_line_before_starting_anything(module):
    result = run(["-m", module], SMITH_FALLBACK_POLL="0")
    prog = {"smith_worker.demo.run": "make demo", "smith_worker.demo.chat": "make chat"}.get(module, "make web")
    assert_one_clean_line(result, f"{prog}: ConfigurationError: SMITH_FALLBACK_POLL must be ")


@pytest.mark.parametrize("port", ["abc", "99999", "0"])
def test_make_web_refuses_a_bad_port_before_starting_anything(port):
    result = run(["-m", "examples.web.run"], SMITH_WEB_PORT=port)
    assert_one_clean_line(result, "make web: ConfigurationError: SMITH_WEB_PORT must be a TCP port number")


def test_make_demo_refuses_a_redis_that_refuses_its_url_instead_of_starting_another(redis_url):
    result = run(["-m", "smith_worker.demo.run"], SMITH_REDIS_URL=redis_url.rsplit("/", 1)[0] + "/99")
    assert_one_clean_line(result, "make demo: ConfigurationError: the Redis at redis://")
    assert "DB index is out of range" in result.stderr


def test_smith_refuses_a_bad_setting_before_any_command():
    result = run(["-c", SMITH, "status"], SMITH_REDIS_SOCKET_TIMEOUT="0")
    assert_one_clean_line(result, "smith: ConfigurationError: SMITH_REDIS_SOCKET_TIMEOUT must be a number of seconds")


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--prefix", "bad prefix!", "--prefix must be 1-200 characters from [A-Za-z0-9_.:@-], got 'bad prefix!'"),
    ("--redis-url", "http://x", "--redis-url must be a redis://"),
])
def test_smith_checks_its_options_as_it_checks_their_variables(option, value, says):
    result = run(["-c", SMITH, "status", option, value])
    assert_one_clean_line(result, f"smith: ConfigurationError: {says}")


def test_smith_keys_needs_a_conversation():
    result = run(["-c", SMITH, "keys"])
    assert result.returncode == 2 and "keys needs --conversation ID" in result.stderr and "Traceback" not in result.stderr


def test_smith_keys_says_when_a_conversation_has_none(redis_url):
    result = run(["-c", SMITH, "--redis-url", redis_url, "--prefix", "nokeys", "--conversation", "none", "keys"])
    assert result.returncode == 0 and result.stdout == ""
    assert result.stderr.strip() == "no keys for conversation 'none' under prefix 'nokeys'"


@pytest.mark.parametrize("options_first", [False, True], ids=["after-the-command", "before-the-command"])
def test_smith_takes_its_options_after_the_command_and_before_it(redis_url, options_first):
    options = ["--redis-url", redis_url, "--prefix", "nokeys", "--conversation", "none"]
    result = run(["-c", SMITH, *(options + ["keys"] if options_first else ["keys", *options])])
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "no keys for conversation 'none' under prefix 'nokeys'"


@pytest.mark.parametrize(("command", "options"), [
    ("ask", ["--redis-url", "--prefix", "--agent", "--conversation", "--tenant NAME", "--timeout", "(default: 300)"]),
    ("chat", ["--redis-url", "--prefix", "--agent", "--conversation", "--tenant NAME", "--timeout"]),
    ("keys", ["--redis-url", "--prefix", "--conversation"]),
    ("status", ["--redis-url", "--prefix"]),
    ("pending", ["--redis-url", "--prefix", "TURN"]),
    ("approve", ["--redis-url", "--prefix", "TURN", "CALL", "--arguments JSON"]),
    ("reject", ["--redis-url", "--prefix", "TURN", "CALL", "--message TEXT", "(default:"]),
    ("result", ["--redis-url", "--prefix", "TURN", "CALL", "VALUE", "--error"]),
    ("respond", ["--redis-url", "--prefix", "TURN", "REQUEST", "{accept,decline,cancel}", "--content JSON"]),
])
def test_each_command_help_lists_its_options(command, options):
    smith = Path(sys.executable).with_name("smith")  # the installed console script, on this checkout's code
    environ = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([smith, command, "-h"], env=environ, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: smith {command} ")
    for option in options:
        assert option in result.stdout, (option, result.stdout)


def test_smith_ask_waits_300_s_by_default_and_its_timeout_option_wins():
    from smith_client.cli import parse_args

    assert parse_args(["ask", "hi"]).timeout == 300
    assert parse_args(["ask", "hi", "--timeout", "5"]).timeout == 5
    assert parse_args(["--timeout", "7", "ask", "hi"]).timeout == 7
    assert parse_args(["chat"]).timeout is None  # a REPL turn waits until Ctrl-C


@pytest.mark.parametrize("command", [["ask", "hi"], ["chat"]])
def test_smith_ask_and_chat_under_a_prefix_no_worker_serves_say_so_at_once(redis_url, command):
    result = run(["-c", SMITH, *command, "--redis-url", redis_url, "--prefix", "noworkers"])
    assert_one_clean_line(result, "smith: UnknownAgentError: no turn worker is registered under prefix 'noworkers'")


@pytest.mark.parametrize("command", [["ask", "hi"], ["chat"]])
def test_smith_ask_and_chat_refuse_a_bad_tenant_in_one_line(command):
    """``--tenant`` is checked as ``send(..., tenant=)`` checks it, before any Redis command (none answers here)."""
    result = run(["-c", SMITH, *command, "--tenant", "no spaces"], SMITH_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    assert_one_clean_line(result, "smith: InvalidRequestError: ")
    assert result.returncode == 1


def test_a_client_takes_its_redis_url_and_prefix_from_the_environment(redis_url, monkeypatch):
    """What ``make demo`` prints (SMITH_REDIS_URL=… SMITH_PREFIX=…) is what ``from_url()`` reads by default."""
    from smith_client import SmithClient, SyncSmithClient

    monkeypatch.setenv("SMITH_REDIS_URL", redis_url)
    monkeypatch.setenv("SMITH_PREFIX", "from-env")
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    for client in (SmithClient.from_url(), SyncSmithClient.from_url()):
        assert (client.keys.prefix, client.redis.connection_pool.connection_kwargs["port"]) == ("from-env", port)
    assert SmithClient.from_url(prefix="given").keys.prefix == "given"  # an argument wins


def test_smith_writing_into_a_closed_pipe_ends_quietly(redis_url):
    """`smith status | head -0`: the reader is gone before the first line; no traceback."""
    environ = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", SMITH, "status", "--redis-url", redis_url], env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    proc.stdout.close()  # as `head` does once it has what it wants
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "soon"])
def test_smith_ask_refuses_a_timeout_that_is_not_a_positive_number_of_seconds(value):
    result = run(["-c", SMITH, "ask", "--timeout", value, "hi"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"argument --timeout: must be a positive number of seconds, got '{value}'" in result.stderr


@pytest.mark.parametrize("value", ["[1, 2]", "{not json", '"text"'])
def test_smith_approve_refuses_arguments_that_are_not_a_json_object(value):
    result = run(["-c", SMITH, "approve", "turn-1", "call_1", "--arguments", value])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"argument --arguments: must be a JSON object, got {value!r}" in result.stderr


def test_smith_decisions_parse_their_arguments():
    from smith_client.cli import parse_args

    approve = parse_args(["approve", "t1", "c1", "--arguments", '{"path": "a.txt"}'])
    assert (approve.turn, approve.call, approve.arguments) == ("t1", "c1", {"path": "a.txt"})
    assert parse_args(["approve", "t1", "c1"]).arguments is None  # the model's arguments
    assert parse_args(["reject", "t1", "c1"]).message == "a person rejected this call"
    result = parse_args(["result", "t1", "c1", '{"color": "blue"}', "--error"])
    assert (result.value, result.error) == ('{"color": "blue"}', True)
    assert parse_args(["result", "t1", "c1", "blue"]).error is False


@pytest.mark.parametrize(("argv", "says"), [
    (["accept", "--content", "[1]"], "argument --content: must be a JSON object, got '[1]'"),
    (["accept", "--content", "{no"], "argument --content: must be a JSON object, got '{no'"),
    (["maybe"], "argument action: invalid choice: 'maybe'"),
])
def test_smith_respond_refuses_a_bad_action_or_content_as_usage(argv, says):
    result = run(["-c", SMITH, "respond", "turn-1", "req-1", *argv])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert says in result.stderr, result.stderr


@pytest.mark.parametrize(("argv", "says"), [
    (["decline", "--content", "{}"], "smith: InvalidRequestError: decline takes no content"),
    (["cancel", "--content", '{"a": 1}'], "smith: InvalidRequestError: cancel takes no content"),
])
def test_smith_respond_checks_its_answer_as_respond_does_before_connecting(argv, says):
    unreachable = f"redis://127.0.0.1:{free_port()}/0"  # not a TransportError: refused before any connection
    result = run(["-c", SMITH, "respond", "turn-1", "req-1", *argv], SMITH_REDIS_URL=unreachable)
    assert_one_clean_line(result, says)
    assert result.returncode == 1
