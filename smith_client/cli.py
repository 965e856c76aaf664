"""The ``smith`` command: talk to agents from a terminal (base install: needs only ``smith_client``).

* ``smith ask "question"`` runs one turn; ``smith chat`` is a REPL. Tokens go
  to stdout as they arrive; one status line per tool call and result goes to
  stderr. With ``--tenant NAME`` their turns are sent for that tenant, as ``send(..., tenant=)`` sends them
  (docs/architecture.md, Tenants; a bad name is an ``InvalidRequestError`` line, exit code 1, as for every value
  checked by the client's rules, ``smith tenant``'s name and limits included; a malformed argument is argparse's
  usage error, exit code 2).
* ``smith keys --conversation ID`` lists that conversation's Redis keys and TTLs.
* ``smith status`` prints per queue its jobs queued (due now and not picked up, or on the turns queue waiting for
  admission), running (picked up: arq's in-progress key is held) and deferred (due later: a parked turn's recheck,
  a retry's backoff) and its live workers, and the running and paused turns
  (:func:`~smith_client.registry.fleet_status`); only the oldest ``DUE_SCAN_LIMIT`` due jobs of a queue are told
  queued or running, a line says how many more there are.
* ``smith usage [--hours N | --day] [--agent NAME] [--tenant NAME] [--by-tenant]`` prints, per agent, the model
  calls and server-reported tokens counted over the last hour (N hours, a day; to the minute), from the
  deployment's usage buckets (:mod:`smith_client.usage`; docs/architecture.md, Token usage): only one tenant's
  turns' with ``--tenant``, one row per tenant and agent with ``--by-tenant`` (docs/architecture.md, Tenants);
  with ``--tenant``, also the tenant's token quota and when its window resets, when it has one.
* ``smith tenant set TENANT [--weight W] [--max-running N] [--token-quota N] [--window SECONDS]`` changes the
  limits given (the others keep theirs), ``smith tenant show TENANT`` prints its limits, the tokens used in its
  current quota window and when the window resets, ``smith tenant clear TENANT`` deletes its limits
  (:mod:`smith_client.tenants`; docs/tenants.md).
* A turn paused for a person (docs/architecture.md, Pausing for a person): ``smith pending TURN`` lists its
  undecided calls; ``smith approve TURN CALL [--arguments JSON]``, ``smith reject TURN CALL [--message TEXT]``
  and ``smith result TURN CALL VALUE [--error]`` (an external tool's) decide one; each prints the decision
  that stands and whether the turn resumes, and exits 1 when the call was decided before, differently.
  ``smith ask`` whose turn pauses lists its calls with the commands that decide them on stderr (with the
  ``--prefix`` and, when given, the ``--redis-url`` it was run with, a password shown as ``***``) and exits
  with :data:`PAUSED_EXIT` (3), leaving the turn paused; ``smith chat`` asks about each call instead. A turn
  queued behind a paused turn of its conversation says so on stderr, naming that turn.
* An MCP server asking for input during a tool call (the turn keeps running): ``smith pending TURN`` lists the
  open requests too, each with the command that answers it, ``smith respond TURN REQUEST accept|decline|cancel
  [--content JSON]`` (content checked as the client's ``respond`` checks it); ``smith ask`` prints those commands
  on stderr when its turn asks and follows the turn on; ``smith chat`` asks for each field instead.
* ``smith migrate-to-cluster --to-url redis://NODE:PORT/0 [--dry-run] [--replace]`` copies a stopped and drained
  deployment's keys from its single Redis (``--redis-url``, ``--prefix``) to a Redis Cluster under the names of
  ``SMITH_REDIS_CLUSTER`` (the prefix as a hash tag), with their TTLs (:mod:`smith_client.migration`; docs/cluster.md,
  Moving a deployment from a single Redis to a cluster). It refuses, exit code 1, while a worker is registered or a
  turn is queued, running or paused (on either side), and when a key to copy exists on the target (unless
  ``--replace``), saying what is there, before copying anything; ``--dry-run`` prints what it would copy and copies
  nothing (exit code 1 when the copy would be refused). The source is left as it was.
* It reads the variables of :class:`~smith_client.settings.ClientSettings` (``SMITH_REDIS_URL``,
  ``SMITH_PREFIX``, …), checked before any command: a bad one is one line on stderr and exit code 1.
* ``smith COMMAND -h`` lists a command's options, which go after it (or, as before, ahead of it);
  ``--redis-url`` and ``--prefix`` are checked by the same rules as their variables.
* SIGTERM stops a command as Ctrl-C does: a turn it is waiting for is cancelled, not left running
  (exit code 143, Ctrl-C's is 130).

``smith-worker`` (running workers) is :mod:`smith_worker.cli`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import sys
import time
from collections.abc import Awaitable, Sequence
from typing import Any, TextIO

import orjson
from redis.exceptions import RedisError

from smith_client.approvals import REJECTED, Decision, approval, rejection, tool_result
from smith_client.client import SmithClient
from smith_client.errors import ConfigurationError, SmithError, TurnPausedError, UnknownAgentError
from smith_client.events import (
    Event,
    EventData,
    InputAnsweredData,
    InputRequestedData,
    LlmWaitingData,
    TokenData,
    ToolCallCompletedData,
    ToolCallDecidedData,
    ToolResultData,
    TurnCompletedData,
    TurnFailedData,
    TurnPausedData,
    TurnResumedData,
)
from smith_client.hygiene import conversation_keys
from smith_client.inputs import input_response
from smith_client.keys import shard_prefix
from smith_client.migration import conflict_line, copy_keys, drain_blockers, plan_copy, plan_lines, report_lines
from smith_client.redis_errors import smith_error
from smith_client.registry import DUE_SCAN_LIMIT, fleet_status
from smith_client.repl import (
    ChatRepl,
    CommandOptions,
    agent_chain,
    call_text,
    decide_call,
    input_report,
    paused_report,
    run_turn,
)
from smith_client.settings import DEFAULT_REDIS_URL, ClientSettings, env_name, masked_url
from smith_client.tenants import QuotaStatus, checked_limits, checked_tenant
from smith_client.usage import USAGE_MAX_WINDOW, AgentUsage
from smith_client.validation import check_served


class StreamPrinter:
    """Prints a turn's events: tokens to ``out``, tool status lines to ``err``.

    An agent that does not stream publishes no ``token`` events, so its answer
    is printed from the final message of ``turn.completed``. After ``turn.resumed``
    (a worker crashed or stopped mid-turn) the interrupted step's reply is
    streamed again from its start, so it begins on a new line, with a status line. A sub-agent's
    status lines start with its chain (``[lead > researcher]``, the event's
    ``agent_path``); its tokens are not printed: its answer is its parent's tool result.
    """

    def __init__(self, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.out = out
        self.err = err
        self._streamed: set[str] = set()  # turns whose answer arrived as tokens

    def __call__(self, event: Event) -> None:
        data = event.payload
        chain = agent_chain(event.agent_path)
        if isinstance(data, TokenData):
            if chain:
                return
            self._streamed.add(event.turn_id)
            self.out.write(data.text)
            self.out.flush()
        elif isinstance(data, ToolCallCompletedData):
            self._status(f"{chain}[tool call] {data.name}({_compact(data.arguments)})")
        elif isinstance(data, ToolResultData):
            label = "error" if data.is_error else "result"
            ran_on = f" (worker {data.worker})" if data.worker else ""  # none: the turn gave up on the call
            self._status(f"{chain}[tool {label}] {data.name} -> {_short(data.content)}{ran_on}")
        elif isinstance(data, TurnResumedData) and data.reason == "decision":
            self._status(f"[turn resumed, attempt {data.attempt}: its calls were decided]")
        elif isinstance(data, TurnResumedData):
            if event.turn_id in self._streamed:  # the interrupted reply is streamed again: start it on a new line
                self.out.write("\n")
                self.out.flush()
            self._status(
                f"[turn resumed, attempt {data.attempt}: a worker stopped; its unfinished reply streams again]"
            )
        elif isinstance(data, TurnCompletedData):
            if event.turn_id not in self._streamed:
                self.out.write(data.message.content or "")
            self._streamed.discard(event.turn_id)
            self.out.write("\n")
            self.out.flush()
        else:
            line = _status_line(data, chain)
            if line is not None:
                self._status(line)

    def _status(self, line: str) -> None:
        self.err.write(line + "\n")
        self.err.flush()


def _status_line(data: EventData, chain: str) -> str | None:
    """The status line of an event that prints nothing else (None: none); ``chain``: the agent chain's prefix."""
    if isinstance(data, TurnFailedData):
        return f"[turn failed] {data.error.kind}: {data.error.message}"
    if isinstance(data, TurnPausedData):
        return f"[turn paused] {len(data.pending)} call(s) wait for a person"
    if isinstance(data, ToolCallDecidedData):
        return f"{chain}{_decided(data)}"
    if isinstance(data, InputRequestedData):
        return f"[input requested] {call_text(data.item)}: {data.item.message}"
    if isinstance(data, InputAnsweredData):
        return f"{chain}[input {data.request_id} answered: {data.action}]"
    if isinstance(data, LlmWaitingData):
        return f"{chain}[model request waits {data.wait_s:.1f} s: {_WAITING.get(data.reason, data.reason)}]"
    return None


