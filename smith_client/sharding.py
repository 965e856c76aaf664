"""``ShardedSmithClient`` (asyncio) and ``SyncShardedSmithClient`` (blocking): the clients of a deployment sharded by
conversation (docs/cluster.md, Shards).

A deployment of ``SMITH_SHARDS`` = S > 1 shards is S deployments of one shard each, under the prefixes
``<prefix>:s0`` … ``<prefix>:s<S-1>`` (:func:`~smith_client.keys.shard_prefix`): each has its own queues,
workers (``SMITH_SHARD``), conversations and turns, and on Redis Cluster its own hash slot (the hash tag
``{smith:s3}``), so the shards spread over the masters. A conversation lives in shard
:func:`~smith_client.keys.shard_of` (CRC16 of its id mod S), with every one of its turns, their tool calls,
sub-agents and events: every script still touches one slot.

This client holds one :class:`~smith_client.client.SmithClient` per shard and sends each call where its keys
are: by ``conversation_id`` (``send``, ``stream``, ``submit``, ``history``, skills…), by turn (``turn``,
``follow``, ``pending``, ``approve``…: the shard that sent it, remembered for the last :data:`REMEMBERED_TURNS`
turns this client sent, else asked of every shard at once), to every shard (tenant limits: each shard's workers
read their own copy) or summed over them (``usage``).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Sequence
from contextlib import aclosing
from typing import Any, Generic, Self, TypeVar, Unpack, cast

from smith_client import turn_record as record
from smith_client.approvals import REJECTED, Decision
from smith_client.client import SmithClient, TurnHandle
from smith_client.errors import ConfigurationError, ConflictError
from smith_client.events import Event, PendingItem
from smith_client.inputs import InputResponse
from smith_client.keys import Keys, now_ms, shard_of, shard_prefix
from smith_client.messages import Message
from smith_client.protocol import Operation, run
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.settings import ClientSettings
from smith_client.sync_client import SyncSmithClient, SyncTurnHandle
from smith_client.tenants import QuotaStatus, TenantLimits
from smith_client.usage import AgentUsage
from smith_client.validation import TurnOptions, build_turn_request, check_id

T = TypeVar("T")
C = TypeVar("C", SmithClient, SyncSmithClient)

#: How many turn ids a client remembers the shard of (those it sent), so their calls go to one shard.
REMEMBERED_TURNS = 10_000


def check_shard_count(stored: bytes | str | None, shards: int, prefix: str, unsharded_workers: int = 0) -> None:
    """Raise :class:`ConfigurationError` (``SMITH_SHARDS``) unless ``shards`` is the deployment's count: ``stored``,
    as its workers set it (:attr:`Keys.shard_count`; None: none set, then 1 when ``unsharded_workers``, workers
    registered under the prefix itself, are live). With another count a conversation's turns would go to another
    shard than its history, or to no worker at all."""
    count = int(stored) if stored is not None else 1 if shards > 1 and unsharded_workers else None
    if count is not None and count != shards:
        raise ConfigurationError(
            f"SMITH_SHARDS is {shards}, but the workers of prefix {prefix!r} run {count} shard(s): every "
            "worker and client of a deployment needs the same count (docs/cluster.md, Shards)",
            setting="SMITH_SHARDS",
        )


def read_shard_count(keys: Keys) -> Operation[tuple[bytes | None, int]]:
    """Operation reading the deployment's count of shards as its workers set it (None: none set yet) and how many
    workers are live under the prefix itself (an unsharded deployment's), in one round trip."""
    rt = RoundTrip()
    stored: Pending[bytes | None] = rt.call("get", keys.shard_count)
    unsharded: Pending[int] = rt.call("zcount", keys.workers, now_ms(), "+inf")
    yield from run(rt)
    return stored.value, unsharded.value


def claim_turn_shard(keys: Keys, turn_id: str, shard: int) -> Operation[None]:
    """Operation claiming caller-chosen ``turn_id`` for ``shard`` (:meth:`Keys.turn_shard`); raises
    :class:`ConflictError` when a send of it claimed another shard: the same id for a conversation of another
    shard, so another request (docs/architecture.md: a turn id is an idempotency key)."""
    rt = RoundTrip(transaction=True)
    rt.call("set", keys.turn_shard(turn_id), shard, nx=True, ex=keys.turn_ttl)
    claimed: Pending[bytes | None] = rt.call("get", keys.turn_shard(turn_id))
    yield from run(rt)
    if claimed.value is not None and int(claimed.value) != shard:
        raise ConflictError(f"turn {turn_id} exists with a different request (in another shard)", turn_id=turn_id)


class ShardRouting(Generic[C]):
    """What the asyncio and blocking sharded clients share: one client per shard, shard ``k``'s at index ``k``, and
    which of them holds a conversation or a turn (the module docstring). Raises :class:`ConfigurationError` for no
    client."""

    #: The client class of one shard (:class:`SmithClient` or :class:`SyncSmithClient`).
    client_class: type[C]

    def __init__(self, clients: Sequence[C], fleet: C | None = None) -> None:
        if not clients:
            raise ConfigurationError("a sharded client needs at least one shard", setting="SMITH_SHARDS")
        self.clients: list[C] = list(clients)
        #: The client of the deployment's prefix itself, where the workers keep their count of shards: checked
        #: against :attr:`shards` before the first turn is sent (None: not checked).
        self.fleet: C | None = fleet
        self._count_checked = fleet is None
        self._turn_shards: OrderedDict[str, int] = OrderedDict()
        self._turns_lock = threading.Lock()  # the blocking client's threads share the remembered turns

    @classmethod
    def from_url(
        cls, redis_url: str | None = None, *, shards: int | None = None, prefix: str | None = None, **options: Any
    ) -> Self:
        """Connect lazily to the ``shards`` shards (default ``SMITH_SHARDS``) of the deployment under ``prefix``
        (default ``SMITH_PREFIX``, else ``smith``) at ``redis_url``: one ``from_url`` of the shard's client class per
        shard, with ``options`` (``cluster``, ``max_connections``, ``tenant``… as there; on Redis Cluster each
        shard's connections go to its slot's master). Raises :class:`ConfigurationError` for a bad count."""
        env = ClientSettings.from_env(only=[name for name, v in (("shards", shards), ("prefix", prefix)) if v is None])
        settings = ClientSettings.model_validate(
            {"shards": env.shards if shards is None else shards, "prefix": prefix or env.prefix}
        )
        return cls(
            [
                cls.client_class.from_url(
                    redis_url, prefix=shard_prefix(settings.prefix, k, settings.shards), shards=1, **options
                )
                for k in range(settings.shards)
            ],
            cls.client_class.from_url(redis_url, prefix=settings.prefix, shards=1, **options),
        )

    @property
    def shards(self) -> int:
        """How many shards the deployment has."""
        return len(self.clients)

    def for_conversation(self, conversation_id: str) -> C:
        """The client of the shard holding ``conversation_id`` (:func:`~smith_client.keys.shard_of`)."""
        return self.clients[shard_of(conversation_id, self.shards)]

    def _counted(self, fleet: C, found: tuple[bytes | None, int]) -> None:
        """Check the count :func:`read_shard_count` found; checked once a count is there (until then every send
        looks: no worker has started yet)."""
        stored, unsharded_workers = found
        check_shard_count(stored, self.shards, fleet.keys.prefix, unsharded_workers)
        self._count_checked = stored is not None

    def _sending(self, options: TurnOptions) -> C:
        """The shard a new turn goes to; gives the turn an id (as the client would) so its shard is remembered."""
        turn_id = options["turn_id"] = options.get("turn_id") or uuid.uuid4().hex
        conversation = options.get("conversation_id")
        # without a conversation the shard's client raises the usual InvalidRequestError
        client = self.for_conversation(conversation) if isinstance(conversation, str) else self.clients[0]
        self._remember(turn_id, self.clients.index(client))
        return client

    def _forget(self, turn_id: str) -> None:
        """Forget the shard of ``turn_id`` (a send of it was refused: it may be in another shard, or in none)."""
        with self._turns_lock:
            self._turn_shards.pop(turn_id, None)

    def _turn_claim(self, fleet: C, text: Any, options: TurnOptions, client: C, chosen: str) -> Operation[None]:
        """The claim of caller-chosen turn id ``chosen`` for the shard of ``client`` (:func:`claim_turn_shard`), made
        only for a request that passes the client's own checks, so a refused request claims no id (raises
        :class:`InvalidRequestError` as the client would). A request refused by the shard's Redis (an agent no worker
        serves) keeps its claim for ``turn_ttl``."""
        build_turn_request(text, client.with_tenant(options), client.context_max_bytes)
        return claim_turn_shard(fleet.keys, check_id(chosen, "turn_id"), self.clients.index(client))

    def _remember(self, turn_id: str, shard: int) -> None:
        with self._turns_lock:
            self._turn_shards[turn_id] = shard
            self._turn_shards.move_to_end(turn_id)
            while len(self._turn_shards) > REMEMBERED_TURNS:
                self._turn_shards.popitem(last=False)

    def _remembered(self, turn_id: str) -> int | None:
        """The shard of ``turn_id`` if this client knows it; raises :class:`InvalidRequestError` for a bad id."""
        check_id(turn_id, "turn_id")
        return self._turn_shards.get(turn_id)

    def _found(self, turn_id: str, statuses: Sequence[str]) -> C:
        """The client of the first shard whose status of ``turn_id`` is not ``missing`` (remembered), or shard 0's
        when none has it (its calls then answer as for an unknown turn)."""
        shard = next((k for k, status in enumerate(statuses) if status != record.MISSING), None)
        if shard is None:
            return self.clients[0]
        self._remember(turn_id, shard)
        return self.clients[shard]


class ShardedSmithClient(ShardRouting[SmithClient]):
    """Asyncio client of a deployment sharded by conversation: :class:`~smith_client.client.SmithClient`'s
    methods, arguments, events and errors, each call sent to the shard holding its keys (module docstring).

    ``clients`` is one client per shard, shard ``k``'s at index ``k`` (:meth:`from_url` builds them). What
    differs from one deployment: tenant limits are written to every shard and enforced by each shard's workers
    on the turns of that shard (a tenant's ``max_running`` and ``token_quota`` hold per shard), so
    :meth:`tenant_quota` gives each shard's :class:`~smith_client.tenants.QuotaStatus`; :meth:`turn` is a
    coroutine.
    """

    client_class = SmithClient

    async def _prepare(self, text: Any, options: TurnOptions) -> SmithClient:
        """Before a turn is sent: the count of shards checked (:func:`check_shard_count`) and a caller-chosen turn
        id claimed for its shard (:meth:`_turn_claim`), on the deployment's prefix itself; returns the client of the
        turn's shard (:meth:`_sending`). Raises :class:`ConfigurationError`, :class:`ConflictError`,
        :class:`InvalidRequestError`."""
        chosen = options.get("turn_id")
        client = self._sending(options)
        if self.fleet is not None and not self._count_checked:
            self._counted(self.fleet, await self.fleet.runner.run(read_shard_count(self.fleet.keys)))
        if chosen and self.fleet is not None:
            try:
                await self.fleet.runner.run(self._turn_claim(self.fleet, text, options, client, chosen))
            except ConflictError:  # the id's turn is in another shard: found there by the next call on it
                self._forget(chosen)
                raise
        return client

    async def for_turn(self, turn_id: str) -> SmithClient:
        """The client of the shard holding turn ``turn_id``: the remembered one, else the shard whose state of it
        is not ``missing`` (every shard asked at once); shard 0 when none has it (its calls then answer as for
        an unknown turn). Raises :class:`InvalidRequestError` for a malformed id."""
        shard = self._remembered(turn_id)
        if shard is not None:
            return self.clients[shard]
        return self._found(turn_id, await asyncio.gather(*(client.turn(turn_id).status() for client in self.clients)))

    async def _on_turn(self, turn_id: str, call: Callable[[SmithClient], Awaitable[T]]) -> T:
        return await call(await self.for_turn(turn_id))

    async def send(self, text: str, *, timeout: float | None = None, **options: Any) -> Any:
        """:meth:`SmithClient.send` on the conversation's shard."""
        client = await self._prepare(text, cast(TurnOptions, options))
        return await client.send(text, timeout=timeout, **options)

    async def stream(
        self, text: str, *, timeout: float | None = None, **options: Unpack[TurnOptions]
    ) -> AsyncGenerator[Event, None]:
        """:meth:`SmithClient.stream` on the conversation's shard (``async for``; leaving the loop early closes the
        shard's stream, which unsubscribes)."""
        client = await self._prepare(text, options)
        async with aclosing(client.stream(text, timeout=timeout, **options)) as events:
            async for event in events:
                yield event

    async def submit(self, text: str, **options: Unpack[TurnOptions]) -> TurnHandle:
        """:meth:`SmithClient.submit` on the conversation's shard."""
        return await (await self._prepare(text, options)).submit(text, **options)

    async def turn(self, turn_id: str) -> TurnHandle:
        """A handle on turn ``turn_id`` from its shard (:meth:`for_turn`; unlike :meth:`SmithClient.turn`, a
        coroutine: finding the shard of a turn this client did not send asks Redis)."""
        return (await self.for_turn(turn_id)).turn(turn_id)

    async def follow(
        self, turn_id: str, after_seq: int = 0, timeout: float | None = None
    ) -> AsyncGenerator[Event, None]:
        """:meth:`SmithClient.follow` on the turn's shard (``async for``, closed as :meth:`stream`)."""
        async with aclosing((await self.for_turn(turn_id)).follow(turn_id, after_seq, timeout)) as events:
            async for event in events:
                yield event

    async def clear(self, conversation_id: str) -> None:
        """:meth:`SmithClient.clear` on the conversation's shard."""
        await self.for_conversation(conversation_id).clear(conversation_id)

    async def history(self, conversation_id: str) -> list[Message]:
        """:meth:`SmithClient.history` on the conversation's shard."""
        return await self.for_conversation(conversation_id).history(conversation_id)

    async def conversation_agent(self, conversation_id: str) -> str | None:
        """:meth:`SmithClient.conversation_agent` on the conversation's shard."""
        return await self.for_conversation(conversation_id).conversation_agent(conversation_id)

    async def activate_skill(self, conversation_id: str, name: str) -> None:
        """:meth:`SmithClient.activate_skill` on the conversation's shard."""
        await self.for_conversation(conversation_id).activate_skill(conversation_id, name)

    async def deactivate_skill(self, conversation_id: str, name: str) -> None:
        """:meth:`SmithClient.deactivate_skill` on the conversation's shard."""
        await self.for_conversation(conversation_id).deactivate_skill(conversation_id, name)

    async def active_skills(self, conversation_id: str) -> list[str]:
        """:meth:`SmithClient.active_skills` on the conversation's shard."""
        return await self.for_conversation(conversation_id).active_skills(conversation_id)

    async def pending(self, turn_id: str) -> list[PendingItem]:
        """:meth:`SmithClient.pending` on the turn's shard."""
        return await self._on_turn(turn_id, lambda client: client.pending(turn_id))

    async def approve(self, turn_id: str, call_id: str, arguments: dict[str, Any] | None = None) -> Decision:
        """:meth:`SmithClient.approve` on the turn's shard."""
        return await self._on_turn(turn_id, lambda client: client.approve(turn_id, call_id, arguments))

    async def reject(self, turn_id: str, call_id: str, message: str = REJECTED) -> Decision:
        """:meth:`SmithClient.reject` on the turn's shard."""
        return await self._on_turn(turn_id, lambda client: client.reject(turn_id, call_id, message))

    async def submit_tool_result(self, turn_id: str, call_id: str, result: Any, is_error: bool = False) -> Decision:
        """:meth:`SmithClient.submit_tool_result` on the turn's shard."""
        return await self._on_turn(
            turn_id, lambda client: client.submit_tool_result(turn_id, call_id, result, is_error)
        )

    async def respond(
        self, turn_id: str, request_id: str, action: str, content: dict[str, Any] | None = None
    ) -> InputResponse:
        """:meth:`SmithClient.respond` on the turn's shard."""
        return await self._on_turn(turn_id, lambda client: client.respond(turn_id, request_id, action, content))

    async def usage(
        self, window_seconds: float = 3600, agent: str | None = None, tenant: str | None = None
    ) -> dict[str, AgentUsage]:
        """:meth:`SmithClient.usage` summed over the shards (one round trip per shard, at once)."""
        shards = await asyncio.gather(*(client.usage(window_seconds, agent, tenant) for client in self.clients))
        return _summed(shards)

    async def usage_by_tenant(
        self, window_seconds: float = 3600, agent: str | None = None, tenant: str | None = None
    ) -> dict[str, dict[str, AgentUsage]]:
        """:meth:`SmithClient.usage_by_tenant` summed over the shards."""
        shards = await asyncio.gather(
            *(client.usage_by_tenant(window_seconds, agent, tenant) for client in self.clients)
        )
        return _summed_by_tenant(shards)

    async def set_tenant_limits(self, tenant: str, limits: TenantLimits) -> None:
        """:meth:`SmithClient.set_tenant_limits` on every shard (each shard's workers enforce them on its turns)."""
        await asyncio.gather(*(client.set_tenant_limits(tenant, limits) for client in self.clients))

    async def update_tenant_limits(self, tenant: str, **changes: Any) -> None:
        """:meth:`SmithClient.update_tenant_limits` on every shard."""
        await asyncio.gather(*(client.update_tenant_limits(tenant, **changes) for client in self.clients))

    async def tenant_limits(self, tenant: str) -> TenantLimits:
        """:meth:`SmithClient.tenant_limits` as shard 0 has them (every shard gets the same writes)."""
        return await self.clients[0].tenant_limits(tenant)

    async def clear_tenant_limits(self, tenant: str) -> bool:
        """:meth:`SmithClient.clear_tenant_limits` on every shard; True when one had some."""
        return any(await asyncio.gather(*(client.clear_tenant_limits(tenant) for client in self.clients)))

    async def tenant_quota(self, tenant: str) -> list[QuotaStatus]:
        """Each shard's :meth:`SmithClient.tenant_quota`, shard 0 first: a tenant's quota holds per shard."""
        return list(await asyncio.gather(*(client.tenant_quota(tenant) for client in self.clients)))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every shard's client (:meth:`SmithClient.aclose`)."""
        await asyncio.gather(*(client.aclose() for client in [*self.clients, *([self.fleet] if self.fleet else [])]))


class SyncShardedSmithClient(ShardRouting[SyncSmithClient]):
    """The blocking twin of :class:`ShardedSmithClient`, for WSGI apps: :class:`SyncSmithClient`'s methods, each
    call sent to the shard holding its keys. Thread-safe, as each shard's client is. A turn this client did not
    send is looked for in the shards one after another."""

    client_class = SyncSmithClient

    def _prepare(self, text: Any, options: TurnOptions) -> SyncSmithClient:
        """:meth:`ShardedSmithClient._prepare`, blocking."""
        chosen = options.get("turn_id")
        client = self._sending(options)
        if self.fleet is not None and not self._count_checked:
            self._counted(self.fleet, self.fleet.runner.run(read_shard_count(self.fleet.keys)))
        if chosen and self.fleet is not None:
            try:
                self.fleet.runner.run(self._turn_claim(self.fleet, text, options, client, chosen))
            except ConflictError:  # as in ShardedSmithClient._prepare
                self._forget(chosen)
                raise
        return client

    def for_turn(self, turn_id: str) -> SyncSmithClient:
        """The client of the shard holding turn ``turn_id``, as :meth:`ShardedSmithClient.for_turn` finds it."""
        shard = self._remembered(turn_id)
        if shard is not None:
            return self.clients[shard]
        statuses = []
        for client in self.clients:
            statuses.append(client.turn(turn_id).status())
            if statuses[-1] != record.MISSING:
                break
        return self._found(turn_id, statuses)

    def send(self, text: str, *, timeout: float | None = None, **options: Any) -> Any:
        """:meth:`SyncSmithClient.send` on the conversation's shard."""
        return self._prepare(text, cast(TurnOptions, options)).send(text, timeout=timeout, **options)

    def stream(
        self, text: str, *, timeout: float | None = None, **options: Unpack[TurnOptions]
    ) -> Generator[Event, None, None]:
        """:meth:`SyncSmithClient.stream` on the conversation's shard (a plain iterator; errors at its first step, as
        there)."""
        yield from self._prepare(text, options).stream(text, timeout=timeout, **options)

    def submit(self, text: str, **options: Unpack[TurnOptions]) -> SyncTurnHandle:
        """:meth:`SyncSmithClient.submit` on the conversation's shard."""
        return self._prepare(text, options).submit(text, **options)

    def turn(self, turn_id: str) -> SyncTurnHandle:
        """A handle on turn ``turn_id`` from its shard (:meth:`for_turn`)."""
        return self.for_turn(turn_id).turn(turn_id)

    def follow(self, turn_id: str, after_seq: int = 0, timeout: float | None = None) -> Generator[Event, None, None]:
        """:meth:`SyncSmithClient.follow` on the turn's shard."""
        return self.for_turn(turn_id).follow(turn_id, after_seq, timeout)

    def clear(self, conversation_id: str) -> None:
        """:meth:`SyncSmithClient.clear` on the conversation's shard."""
        self.for_conversation(conversation_id).clear(conversation_id)

    def history(self, conversation_id: str) -> list[Message]:
        """:meth:`SyncSmithClient.history` on the conversation's shard."""
        return self.for_conversation(conversation_id).history(conversation_id)

    def conversation_agent(self, conversation_id: str) -> str | None:
        """:meth:`SyncSmithClient.conversation_agent` on the conversation's shard."""
        return self.for_conversation(conversation_id).conversation_agent(conversation_id)

    def activate_skill(self, conversation_id: str, name: str) -> None:
        """:meth:`SyncSmithClient.activate_skill` on the conversation's shard."""
        self.for_conversation(conversation_id).activate_skill(conversation_id, name)

    def deactivate_skill(self, conversation_id: str, name: str) -> None:
        """:meth:`SyncSmithClient.deactivate_skill` on the conversation's shard."""
        self.for_conversation(conversation_id).deactivate_skill(conversation_id, name)

    def active_skills(self, conversation_id: str) -> list[str]:
        """:meth:`SyncSmithClient.active_skills` on the conversation's shard."""
        return self.for_conversation(conversation_id).active_skills(conversation_id)

    def pending(self, turn_id: str) -> list[PendingItem]:
        """:meth:`SyncSmithClient.pending` on the turn's shard."""
        return self.for_turn(turn_id).pending(turn_id)

    def approve(self, turn_id: str, call_id: str, arguments: dict[str, Any] | None = None) -> Decision:
        """:meth:`SyncSmithClient.approve` on the turn's shard."""
        return self.for_turn(turn_id).approve(turn_id, call_id, arguments)

    def reject(self, turn_id: str, call_id: str, message: str = REJECTED) -> Decision:
        """:meth:`SyncSmithClient.reject` on the turn's shard."""
        return self.for_turn(turn_id).reject(turn_id, call_id, message)

    def submit_tool_result(self, turn_id: str, call_id: str, result: Any, is_error: bool = False) -> Decision:
        """:meth:`SyncSmithClient.submit_tool_result` on the turn's shard."""
        return self.for_turn(turn_id).submit_tool_result(turn_id, call_id, result, is_error)

    def respond(
        self, turn_id: str, request_id: str, action: str, content: dict[str, Any] | None = None
    ) -> InputResponse:
        """:meth:`SyncSmithClient.respond` on the turn's shard."""
        return self.for_turn(turn_id).respond(turn_id, request_id, action, content)

    def usage(
        self, window_seconds: float = 3600, agent: str | None = None, tenant: str | None = None
    ) -> dict[str, AgentUsage]:
        """:meth:`SyncSmithClient.usage` summed over the shards."""
        return _summed([client.usage(window_seconds, agent, tenant) for client in self.clients])

    def usage_by_tenant(
        self, window_seconds: float = 3600, agent: str | None = None, tenant: str | None = None
    ) -> dict[str, dict[str, AgentUsage]]:
        """:meth:`SyncSmithClient.usage_by_tenant` summed over the shards."""
        return _summed_by_tenant([client.usage_by_tenant(window_seconds, agent, tenant) for client in self.clients])

    def set_tenant_limits(self, tenant: str, limits: TenantLimits) -> None:
        """:meth:`SyncSmithClient.set_tenant_limits` on every shard."""
        for client in self.clients:
            client.set_tenant_limits(tenant, limits)

    def update_tenant_limits(self, tenant: str, **changes: Any) -> None:
        """:meth:`SyncSmithClient.update_tenant_limits` on every shard."""
        for client in self.clients:
            client.update_tenant_limits(tenant, **changes)

    def tenant_limits(self, tenant: str) -> TenantLimits:
        """:meth:`SyncSmithClient.tenant_limits` as shard 0 has them."""
        return self.clients[0].tenant_limits(tenant)

    def clear_tenant_limits(self, tenant: str) -> bool:
        """:meth:`SyncSmithClient.clear_tenant_limits` on every shard; True when one had some."""
        cleared = [client.clear_tenant_limits(tenant) for client in self.clients]  # every shard's, not to the first
        return any(cleared)

    def tenant_quota(self, tenant: str) -> list[QuotaStatus]:
        """Each shard's :meth:`SyncSmithClient.tenant_quota`, shard 0 first."""
        return [client.tenant_quota(tenant) for client in self.clients]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every shard's client (:meth:`SyncSmithClient.close`)."""
        for client in [*self.clients, *([self.fleet] if self.fleet else [])]:
            client.close()


def _summed(shards: Sequence[dict[str, AgentUsage]]) -> dict[str, AgentUsage]:
    """Agent → use, added up over ``shards``' readings, agents in name order."""
    names = sorted({name for shard in shards for name in shard})
    total: dict[str, AgentUsage] = {}
    for name in names:
        use = AgentUsage()
        for shard in shards:
            if name in shard:
                use = use.plus(shard[name])
        total[name] = use
    return total


def _summed_by_tenant(shards: Sequence[dict[str, dict[str, AgentUsage]]]) -> dict[str, dict[str, AgentUsage]]:
    """Tenant → agent → use, added up over ``shards``' readings, tenants in name order."""
    tenants = sorted({name for shard in shards for name in shard})
    return {name: _summed([shard.get(name, {}) for shard in shards]) for name in tenants}
