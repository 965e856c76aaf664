"""The process's limit on open files, raised to what the system allows.

Every model request in flight holds a socket (and a turn worker may hold thousands: ``SMITH_TURN_MAX_JOBS``,
``SMITH_LLM_MAX_CONNECTIONS``), and many systems start processes with a soft ``RLIMIT_NOFILE`` of 1024 under a
hard limit far above it. An unprivileged process may raise its soft limit up to its hard limit
(setrlimit(2), https://man7.org/linux/man-pages/man2/setrlimit.2.html); past the soft limit, ``socket()`` and
``accept()`` fail with ``EMFILE``.
"""

from __future__ import annotations

import logging
import resource

logger = logging.getLogger("agent_smith.worker")


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; return ``(before, after)`` (soft, files).

    Nothing changes when the soft limit is the hard one already. A system that refuses the change
    (``ValueError`` or ``OSError`` from :func:`resource.setrlimit`) leaves the limit as it was, logged as a
    warning, never raised: the worker runs with fewer sockets rather than not at all.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        logger.warning("could not raise the open files limit from %d to %d: %s", soft, hard, exc)
        return soft, soft
    return soft, hard
