"""The ``SMITH_*`` environment variables clients and workers share, checked in one model.

:class:`ClientSettings` owns each variable's name (``SMITH_`` + the field name
in capitals), type, default and bounds; the worker's
:class:`smith_worker.config.Settings` extends it with the worker's own. A bad
value is refused when the settings are read, with one
:class:`~smith_client.errors.ConfigurationError` line naming the variable,
quoting the value (cut to ~80 characters, a URL's password masked) and saying
what is accepted, e.g.::

    SMITH_FALLBACK_POLL must be a number of seconds > 0, got '0'

An empty variable counts as unset (its default applies), as in a shell's
``${VAR:-default}``. The variables are listed, with their defaults, in the
README's Configuration section.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Self
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.functional_validators import ModelWrapValidatorHandler

from smith_client.connection import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SOCKET_TIMEOUT,
    MIN_MAX_CONNECTIONS,
    check_url,
    parse_sentinels,
)
from smith_client.errors import ConfigurationError
from smith_client.keys import DEFAULT_HISTORY_TTL, DEFAULT_TURN_TTL, ID_PATTERN, MAX_SHARDS
from smith_client.validation import DEFAULT_CONTEXT_MAX_BYTES, shown

#: The Redis a client or worker uses when ``SMITH_REDIS_URL`` is unset.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: Prefix of every variable: field ``fallback_poll`` is ``SMITH_FALLBACK_POLL``.
ENV_PREFIX = "SMITH_"


class Accepts(str):
    """What a setting accepts, in words, put in its type's ``Annotated`` metadata: a refused value's
    :class:`ConfigurationError` reads ``<VARIABLE> must be <this>, got <value>``."""


class Secret:
    """``Annotated`` metadata of a setting whose refused value an error never quotes (an API key)."""


def env_name(field: str) -> str:
    """The environment variable of settings field ``field`` (``fallback_poll`` → ``SMITH_FALLBACK_POLL``)."""
    return ENV_PREFIX + field.upper()


Seconds = Annotated[float, Field(gt=0), Accepts("a number of seconds > 0")]
WholeSeconds = Annotated[int, Field(gt=0), Accepts("a whole number of seconds > 0")]
Count = Annotated[int, Field(ge=1), Accepts("a whole number of at least 1")]
Bytes = Annotated[int, Field(ge=1), Accepts("a whole number of bytes of at least 1")]
ConnectionCap = Annotated[
    int,
    Field(ge=MIN_MAX_CONNECTIONS),
    Accepts(f"a whole number of at least {MIN_MAX_CONNECTIONS} (one is the shared pub/sub connection)"),
]


def _redis_url(value: str) -> str:
    """``value`` if redis-py parses it and it names a server: a host (``redis://``, ``rediss://``) or a
    socket path (``unix://``)."""
    try:
        check_url(value)
        parts = urlsplit(value)
    except (ConfigurationError, ValueError) as exc:
        raise ValueError(str(exc)) from exc
    if not (parts.path if parts.scheme == "unix" else parts.hostname):
        raise ValueError("no host")
    return value


def _sentinels(value: str | None) -> str | None:
    """``value`` if every comma-separated item is ``host:port`` (:func:`parse_sentinels`)."""
    try:
        parse_sentinels(value)
    except ConfigurationError as exc:
        raise ValueError(exc.message) from exc
    return value


#: ASCII control characters (a newline, NUL…): refused in a name, a path or a header value.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _text(value: str | None) -> str | None:
    if value is not None and (not value.strip() or _CONTROL.search(value)):
        raise ValueError("blank or with control characters")
    return value


def _prefix(value: str | None) -> str | None:
    if value is not None and not ID_PATTERN.match(value):
        raise ValueError("not an id")
    return value


_TEXT = Accepts("text that is not blank and has no control characters")
#: A free-form setting (a name, a path, a key): not blank, no control characters.
Text = Annotated[str, AfterValidator(_text), _TEXT]
#: The same, or None when unset.
OptionalText = Annotated[str | None, AfterValidator(_text), _TEXT]
RedisUrl = Annotated[
    str, AfterValidator(_redis_url), Accepts("a redis://, rediss:// (TLS) or unix:// URL naming a host or socket")
]
Prefix = Annotated[str, AfterValidator(_prefix), Accepts("1-200 characters from [A-Za-z0-9_.:@-]")]
#: An id set by the operator (``SMITH_WORKER_ID``), or None when unset.
OptionalId = Annotated[str | None, AfterValidator(_prefix), Accepts("1-200 characters from [A-Za-z0-9_.:@-]")]
ShardCount = Annotated[int, Field(ge=1, le=MAX_SHARDS), Accepts(f"a whole number of shards from 1 to {MAX_SHARDS}")]
Flag = Annotated[bool, Accepts("a boolean: 1, 0, true, false, yes, no, on or off")]
Sentinels = Annotated[
    str | None, AfterValidator(_sentinels), Accepts("a comma-separated list of host:port Sentinel addresses")
]

#: ``scheme://user:password@`` in a quoted URL: the password is masked (it would end up in logs).
_URL_PASSWORD = re.compile(r"(//[^/@:]*:)[^/@]*@")
#: A ``password=`` query parameter (redis-py reads one) in a URL: masked too.
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*")


def masked_url(url: str) -> str:
    """``url`` with its password (``scheme://user:password@``, a ``password=`` query parameter) shown as ``***``."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", url))


def _quoted(value: Any) -> str:
    """A refused value as an error quotes it: its ``repr`` cut to ~80 characters, a URL's password masked."""
    return shown(masked_url(value) if isinstance(value, str) else value)


class ClientSettings(BaseModel):
    """The settings clients and workers share, one field per ``SMITH_*`` variable (:func:`env_name`).

    Built from the environment by :meth:`from_env`, or with keyword arguments (field names).
    Raises :class:`ConfigurationError` (``setting`` = the variable's name) for a refused value.
    All durations are seconds.
    """

    model_config = ConfigDict(
        frozen=True, populate_by_name=True, alias_generator=env_name, allow_inf_nan=False, extra="forbid"
    )

    redis_url: RedisUrl = Field(DEFAULT_REDIS_URL, description="the Redis of the deployment")
    prefix: Prefix = Field("smith", description="prefix of every key, queue and channel name")
    redis_sentinels: Sentinels = Field(None, description="Sentinels to ask for the master (with the master's name)")
    redis_sentinel_master: OptionalText = Field(None, description="name of the Sentinel-monitored master")
    redis_cluster: Flag = Field(
        False,
        description="the URL names a Redis Cluster node; every key shares the prefix's hash slot (docs/cluster.md)",
    )
    shards: ShardCount = Field(
        1, description="shards of the deployment, a conversation in one (docs/cluster.md, Shards); fixed per deployment"
    )
    redis_socket_timeout: Seconds = Field(DEFAULT_SOCKET_TIMEOUT, description="bound on one Redis connect or command")
    redis_max_connections: ConnectionCap = Field(
        DEFAULT_MAX_CONNECTIONS, description="cap on one client's Redis connections (not the workers')"
    )
    turn_ttl: WholeSeconds = Field(DEFAULT_TURN_TTL, description="lifetime of a turn's keys after its last write")
    history_ttl: WholeSeconds = Field(
        DEFAULT_HISTORY_TTL, description="idle lifetime of a conversation's keys after its last write"
    )
    context_max_bytes: Bytes = Field(
        DEFAULT_CONTEXT_MAX_BYTES, description="cap on a turn's caller context, compact JSON (checked by clients)"
    )

    @model_validator(mode="wrap")
    @classmethod
    def _one_line(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """pydantic's errors as one :class:`ConfigurationError` about the first refused variable."""
        try:
            return handler(data)
        except ValidationError as exc:
            raise cls._refused(exc.errors()[0]) from None

    @classmethod
    def _refused(cls, error: Any) -> ConfigurationError:
        loc = str(error["loc"][0]) if error["loc"] else ""
        field = next((f for f, info in cls.model_fields.items() if loc in (f, info.alias)), None)
        if field is None:  # not a variable of this model (an unknown keyword argument)
            return ConfigurationError(f"{loc}: {error['msg']}", setting=loc)
        metadata = cls.model_fields[field].metadata
        accepts = next((m for m in metadata if isinstance(m, Accepts)), None)
        name = env_name(field)
        value = (
            "a value (not shown: a secret)" if any(isinstance(m, Secret) for m in metadata) else _quoted(error["input"])
        )
        if accepts is None:  # a free-form setting given a value of the wrong type in Python
            return ConfigurationError(f"{name}: {error['msg']}, got {value}", setting=name)
        return ConfigurationError(f"{name} must be {accepts}, got {value}", setting=name)

    @model_validator(mode="after")
    def _topology(self) -> Self:
        """Sentinel needs both the addresses and the master's name, and is not for a cluster."""
        if bool(self.redis_sentinels) != bool(self.redis_sentinel_master):
            given, missing = (
                ("SENTINELS", "SENTINEL_MASTER") if self.redis_sentinels else ("SENTINEL_MASTER", "SENTINELS")
            )
            raise ConfigurationError(
                f"SMITH_REDIS_{given} needs SMITH_REDIS_{missing} too (Sentinel needs both)",
                setting=f"SMITH_REDIS_{missing}",
            )
        if self.redis_cluster and self.redis_sentinels:
            raise ConfigurationError(
                "SMITH_REDIS_CLUSTER and SMITH_REDIS_SENTINELS exclude each other (a cluster promotes replicas itself)",
                setting="SMITH_REDIS_CLUSTER",
            )
        return self

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, only: Iterable[str] | None = None) -> Self:
        """The settings of ``env`` (default ``os.environ``); variables not set, or empty, keep their defaults.

        ``only`` (field names) reads just those variables, the others keeping their defaults: for a
        library call that needs one setting and must not fail on another it does not use.
        Raises :class:`ConfigurationError` naming the first refused variable.
        """
        env = os.environ if env is None else env
        fields = cls.model_fields if only is None else only
        values = {env_name(field): env.get(env_name(field)) for field in fields}
        return cls.model_validate({name: value for name, value in values.items() if value})