#: How an ``llm.waiting`` event's ``reason`` reads in its status line.
_WAITING = {"rate_limit": "the endpoint's rate limit", "retry_after": "the endpoint's Retry-After"}

#: How a ``tool_call.decided`` event's ``action`` reads in its status line.
_DECIDED = {"approve": "approved", "reject": "rejected", "result": "answered from outside"}


def _decided(data: ToolCallDecidedData) -> str:
    """``[tool call approved] tool({arguments})``, ``[tool call rejected] tool: message``, or
    ``[tool call answered from outside] tool`` (an external tool's result)."""
    line = f"[tool call {_DECIDED.get(data.action, data.action)}] {data.name}"
    if data.action == "approve":
        return f"{line}({_compact(data.arguments)})"
    return f"{line}: {data.message}" if data.action == "reject" else line


def _compact(value: Any) -> str:
    return orjson.dumps(value).decode()


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


#: The exit code of ``smith ask`` whose turn paused for a person (it stays paused: decide it, see the module doc).
PAUSED_EXIT = 3


async def _run_ask(args: argparse.Namespace) -> int:
    async with _connect(args, tenant=args.tenant) as client:
        await _check_served(client, args.agent)
        options = CommandOptions(client.keys.prefix, args.given_redis_url)
        try:
            ok = await run_turn(
                client,
                args.question,
                conversation_id=args.conversation,
                agent=args.agent,
                timeout=args.timeout,
                printer=StreamPrinter(),
                options=options,
            )
        except TurnPausedError as paused:
            print("\n".join(paused_report(options, paused)), file=sys.stderr)
            return PAUSED_EXIT
        return 0 if ok else 1


