"""``make web``: the web relay (``examples/web/app.py``) with Redis, the model and the workers of ``make demo``.

Starts what :func:`smith_worker.demo.run.start_services` starts (``SMITH_REDIS_URL``
if it answers, else a private redis-server; ``SMITH_LLM_BASE_URL`` if set,
else the embedded model; one turn worker and one tool worker), then serves
the page on ``http://127.0.0.1:$SMITH_WEB_PORT/`` (default 8000) until Ctrl-C,
or until one of the processes it started exits (it says which, exit code 1),
and stops everything it started. Logs go to ``.demo-logs/``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import uvicorn

from smith_client.errors import ConfigurationError
from smith_worker.demo.run import one_line_errors, start_services, watching_children


def web_port() -> int:
    """``SMITH_WEB_PORT`` (default 8000) as a TCP port number; else :class:`ConfigurationError`, before any start."""
    raw = os.environ.get("SMITH_WEB_PORT") or "8000"
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ConfigurationError(f"SMITH_WEB_PORT must be a TCP port number from 1 to 65535, got {raw[:80]!r}",
                                 setting="SMITH_WEB_PORT")  # fmt: skip
    return int(raw)


def main() -> int:
    """Serve the example until interrupted; returns the exit code."""
    port = web_port()
    exited: list[str] = []
    with contextlib.ExitStack() as stack:
        redis_url, prefix, children = start_services(stack, Path(".demo-logs"), status=_status)
        os.environ.update(SMITH_REDIS_URL=redis_url, SMITH_PREFIX=prefix)  # read by the app at startup
        server = uvicorn.Server(uvicorn.Config("examples.web.app:app", host="127.0.0.1", port=port, log_level="info"))

        def stop_serving(line: str) -> None:
            exited.append(line)
            _status(line)
            server.should_exit = True

        _status(f"open http://127.0.0.1:{port}/ (Ctrl-C stops everything)")
        with watching_children(children, stop_serving), contextlib.suppress(KeyboardInterrupt):
            server.run()  # uvicorn re-raises a Ctrl-C once it has shut down (uvicorn.run suppresses it)
    _status("stopped everything it started")
    return 1 if exited else 0


def _status(line: str) -> None:
    print(f"[web] {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(one_line_errors("make web", main))
