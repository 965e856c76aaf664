"""Parent-death launcher for stdio MCP servers: a child dies with its worker (docs/architecture.md, Fault model).

Run as a script, never imported by the pool at spawn time::

    python -I -S launcher.py <parent_pid> <command> [args...]

It asks the kernel for SIGKILL when its parent thread dies
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``, Linux; kept across ``execve``),
exits at once if the parent is already gone, writes
``<PID_MARKER><pid>`` on stderr so the pool learns the server's pid, then
``execvp``s the server in its place (same pid). On other systems it only
writes the marker and execs. ``-I -S`` keep its start-up to a few
milliseconds: it imports nothing but ``os``, ``sys``, ``signal`` and ``ctypes``.

The SDK cannot take a ``preexec_fn`` (it spawns through ``anyio.open_process``),
so this is the "equivalent" of a preexec hook.
"""

from __future__ import annotations

import os
import signal
import sys

PID_MARKER = "agent_smith.mcp.launcher pid="
PR_SET_PDEATHSIG = 1
EXIT_PARENT_GONE = 70
EXIT_EXEC_FAILED = 127


def set_parent_death_signal() -> None:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux; nothing elsewhere or on failure."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no libc or no prctl: run without the guard
        pass


def main(argv: list[str]) -> None:
    """Arm the guard, announce the pid and exec ``argv[1:]``; never returns."""
    parent, command = int(argv[0]), argv[1:]
    set_parent_death_signal()
    if os.getppid() != parent:  # the worker died before the guard was armed
        os._exit(EXIT_PARENT_GONE)
    os.write(2, f"{PID_MARKER}{os.getpid()}\n".encode())
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        os.write(2, f"agent_smith.mcp.launcher: cannot exec {command[0]!r}: {exc}\n".encode())
        os._exit(EXIT_EXEC_FAILED)


if __name__ == "__main__":
    main(sys.argv[1:])