async def _run_chat(args: argparse.Namespace) -> int:
    async with _connect(args, tenant=args.tenant) as client:
        await _check_served(client, args.agent)
        repl = ChatRepl(
            client,
            StreamPrinter(),
            agent=args.agent,
            conversation_id=args.conversation,
            timeout=args.timeout,
            redis_url=args.given_redis_url,
        )
        return await repl.run()


async def _check_served(client: SmithClient, agent: str) -> None:
    """Raise :class:`UnknownAgentError` at once when no live turn worker serves ``agent`` under the client's
    prefix, instead of leaving the turn to wait in a queue no worker reads (a mistyped prefix or Redis URL).

    The registrations read stay in the client's cache, so the submit that follows does not read them again.
    """
    served = await client.runner.run(client.served.read(client.keys, agent))
    if not check_served(agent, served):  # raises when workers are registered but none serves the agent
        raise UnknownAgentError(
            f"no turn worker is registered under prefix {client.keys.prefix!r} on this Redis: start one "
            "(smith-worker APP --queue turns) or give the workers' --prefix and --redis-url",
            agent=agent,
        )


def _connect(
    args: argparse.Namespace, tenant: str | None = None, cluster: bool | None = None, shard: int | None = None
) -> SmithClient:
    """The client of the command's Redis and prefix; ``tenant``: the tenant of the turns it sends (None: none);
    ``cluster``: whether the Redis is a cluster node (None: ``SMITH_REDIS_CLUSTER``); ``shard``: the shard of a
    sharded deployment it serves (None: the deployment must have one, else :class:`ConfigurationError`). Raises
    :class:`~smith_client.errors.InvalidRequestError` for a bad tenant name."""
    settings: ClientSettings = args.settings
    return SmithClient.from_url(
        args.redis_url,
        prefix=args.prefix if shard is None else shard_prefix(args.prefix, shard, settings.shards),
        shards=None if shard is None else 1,
        sentinels=settings.redis_sentinels,
        sentinel_master=settings.redis_sentinel_master,
        socket_timeout=settings.redis_socket_timeout,
        turn_ttl=settings.turn_ttl,
        history_ttl=settings.history_ttl,
        tenant=tenant,
        cluster=cluster,
    )


async def _run_status(args: argparse.Namespace) -> int:
    """``smith status``: the fleet's queues, turns and workers; of each shard in turn for a sharded deployment
    (``SMITH_SHARDS``; docs/cluster.md, Shards)."""
    shards = args.settings.shards
    for shard in range(shards):
        if shards > 1:
            print(f"shard {shard} (prefix {shard_prefix(args.prefix, shard, shards)})")
        await _print_status(args, shard)
    return 0


async def _print_status(args: argparse.Namespace, shard: int) -> None:
    async with _connect(args, shard=shard) as client:
        status = await fleet_status(client.redis, client.keys)
    print(f"{'queue':<24} {'queued':>7} {'running':>8} {'deferred':>8} {'workers':>8}")
    for name, queue in status.queues.items():
        jobs = queue.counts
        print(f"{name:<24} {jobs.queued:>7} {jobs.running:>8} {jobs.deferred:>8} {len(queue.workers):>8}")
        for tenant, count in sorted(jobs.waiting.items()):
            print(f"  waiting, tenant {_tenant_label(tenant)}: {count}")
        if jobs.unchecked:
            print(f"  {jobs.unchecked} more due jobs, queued or running: only the oldest {DUE_SCAN_LIMIT} were checked")
    print(f"running turns: {status.running_turns}")
    print(f"paused turns: {status.paused_turns}")
    for name, queue in status.queues.items():
        for worker in queue.workers:
            print(f"worker {worker['id']} on {name} (host {worker.get('host')}, pid {worker.get('pid')})")


#: How ``smith status`` and ``smith usage --by-tenant`` name the turns with no tenant: not a tenant name (a tenant
#: takes no parentheses, :func:`~smith_client.validation.check_tenant`), so no tenant's rows merge with theirs.
NO_TENANT_LABEL = "(none)"


def _tenant_label(tenant: str | None) -> str:
    """``tenant`` as printed: :data:`NO_TENANT_LABEL` for none (``""`` or None), else the name itself."""
    return tenant or NO_TENANT_LABEL


