"""Helpers for the MCP tests: server configs, recording sinks, process checks, polling."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil

from smith_client import SmithClient
from smith_worker.mcp import McpEvent, ServerConfig
from tests.support.mcp_servers import LAB_SERVER, LOWLEVEL_SERVER


def lab_config(alias: str = "lab", *flags: str, log: Path | None = None, **options) -> ServerConfig:
    """The lab server (``tests/support/mcp_servers/lab_server.py``) with ``flags``; ``log`` becomes ``$LAB_LOG``."""
    env = {"LAB_LOG": str(log)} if log is not None else None
    return ServerConfig(alias, command=sys.executable, args=[LAB_SERVER, *flags], env=env, **options)


def lowlevel_config(alias: str, mode: str, **options) -> ServerConfig:
    return ServerConfig(alias, command=sys.executable, args=[LOWLEVEL_SERVER, "--mode", mode], **options)


class RecordingSink:
    """An EventSink that keeps what it gets (one per simulated turn)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.events: list[McpEvent] = []

    async def emit(self, event: McpEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.to_data()["kind"] for e in self.events]


def running(pid: int | None) -> bool:
    """True while ``pid`` is a live (non-zombie) process."""
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def exists(pid: int) -> bool:
    """True while ``pid`` exists at all (zombies included)."""
    return psutil.pid_exists(pid)


def mcp_children() -> list[psutil.Process]:
    """Live descendants of this process that are MCP test or example servers."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any("mcp_server" in part for part in child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


async def eventually(check: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> bool:
    """Poll ``check`` until true or ``timeout`` seconds passed; returns its last value."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True


async def eventually_async(check: Callable[[], Awaitable[object]], timeout: float = 5.0,
                           interval: float = 0.02) -> bool:
    """Like :func:`eventually` for an async ``check``."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True


def log_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def open_input(client: SmithClient, turn_id: str, timeout: float = 90):
    """The turn's first open input request (an MCP elicitation or sampling approval), waited for (seconds)."""
    async with asyncio.timeout(timeout):
        while True:
            items = [item for item in await client.pending(turn_id) if item.kind == "input"]
            if items:
                return items[0]
            await asyncio.sleep(0.05)


def tool_contents(request) -> list[str]:
    """The contents of the tool messages a recorded model request sent."""
    return [m["content"] for m in request.body["messages"] if m.get("role") == "tool"]
