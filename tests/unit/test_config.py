"""Loop and LLM-client defaults are those of docs/architecture.md, Limits and defaults; every
``SMITH_*`` variable is checked when the settings are read, a bad one refused in one line naming it."""

import re
from pathlib import Path

import pytest

from smith_client.errors import ConfigurationError
from smith_client.settings import ClientSettings, env_name
from smith_client.validation import shown
from smith_worker.config import AgentConfig, Settings
from smith_worker.llm import LlmClientConfig

ROOT = Path(__file__).resolve().parents[2]


def test_agent_config_defaults_are_the_documented_ones():
    cfg = AgentConfig()
    assert (cfg.max_iterations, cfg.tree_max_iterations, cfg.deadline, cfg.max_total_tokens) == (16, 50, None, None)
    assert cfg.default_tool_timeout == 30.0  # seconds
    assert cfg.tool_result_max_bytes == 64 * 1024 and cfg.stream_default is True


def test_llm_client_config_defaults_are_the_documented_ones():
    cfg = LlmClientConfig(base_url="http://127.0.0.1:8080/v1", model="m")
    assert cfg.api_key is None and cfg.request_timeout == 60.0 and cfg.max_retries == 3
    assert (cfg.backoff_base, cfg.max_retry_after, cfg.include_usage) == (0.5, 60.0, True)


def test_history_max_messages_defaults_to_10000_and_reads_the_environment(monkeypatch):
    assert Settings.from_env().history_max_messages == 10_000
    monkeypatch.setenv("SMITH_HISTORY_MAX_MESSAGES", "500")
    assert Settings.from_env().history_max_messages == 500


def test_view_max_bytes_defaults_to_16_mib_and_reads_the_environment(monkeypatch):
    assert Settings.from_env().view_max_bytes == 16 * 1024 * 1024
    monkeypatch.setenv("SMITH_VIEW_MAX_BYTES", "65536")
    assert Settings.from_env().view_max_bytes == 65536


def test_tool_calling_and_temperature_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("SMITH_LLM_TOOL_CALLING", "json_schema")
    monkeypatch.setenv("SMITH_LLM_TEMPERATURE", "0")
    config = Settings.from_env().llm_config()
    assert config.tool_calling == "json_schema" and config.default_sampling.temperature == 0.0
    assert (
        Settings.from_env().llm_config({"tool_calling": "native"}).tool_calling == "native"
    )  # an agent's override wins
    monkeypatch.delenv("SMITH_LLM_TEMPERATURE")
    assert Settings.from_env().llm_config().default_sampling.temperature is None
    monkeypatch.setenv("SMITH_LLM_TOOL_CALLING", "grammar")
    with pytest.raises(ConfigurationError):
        Settings.from_env().llm_config()