async def _run_usage(args: argparse.Namespace) -> int:
    """``smith usage [--hours N | --day] [--agent NAME] [--tenant NAME] [--by-tenant]``: one row per agent (per
    tenant and agent with ``--by-tenant``, :data:`NO_TENANT_LABEL` naming the turns with no tenant) with model calls
    and tokens over the window (only ``--tenant``'s turns' when given), then the sum of the rows when there are
    several; one line on stderr when nothing was counted."""
    found: dict[tuple[str, ...], AgentUsage]
    quota: QuotaStatus | None = None
    async with _connect(args) as client:
        if args.by_tenant:
            grouped = await client.usage_by_tenant(args.hours * 3600, args.agent, args.tenant)
            found = {(tenant, name): u for tenant, agents in grouped.items() for name, u in agents.items()}
        else:
            per_agent = await client.usage(args.hours * 3600, args.agent, args.tenant)
            found = {(name,): u for name, u in per_agent.items()}
        if args.tenant:
            quota = await client.tenant_quota(args.tenant)
    window = f"the last {args.hours:g} h"
    if quota is not None and quota.quota is not None:
        print(_quota_line(quota))
    if not found:
        who = f"agent {args.agent!r}" if args.agent else "any agent"
        of_tenant = f" of tenant {args.tenant!r}" if args.tenant else ""
        print(f"no model calls of {who}{of_tenant} counted in {window} under prefix {args.prefix!r}", file=sys.stderr)
        return 0
    names: tuple[str, ...] = ("tenant", "agent") if args.by_tenant else ("agent",)
    if len(found) > 1:
        found[("(all)", *([""] * (len(names) - 1)))] = functools.reduce(AgentUsage.plus, found.values(), AgentUsage())
    of_tenant = f", tenant {args.tenant!r}" if args.tenant else ""
    print(f"model calls and tokens in {window} (to the minute), prefix {args.prefix!r}{of_tenant}:")
    header = (*names, "requests", "prompt", "completion", "total")
    labels = {key: (_tenant_label(key[0]), *key[1:]) if args.by_tenant else key for key in found}
    cells = [
        header,
        *((*labels[key], *(str(n) for n in (u.requests, u.prompt, u.completion, u.total))) for key, u in found.items()),
    ]
    widths = [max(len(line[column]) for line in cells) for column in range(len(header))]
    for line in cells:
        texts = (cell.ljust(width) for cell, width in zip(line[: len(names)], widths, strict=False))
        numbers = (cell.rjust(width) for cell, width in zip(line[len(names) :], widths[len(names) :], strict=True))
        print("  ".join([*texts, *numbers]).rstrip())
    return 0


def _utc(epoch_seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_seconds))


def _quota_line(status: QuotaStatus) -> str:
    """One line: the tokens a tenant used of its quota in the current window, and when the window resets."""
    return (
        f"token quota: {status.used} of {status.quota} tokens used in the current {status.window_seconds} s window; "
        f"resets at {_utc(status.reset_at)}"
    )


async def _run_tenant(args: argparse.Namespace) -> int:
    """``smith tenant set|show|clear TENANT``: ``set`` changes the limits given (the others keep their values) and
    prints the tenant's limits, as ``show`` does, then the tokens used in its current quota window and the window's
    end; ``clear`` deletes its limits (one line on stderr when it had none). A bad name or limit raises
    :class:`~smith_client.errors.InvalidRequestError` before any connection."""
    checked_tenant(args.tenant)
    checked_limits(**args.limits)
    async with _connect(args) as client:
        if args.action == "clear":
            if not await client.clear_tenant_limits(args.tenant):
                print(f"tenant {args.tenant!r} has no limits under prefix {args.prefix!r}", file=sys.stderr)
            return 0
        if args.action == "set":  # only the fields given, atomically: a concurrent set of others stands
            await client.update_tenant_limits(args.tenant, **args.limits)
        limits = await client.tenant_limits(args.tenant)
        status = await client.tenant_quota(args.tenant)
    print(f"tenant {args.tenant!r}, prefix {args.prefix!r}:")
    for name, value in limits.model_dump().items():
        print(f"  {name:<22} {'-' if value is None else f'{value:g}' if isinstance(value, float) else value}")
    print(f"  {'used':<22} {status.used} tokens in the window since {_utc(status.reset_at - status.window_seconds)}")
    print(f"  {'resets at':<22} {_utc(status.reset_at)}")
    return 0


def _hours(raw: str) -> float:
    """``--hours``: a number of hours in (0, 24]; else a usage error (argparse, exit code 2)."""
    limit = USAGE_MAX_WINDOW / 3600
    return _number_up_to(raw, limit, f"a number of hours in (0, {limit:g}]")


async def _run_pending(args: argparse.Namespace) -> int:
    """``smith pending TURN``: one row per undecided call of the paused turn, then each open input request of its
    running calls with the commands that answer it (:func:`input_report`); when there is none, one line on
    stderr saying the turn's status. Raises :class:`TurnNotFoundError` for a turn Redis does not have."""
    async with _connect(args) as client:
        items = await client.pending(args.turn)
        status = "paused" if items else await client.turn(args.turn).status()
    if not items:
        print(f"turn {args.turn} waits on no call: it is {status}", file=sys.stderr)
        return 0
    calls = [i for i in items if i.kind != "input"]
    rows = [(i.call_id, i.kind, i.tool, " > ".join(i.agent_path), _compact(i.arguments)) for i in calls]
    lines = _table(("call", "kind", "tool", "agent", "arguments"), rows) if calls else []
    options = CommandOptions(client.keys.prefix, args.given_redis_url)
    for item in items[len(calls) :]:  # the open input requests come after the paused calls
        lines += input_report(options, args.turn, item)
    print("\n".join(lines))
    return 0


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """``header`` and ``rows`` as lines of columns two spaces apart, each as wide as its widest cell (the
    last column unpadded)."""
    lines = [header, *rows]
    widths = [max(len(row[column]) for row in lines) for column in range(len(header) - 1)]
    return ["  ".join([*map(str.ljust, row[:-1], widths), row[-1]]) for row in lines]


