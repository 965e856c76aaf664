"""Heartbeat liveness (smith_worker.health) and connection options (smith_client.connection): unit level."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from fnmatch import fnmatchcase

import pytest

from smith_client.acl import tenant_acl_rules
from smith_client.keys import Keys
from smith_client.connection import connect_redis, parse_sentinels
from smith_client.errors import ConfigurationError
from smith_worker.config import Settings
from smith_worker.health import check_alive, heartbeat_forever, heartbeat_path, run_check


def test_the_default_heartbeat_file_is_named_after_prefix_queue_and_pid(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    path = heartbeat_path(Settings(prefix="acme"), "tools")
    assert path == tmp_path / f"smith-acme-tools-{os.getpid()}.heartbeat"
    assert heartbeat_path(Settings(heartbeat_file="/x/hb"), "tools") == __import__("pathlib").Path("/x/hb")


def test_check_finds_running_workers_files_and_ignores_dead_ones(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    settings = Settings(prefix="acme")
    assert check_alive(settings, "turns")[0] is False  # no file at all
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = heartbeat_path(settings, "turns", dead.pid)
    left.touch()  # fresh, but its process is gone (killed with SIGKILL: it never removed it)
    assert check_alive(settings, "turns")[0] is False
    assert not left.exists()  # the check deleted the leftover
    mine = heartbeat_path(settings, "turns")
    mine.touch()
    assert check_alive(settings, "turns")[0] is True
    assert check_alive(settings, "tools")[0] is False  # another queue's probe does not see it
    old = time.time() - 16
    os.utime(mine, (old, old))
    ok, why = check_alive(settings, "turns")
    assert ok is False and "15 s" in why


def test_check_without_a_queue_or_heartbeat_file_is_a_configuration_error(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    heartbeat_path(Settings(prefix="acme"), "turns").touch()  # a fresh heartbeat of some queue's worker
    with pytest.raises(ConfigurationError, match="--queue") as err:
        check_alive(Settings(prefix="acme"), None)
    assert err.value.fields["setting"] == "--queue"
    named = tmp_path / "pod.heartbeat"
    named.touch()
    assert check_alive(Settings(prefix="acme", heartbeat_file=str(named)), None)[0] is True  # the pod's own file
    env = dict(os.environ, TMPDIR=str(tmp_path), SMITH_PREFIX="acme")
    env.pop("SMITH_HEARTBEAT_FILE", None)
    probe = subprocess.run([sys.executable, "-m", "smith_worker", "--check"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert probe.returncode == 1 and probe.stderr.startswith("smith-worker: ConfigurationError: --check needs --queue")
    assert "Traceback" not in probe.stderr


async def test_heartbeat_is_touched_from_the_event_loop(tmp_path):
    path = tmp_path / "hb"
    task = asyncio.create_task(heartbeat_forever(path, interval=0.05))
    await asyncio.sleep(0.02)
    first = path.stat().st_mtime_ns
    await asyncio.sleep(0.2)
    task.cancel()
    assert path.stat().st_mtime_ns > first


def test_ready_fails_when_redis_does_not_answer(tmp_path, capsys):
    from smith_worker.local.processes import free_port

    hb = tmp_path / "hb"
    hb.touch()
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", heartbeat_file=str(hb))
    assert run_check(settings, "turns", ready=False) == 0
    assert run_check(settings, "turns", ready=True) == 1
    assert "redis does not answer" in capsys.readouterr().out


def test_sentinel_addresses_and_their_errors():
    assert parse_sentinels("a:1, b:26379") == [("a", 1), ("b", 26379)]
    assert parse_sentinels([("h", "2"), "[::1]:3"]) == [("h", 2), ("::1", 3)]
    assert parse_sentinels(None) == []
    with pytest.raises(ConfigurationError, match="host:port"):
        parse_sentinels("nohost")
    with pytest.raises(ConfigurationError, match="both"):
        connect_redis("redis://x/0", sentinels="a:1")


def test_settings_read_the_operations_variables(monkeypatch):
    monkeypatch.setenv("SMITH_REDIS_SENTINELS", "s1:26379")
    monkeypatch.setenv("SMITH_REDIS_SENTINEL_MASTER", "m")
    monkeypatch.setenv("SMITH_METRICS_PORT", "9464")
    monkeypatch.setenv("SMITH_HEARTBEAT_FILE", "/tmp/hb")
    s = Settings.from_env()
    assert (s.redis_sentinels, s.redis_sentinel_master, s.metrics_port, s.heartbeat_file) == \
        ("s1:26379", "m", 9464, "/tmp/hb")
    assert Settings().metrics_port is None


def test_tenant_acl_rules_confine_keys_and_channels_to_the_prefix():
    rules = tenant_acl_rules("acme", "pw")
    assert rules[:3] == ["reset", "on", ">pw"]
    patterns = [r for r in rules if r[0] in "~&"]
    assert patterns == ["~acme:*", "~arq:job:acme:*", "~arq:in-progress:acme:*", "~arq:result:acme:*",
                        "~arq:retry:acme:*", "&acme:*"]  # the abort set is acme:abort-requests
    assert "-@all" in rules and "+keys" not in rules and "+scan" not in rules


def test_tenant_acl_rules_on_a_cluster_cover_the_tagged_names_and_cluster_slots():
    rules = tenant_acl_rules("acme", "pw", cluster=True)
    patterns = [r for r in rules if r[0] in "~&"]
    assert patterns == ["~{acme}:*", "~arq:job:{acme}:*", "~arq:in-progress:{acme}:*", "~arq:result:{acme}:*",
                        "~arq:retry:{acme}:*", "&{acme}:*"]
    assert "+cluster|slots" in rules and "+cluster|slots" not in tenant_acl_rules("acme", "pw")


def test_the_abort_set_is_a_key_of_the_prefix_apart_from_its_aborts_channel():
    acme = Keys("acme")
    assert acme.abort_set == "acme:abort-requests" != acme.tool_aborts_channel
    assert acme.abort_set != Keys("acme2").abort_set and acme.abort_set != Keys.arq_abort_set()
    # its ACL and SCAN patterns cover it (the hygiene report and the demo's clean-up find it), arq's set they do not
    assert any(fnmatchcase(acme.abort_set, pattern) for pattern in acme.key_patterns)
    assert not any(fnmatchcase(Keys.arq_abort_set(), pattern[1:]) for pattern in acme.acl_patterns)