#: Refused values of every SMITH_* variable the worker and the client read (the next test keeps it complete).
BAD_VALUES = {
    "SMITH_REDIS_URL": ["notaurl", "bogus://x", "redis://127.0.0.1:notaport/0", "redis:///0", "unix://"],
    "SMITH_PREFIX": ["a b", "tenant*", "x" * 201],
    "SMITH_REDIS_SENTINELS": ["nohost", "s1:port"],
    "SMITH_REDIS_SENTINEL_MASTER": [" ", "m\n"],
    "SMITH_REDIS_CLUSTER": ["maybe", "2"],
    "SMITH_REDIS_SOCKET_TIMEOUT": ["0", "-1", "soon", "inf", "nan"],
    "SMITH_REDIS_MAX_CONNECTIONS": ["1", "0", "many", "2.5"],
    "SMITH_WORKER_ID": ["a b", "x" * 201],
    "SMITH_SHARDS": ["0", "257", "two"],
    "SMITH_SHARD": ["-1", "256", "one"],
    "SMITH_TURN_TTL": ["0", "-5", "1.5", "day"],
    "SMITH_HISTORY_TTL": ["0", "-1"],
    "SMITH_CONTEXT_MAX_BYTES": ["0", "-1", "64KiB", "1.5"],
    "SMITH_LLM_BASE_URL": ["notaurl", "ftp://h/v1", "http:///v1", "http://h:99999/v1", "127.0.0.1:8080/v1"],
    "SMITH_LLM_MODEL": [" ", "a\nb"],
    "SMITH_LLM_API_KEY": ["sk-secret\n"],
    "SMITH_LLM_TOOL_CALLING": ["grammar"],
    "SMITH_LLM_TEMPERATURE": ["-0.1", "2.5", "hot"],
    "SMITH_LLM_RPM": ["0", "-1", "1.5", "many"],
    "SMITH_LLM_TPM": ["0", "10k"],
    "SMITH_LLM_RATE_BURST": ["-1", "soon"],
    "SMITH_TURN_MAX_JOBS": ["0", "-3", "abc", "1.5"],
    "SMITH_LLM_MAX_CONNECTIONS": ["0", "many", "2.5"],
    "SMITH_WORKER_REDIS_MAX_CONNECTIONS": ["1", "0", "many"],
    "SMITH_TOOL_MAX_JOBS": ["0"],
    "SMITH_TURN_JOB_TIMEOUT": ["0", "-1"],
    "SMITH_TOOL_JOB_TIMEOUT": ["0"],
    "SMITH_TURN_MAX_ATTEMPTS": ["0"],
    "SMITH_FALLBACK_POLL": ["0", "-1", "inf"],
    "SMITH_TOKEN_COALESCE": ["-0.5", "x"],
    "SMITH_TOOL_MAX_OVERRUNS": ["0"],
    "SMITH_TENANT_LABELS_MAX": ["0", "-1", "many", "1.5"],
    "SMITH_TENANT_WEIGHTS": ["acme", "acme=0", "acme=-1", "acme=many", "acme=nan", "a:b=1", "=2", "acme=1e-300",
                             "acme=2,acme=3", "acme=5000000", "acme=inf"],
    "SMITH_TOOL_PROCESSES": ["0"],
    "SMITH_METRICS_PORT": ["0", "70000", "http"],
    "SMITH_HEARTBEAT_FILE": [" ", "hb\n"],
    "SMITH_HISTORY_MAX_MESSAGES": ["0"],
    "SMITH_VIEW_MAX_BYTES": ["0", "-1", "16MiB", "1.5"],
    "SMITH_LOG_LEVEL": ["LOUD", "5"],
    "SMITH_LOG_JOBS": ["maybe"],
    "SMITH_OTEL": ["maybe"],
}


def test_the_table_covers_every_variable_of_the_settings():
    assert set(BAD_VALUES) == {env_name(field) for field in Settings.model_fields}
    assert {env_name(field) for field in ClientSettings.model_fields} < set(BAD_VALUES)


@pytest.mark.parametrize(("variable", "value"), [(v, bad) for v, values in BAD_VALUES.items() for bad in values])
def test_a_bad_value_is_one_configuration_error_naming_the_variable(variable, value):
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({variable: value})
    message = info.value.message
    assert info.value.setting == variable and message.startswith(f"{variable} must be ") and "\n" not in message
    if variable == "SMITH_LLM_API_KEY":
        assert value.strip() not in message  # a secret is never quoted
    else:
        assert message.endswith(f"got {shown(value)}")  # quoted, cut to ~80 characters
    assert len(message) < 300


@pytest.mark.parametrize("variable", sorted({env_name(field) for field in ClientSettings.model_fields}))
def test_the_client_refuses_the_variables_it_reads_too(variable):
    with pytest.raises(ConfigurationError) as info:
        ClientSettings.from_env({variable: BAD_VALUES[variable][0]})
    assert info.value.setting == variable


def test_unset_or_empty_variables_keep_their_defaults_and_values_are_normalized():
    assert Settings.from_env({}) == Settings() == Settings.from_env(dict.fromkeys(BAD_VALUES, ""))
    settings = Settings.from_env(
        {
            "SMITH_LOG_LEVEL": "debug",
            "SMITH_LLM_BASE_URL": "https://h:8443/v1/",
            "SMITH_LOG_JOBS": "1",
            "SMITH_METRICS_PORT": "9464",
            "SMITH_FALLBACK_POLL": "0.25",
            "SMITH_REDIS_URL": "unix:///run/redis.sock",
            "SMITH_TOKEN_COALESCE": "0",
        }
    )
    assert (settings.log_level, settings.llm_base_url, settings.log_jobs) == ("DEBUG", "https://h:8443/v1", True)
    assert (settings.metrics_port, settings.fallback_poll, settings.token_coalesce) == (9464, 0.25, 0.0)
    with pytest.raises(ConfigurationError, match="SMITH_FALLBACK_POLL must be a number of seconds > 0, got 0$"):
        Settings(fallback_poll=0)  # keyword arguments are checked as the environment is