def _asked(args: argparse.Namespace) -> Decision:
    """The decision ``smith approve|reject|result`` asks for, from its arguments (checked as the client does)."""
    if args.command == "approve":
        return approval(args.arguments)
    if args.command == "reject":
        return rejection(args.message)
    return tool_result(args.value, args.error)


async def _run_decide(args: argparse.Namespace) -> int:
    """``smith approve|reject|result TURN CALL …``: prints the decision that stands on the call, then whether
    the turn resumes; exit code 1, with a line on stderr, when another decision was made before (it stays)."""
    asked = _asked(args)
    async with _connect(args) as client:
        standing = await decide_call(client, args.turn, args.call, asked)
        waiting = await client.pending(args.turn)
    print(f"{args.call}: {standing.model_dump_json(exclude_defaults=True)}")
    if waiting:
        print(f"turn {args.turn} still waits on {', '.join(item.call_id for item in waiting)}")
    else:
        print(f"turn {args.turn} is no longer paused: it resumes on a turn worker")
    if standing != asked:
        print(f"smith: call {args.call} was decided before; this decision changed nothing", file=sys.stderr)
        return 1
    return 0


async def _run_respond(args: argparse.Namespace) -> int:
    """``smith respond TURN REQUEST ACTION [--content JSON]``: answers the open input request (checked first as
    ``respond`` checks it) and prints the answer sent. Raises as :meth:`SmithClient.respond` does."""
    asked = input_response(args.action, args.content)
    async with _connect(args) as client:
        answer = await client.respond(args.turn, args.request, asked.action, asked.content)
    print(f"{args.request}: {answer.model_dump_json(exclude_none=True)}")
    return 0


async def _run_migrate(args: argparse.Namespace) -> int:
    """``smith migrate-to-cluster --to-url URL [--dry-run] [--replace]``: checks that the deployment is stopped and
    drained on its single Redis and on the cluster (:func:`~smith_client.migration.drain_blockers`), plans the copy
    and checks its names on the cluster (:func:`~smith_client.migration.plan_copy`), then copies
    (:func:`~smith_client.migration.copy_keys`) and prints what it copied. Refuses with exit code 1, before copying
    anything, when something is still there or a key to copy exists on the cluster (unless ``--replace``).
    ``--dry-run`` prints the plan and the refusals and copies nothing; its exit code is the copy's (1: refused).
    Raises :class:`ConfigurationError` for a malformed ``--to-url``, redis-py's errors (a target that is no cluster
    node: ``cluster support disabled``)."""
    async with _connect(args, cluster=False) as source, _connect_cluster(args) as target:
        blockers = await drain_blockers(source.redis, source.keys)
        blockers += [f"on the cluster: {line}" for line in await drain_blockers(target.redis, target.keys)]
        if blockers:
            print(_undrained(args.prefix, blockers), file=sys.stderr)
            if not args.dry_run:
                return 1
        plan = await plan_copy(source.redis, source.keys, target.redis, target.keys)
        print(f"from {masked_url(args.redis_url)}, prefix {args.prefix!r}, to the cluster of {masked_url(args.to_url)} "
              f"under the hash tag {target.keys.cluster_slot_key}")  # fmt: skip
        print("\n".join(plan_lines(plan)))
        refused = bool(blockers)
        if plan.conflicts and not args.replace:
            print(f"smith: nothing copied: {conflict_line(plan)}\n{_REPLACE_HINT}", file=sys.stderr)
            refused = True
        if args.dry_run or refused:
            print("dry run: nothing copied" if args.dry_run else "nothing copied")
            return 1 if refused else 0
        report = await copy_keys(source.redis, source.keys, target.redis, target.keys, plan, replace=args.replace)
    print("\n".join(report_lines(report)))
    print(f"the keys of prefix {args.prefix!r} on {masked_url(args.redis_url)} are left as they were: delete them once "
          "the fleet runs on the cluster (docs/cluster.md)")  # fmt: skip
    return 0


def _connect_cluster(args: argparse.Namespace) -> SmithClient:
    """The client of ``--to-url``, a Redis Cluster node, under the command's prefix as a hash tag."""
    settings: ClientSettings = args.settings
    return SmithClient.from_url(
        args.to_url, prefix=args.prefix, socket_timeout=settings.redis_socket_timeout, cluster=True
    )


#: What ``smith migrate-to-cluster`` suggests when keys to copy exist on the cluster.
_REPLACE_HINT = "(a copy of this deployment made before? --replace overwrites them)"


def _undrained(prefix: str, blockers: list[str]) -> str:
    """``smith migrate-to-cluster``'s refusal of a deployment not stopped and drained: what is still there, and what
    to do."""
    return "\n".join([
        f"smith: the fleet of prefix {prefix!r} is not stopped and drained; still there:",
        *(f"  {line}" for line in blockers),
        "let the workers finish the queued, running and paused turns (smith status), stop every worker, then run "
        "this again",
    ])  # fmt: skip


async def _run_keys(args: argparse.Namespace) -> int:
    async with _connect(args) as client:
        found = await conversation_keys(client.redis, client.keys, args.conversation)
    for info in found:
        print(f"{info.ttl:>9}  {info.type:<7} {info.key}")
    if not found:
        print(f"no keys for conversation {args.conversation!r} under prefix {args.prefix!r}", file=sys.stderr)
    return 0


def fail(prog: str, exc: BaseException) -> int:
    """Print a typed error as one ``PROG: Kind: message`` line on stderr (no traceback); returns exit code 1.

    A Redis failure (``RedisError``) is printed as the typed error it means (:func:`smith_error`).
    """
    error = exc if isinstance(exc, SmithError) else smith_error(exc)
    print(f"{prog}: {error.kind}: {error.message}", file=sys.stderr)
    return 1


def _seconds(raw: str) -> float:
    """``--timeout``: a positive, finite number of seconds; else a usage error (argparse, exit code 2)."""
    return _number_up_to(raw, sys.float_info.max, "a positive number of seconds")


def _number_up_to(raw: str, most: float, what: str) -> float:
    """``raw`` as a number in (0, ``most``]; else :class:`argparse.ArgumentTypeError` saying it must be ``what``."""
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= most:
        raise argparse.ArgumentTypeError(f"must be {what}, got {raw!r}")
    return value