def test_a_worker_serves_one_of_the_shards_and_names_its_keys_after_it():
    with pytest.raises(ConfigurationError, match="SMITH_SHARD must be one of the 3 shard") as info:
        Settings.from_env({"SMITH_SHARDS": "3", "SMITH_SHARD": "3"})
    assert info.value.setting == "SMITH_SHARD"
    with pytest.raises(ConfigurationError, match="SMITH_SHARD must be one of the 1 shard"):
        Settings.from_env({"SMITH_SHARD": "1"})
    sharded = Settings.from_env({"SMITH_PREFIX": "acme", "SMITH_SHARDS": "3", "SMITH_SHARD": "2"})
    assert (sharded.keys().prefix, sharded.fleet_keys().prefix) == ("acme:s2", "acme")
    assert Settings.from_env({"SMITH_PREFIX": "acme"}).keys().prefix == "acme"  # one shard: today's names
    every = Settings.from_env({"SMITH_PREFIX": "acme", "SMITH_SHARDS": "3"})  # no SMITH_SHARD: a process per shard
    assert [shard.keys().prefix for shard in every.each_shard()] == ["acme:s0", "acme:s1", "acme:s2"]
    assert sharded.each_shard() == [sharded]
    probed = Settings.from_env({"SMITH_SHARDS": "2", "SMITH_HEARTBEAT_FILE": "/run/hb"})  # a file of each child's own
    assert [shard.heartbeat_file for shard in probed.each_shard()] == ["/run/hb.s0", "/run/hb.s1"]
    with pytest.raises(ConfigurationError, match="SMITH_SHARD is not set: which of the 3 shards"):
        every.keys()


def test_an_agents_llm_base_url_is_checked_at_start_too():
    with pytest.raises(ConfigurationError, match="invalid LLM settings: base_url: .*not an http:// or https:// URL"):
        Settings().llm_config({"base_url": "notaurl"})


def test_a_refused_url_is_quoted_without_its_password():
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({"SMITH_REDIS_URL": "redis://user:hunter2@host:notaport/0"})
    assert "hunter2" not in info.value.message and "user:***@host" in info.value.message


def test_sentinel_needs_both_variables():
    with pytest.raises(ConfigurationError, match="SMITH_REDIS_SENTINELS needs SMITH_REDIS_SENTINEL_MASTER"):
        ClientSettings.from_env({"SMITH_REDIS_SENTINELS": "s1:26379"})
    with pytest.raises(ConfigurationError, match="SMITH_REDIS_SENTINEL_MASTER needs SMITH_REDIS_SENTINELS"):
        ClientSettings.from_env({"SMITH_REDIS_SENTINEL_MASTER": "mymaster"})
    both = ClientSettings.from_env({"SMITH_REDIS_SENTINELS": "s1:26379", "SMITH_REDIS_SENTINEL_MASTER": "mymaster"})
    assert (both.redis_sentinels, both.redis_sentinel_master) == ("s1:26379", "mymaster")


#: Modules that read SMITH_* variables of their own: the demo launcher and the local model server it starts
#: (``make demo``), and the demo app's sandbox folder; none is read by a worker or client of another app.
OWN_VARIABLES = ("smith_worker/demo/", "smith_worker/local/")


def test_no_module_reads_a_smith_variable_past_the_settings():
    read = re.compile(r"""(environ\.get\(|environ\[|getenv\()\s*["']SMITH_""")
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("smith_client", "smith_worker")
        for path in (ROOT / package).rglob("*.py")
        if read.search(path.read_text()) and not str(path.relative_to(ROOT)).startswith(OWN_VARIABLES)
    ]
    assert offenders == []


def test_the_readme_lists_every_variable():
    readme = (ROOT / "README.md").read_text()
    rows = set(re.findall(r"^\| `(SMITH_[A-Z_]+)`", readme, re.MULTILINE))
    assert {env_name(field) for field in Settings.model_fields} <= rows


def test_tenant_weights_parse_into_a_map():
    from smith_worker.config import parse_tenant_weights

    assert parse_tenant_weights("") == {}
    assert parse_tenant_weights(" acme=3, beta=0.5 ,") == {"acme": 3.0, "beta": 0.5}
    assert Settings.from_env({"SMITH_TENANT_WEIGHTS": "acme=2"}).tenant_weights == "acme=2"