def _json_object(raw: str) -> dict[str, Any]:
    """``--arguments``: a JSON object; else a usage error (argparse, exit code 2)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {raw!r}: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {raw!r}")
    return value


#: Seconds ``smith ask`` waits for its answer unless ``--timeout`` says otherwise (as long as ``make demo``).
ASK_TIMEOUT = 300.0

#: How each option is parsed; every command that accepts it lists it in its ``-h`` with its own help.
_OPTIONS: dict[str, dict[str, Any]] = {
    "--redis-url": {"metavar": "URL"},
    "--prefix": {"metavar": "PREFIX"},
    "--agent": {"metavar": "NAME"},
    "--tenant": {"metavar": "NAME"},
    "--conversation": {"metavar": "ID"},
    "--timeout": {"metavar": "SECONDS", "type": _seconds},
}
_CONNECTION = {
    "--redis-url": f"the workers' Redis (default: $SMITH_REDIS_URL, else {DEFAULT_REDIS_URL})",
    "--prefix": "the workers' key prefix (default: $SMITH_PREFIX, else smith)",
}
_AGENT = "the agent to talk to (default: default)"
_NEW_CONVERSATION = "conversation id (default: a new cli-PID)"
_TENANT = "the tenant the turns are sent for, as send(..., tenant=) (default: none; docs/tenants.md)"
#: Each command: its one-line help and the options it accepts, with their help.
_COMMANDS: dict[str, tuple[str, dict[str, str]]] = {
    "ask": (
        "run one turn and print it",
        {
            **_CONNECTION,
            "--agent": _AGENT,
            "--conversation": _NEW_CONVERSATION,
            "--tenant": _TENANT,
            "--timeout": f"seconds to wait for the answer, then cancel the turn (default: {ASK_TIMEOUT:g})",
        },
    ),
    "chat": (
        "an interactive conversation (/reset, /exit, Ctrl-D; Ctrl-C cancels a turn)",
        {
            **_CONNECTION,
            "--agent": _AGENT,
            "--conversation": _NEW_CONVERSATION,
            "--tenant": _TENANT,
            "--timeout": "seconds to wait for each answer, then cancel the turn (default: no limit)",
        },
    ),
    "keys": (
        "list the conversation's Redis keys and their TTLs (seconds)",
        {**_CONNECTION, "--conversation": "the conversation whose keys to list (required)"},
    ),
    "status": (
        "queued, running and deferred jobs and live workers per queue, running and paused turns",
        dict(_CONNECTION),
    ),
    "pending": ("list the calls a paused turn waits on", dict(_CONNECTION)),
    "usage": (
        "model calls and tokens per agent over the last hour (or --hours N, --day)",
        {
            **_CONNECTION,
            "--agent": "only this agent (default: every agent)",
            "--tenant": "only the turns of this tenant (default: every tenant's and those with none)",
        },
    ),
    "tenant": ("set, show or clear a tenant's limits (pickup weight, running cap, token quota)", dict(_CONNECTION)),
    "approve": ("approve a paused turn's call: it runs once the turn resumes", dict(_CONNECTION)),
    "reject": ("reject a paused turn's call: the model gets an error tool message", dict(_CONNECTION)),
    "result": ("give the result of a paused turn's external tool call", dict(_CONNECTION)),
    "respond": ("answer an MCP server's request for input during a running tool call", dict(_CONNECTION)),
    "migrate-to-cluster": (
        "copy a stopped and drained deployment from its single Redis to a Redis Cluster",
        {
            "--redis-url": f"the single Redis to copy from (default: $SMITH_REDIS_URL, else {DEFAULT_REDIS_URL})",
            "--prefix": _CONNECTION["--prefix"],
        },
    ),
}
#: The longer description of a command, after its options in ``smith COMMAND -h`` (none: its one-line help only).
_EPILOGS = {
    "migrate-to-cluster": (
        "The deployment's keys (conversations, finished turns' records and tool results, tenant limits and quota "
        "counters, usage buckets, model rate limits...) are copied under the names the fleet uses with "
        "SMITH_REDIS_CLUSTER=1: the prefix as a hash tag ({smith}:conv:c1:history), each with its remaining TTL. "
        "Worker registrations, worker-turns sets, capability sets, wake-up lists, MCP tool-schema caches, the queues "
        "and their routing keys and the abort requests are left out: the fleet writes them again. Refused (exit code "
        "1, nothing copied) while a worker is registered or a turn is queued, running, paused or waiting for "
        "admission, on the single Redis or on the cluster, and when a key to copy exists on the cluster already "
        "(unless --replace). The source is left as it was: delete its keys once the fleet runs on the cluster. "
        "Steps: docs/cluster.md, Moving a deployment from a single Redis to a cluster."
    ),
}
_TURN = ("turn", {"metavar": "TURN", "help": "the paused turn's id"})
_CALL = ("call", {"metavar": "CALL", "help": "the call's id (smith pending TURN lists them)"})
#: Each command's own arguments, after the options above: (name, argparse keyword arguments).
_ARGUMENTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "ask": [("question", {})],
    "pending": [_TURN],
    "usage": [
        ("--hours", {"metavar": "N", "type": _hours, "help": "the window, hours up to 24 (default: 1)"}),
        ("--day", {"action": "store_true", "help": "the last 24 hours"}),
        ("--by-tenant", {"action": "store_true", "help": f"one row per tenant and agent ({NO_TENANT_LABEL}: none)"}),
    ],
    "tenant": [
        ("action", {"choices": ("set", "show", "clear"), "help": "what to do"}),
        ("tenant", {"metavar": "TENANT", "help": "the tenant's name"}),
        ("--weight", {"metavar": "W", "type": float, "help": "set: its share of turn pickup (> 0; default 1)"}),
        ("--max-running", {"metavar": "N", "type": int, "help": "set: the most of its turns running at once"}),
        ("--token-quota", {"metavar": "N", "type": int, "help": "set: tokens (prompt + completion) per window"}),
        ("--window", {"metavar": "SECONDS", "type": int, "help": "set: the quota's window (>= 60; default 86400)"}),
    ],
    "approve": [
        _TURN,
        _CALL,
        (
            "--arguments",
            {
                "metavar": "JSON",
                "type": _json_object,
                "help": "edited arguments, a JSON object checked against the tool's schema (default: the model's)",
            },
        ),
    ],
    "reject": [
        _TURN,
        _CALL,
        (
            "--message",
            {"metavar": "TEXT", "default": REJECTED, "help": f"the error the model gets (default: {REJECTED!r})"},
        ),
    ],
    "result": [
        _TURN,
        _CALL,
        ("value", {"metavar": "VALUE", "help": "the call's tool message content, as given (text or JSON)"}),
        ("--error", {"action": "store_true", "help": "the result is an error"}),
    ],
    "respond": [
        ("turn", {"metavar": "TURN", "help": "the running turn's id"}),
        ("request", {"metavar": "REQUEST", "help": "the input request's id (smith pending TURN lists them)"}),
        ("action", {"choices": ("accept", "decline", "cancel"), "help": "the answer"}),
        (
            "--content",
            {
                "metavar": "JSON",
                "type": _json_object,
                "help": "with accept: the content, a JSON object checked against the requested schema",
            },
        ),
    ],
    "migrate-to-cluster": [
        (
            "--to-url",
            {
                "metavar": "URL",
                "required": True,
                "help": "any node of the cluster, the target: redis://host:port/0 (rediss:// for TLS)",
            },
        ),
        ("--dry-run", {"action": "store_true", "help": "print what would be copied; copy nothing"}),
        ("--replace", {"action": "store_true", "help": "overwrite the keys that exist on the cluster already"}),
    ],
}


def _parser() -> argparse.ArgumentParser:
    """``smith``'s parser: each option goes after its command (listed by ``smith COMMAND -h``) or, as
    before, ahead of the command.

    The options ahead of the command are the main parser's, with the defaults. A
    command's parser has the same options with ``argparse.SUPPRESS`` defaults:
    one it is not given sets nothing, so a value given ahead of the command is
    kept (https://docs.python.org/3/library/argparse.html#default).
    """
    parser = argparse.ArgumentParser(
        prog="smith",
        description="Talk to Agent Smith agents. Options go after the command (smith COMMAND -h lists them).",
    )
    for option, how in _OPTIONS.items():  # --redis-url and --prefix: None, then the settings' (smith_main)
        parser.add_argument(option, **how, default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    for command, (summary, options) in _COMMANDS.items():
        command_parser = sub.add_parser(command, help=summary, description=summary, epilog=_EPILOGS.get(command))
        for option, help_text in options.items():
            command_parser.add_argument(option, **_OPTIONS[option], default=argparse.SUPPRESS, help=help_text)
        for name, how in _ARGUMENTS.get(command, []):
            command_parser.add_argument(name, **how)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``smith``'s arguments (``sys.argv[1:]`` when None), with each command's defaults filled in.

    Exits with status 2 and a usage message on bad arguments (argparse).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.conversation is None:
        if args.command == "keys":
            parser.error("keys needs --conversation ID")
        args.conversation = f"cli-{os.getpid()}"
    if args.timeout is None and args.command == "ask":
        args.timeout = ASK_TIMEOUT
    if args.agent is None and args.command in ("ask", "chat"):
        args.agent = "default"
    if args.command == "tenant":
        _check_tenant_args(parser, args)
    if args.command == "usage":
        if args.day and args.hours is not None:
            parser.error("usage takes --hours N or --day, not both")
        args.hours = USAGE_MAX_WINDOW / 3600 if args.day else args.hours or 1.0
    return args


#: ``smith tenant set``'s options → the :class:`~smith_client.tenants.TenantLimits` field each sets.
_LIMIT_OPTIONS = {"weight": "weight", "max_running": "max_running", "token_quota": "token_quota",
                  "window": "quota_window_seconds"}  # fmt: skip


def _check_tenant_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``smith tenant``'s arguments: for ``set`` at least one limit (put in ``args.limits``, field → value);
    ``show`` and ``clear`` take none. Else a usage error (exit code 2). The name and the values are checked by the
    client's rules when the command runs, as ``--tenant``'s are (an ``InvalidRequestError`` line, exit code 1)."""
    given = {
        field: getattr(args, option) for option, field in _LIMIT_OPTIONS.items() if getattr(args, option) is not None
    }
    if args.action == "set" and not given:
        parser.error("tenant set needs at least one of --weight, --max-running, --token-quota, --window")
    if args.action != "set" and given:
        parser.error(f"tenant {args.action} takes no limit options (tenant set does)")
    args.limits = given


#: The options that override a variable of :class:`ClientSettings`, by field name.
_SETTING_OPTIONS = {"redis_url": "--redis-url", "prefix": "--prefix"}
#: The exit code after SIGTERM (128 + the signal's number, as a shell reports it).
SIGTERM_EXIT = 128 + signal.SIGTERM


def _with_options(settings: ClientSettings, args: argparse.Namespace) -> ClientSettings:
    """``settings`` with ``--redis-url`` and ``--prefix`` (when given) in place of their variables, checked
    by the same rules. Raises :class:`ConfigurationError` naming the option for a refused value."""
    given = {field: getattr(args, field) for field in _SETTING_OPTIONS if getattr(args, field) is not None}
    if not given:
        return settings
    try:
        return ClientSettings.model_validate({**settings.model_dump(), **given})
    except ConfigurationError as exc:
        variable = exc.fields["setting"]
        field = next((f for f in given if env_name(f) == variable), None)
        if field is None:
            raise
        option = _SETTING_OPTIONS[field]
        raise ConfigurationError(exc.message.replace(variable, option, 1), setting=option) from None


async def _stopped_by_sigterm(command: Awaitable[int]) -> int:
    """Run ``command``; SIGTERM cancels it as Ctrl-C does (its turn is cancelled, not left running) and
    makes the exit code :data:`SIGTERM_EXIT`. Ctrl-C still ends in ``KeyboardInterrupt`` (asyncio.run)."""
    task, loop = asyncio.current_task(), asyncio.get_running_loop()
    terminated = []

    def terminate() -> None:
        terminated.append(True)
        if task is not None:
            task.cancel()

    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        return await command
    except asyncio.CancelledError:
        if not terminated:
            raise
        return SIGTERM_EXIT
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def smith_main(argv: list[str] | None = None) -> None:
    """Entry point of ``smith``: ``smith ask "question"``, ``smith chat``, ``smith keys --conversation ID``,
    ``smith status``, ``smith pending TURN``, ``smith approve|reject TURN CALL``, ``smith result TURN CALL VALUE``,
    ``smith respond TURN REQUEST accept|decline|cancel``, ``smith usage [--hours N | --day] [--agent NAME]``,
    ``smith tenant set|show|clear TENANT``, ``smith migrate-to-cluster --to-url URL [--dry-run] [--replace]``."""
    args = parse_args(argv)
    commands = {"ask": _run_ask, "chat": _run_chat, "keys": _run_keys, "status": _run_status, "pending": _run_pending}
    commands["respond"] = _run_respond
    commands["usage"] = _run_usage
    commands["tenant"] = _run_tenant
    commands["migrate-to-cluster"] = _run_migrate
    commands |= dict.fromkeys(("approve", "reject", "result"), _run_decide)
    try:
        args.settings = settings = _with_options(ClientSettings.from_env(), args)  # all checked first
        args.given_redis_url = args.redis_url  # the --redis-url option (None: not given), for printed commands
        args.redis_url, args.prefix = settings.redis_url, settings.prefix
        code = asyncio.run(_stopped_by_sigterm(commands[args.command](args)))
    except (SmithError, RedisError) as exc:  # status and keys read Redis directly: its errors too
        code = fail("smith", exc)
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # `smith keys | head`: the reader is gone, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        code = 1
    raise SystemExit(code)


if __name__ == "__main__":
    smith_main()
