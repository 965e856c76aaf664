"""Every arq internal this project relies on, in one list, for the arq version pyproject.toml pins.

arq's public API (``Worker(...)``, ``func``) cannot claim jobs in one script,
wait on a wake-up list or outlive Redis, so :class:`~smith_worker.queue.worker.SmithWorker`
subclasses arq's ``Worker``: it overrides some of its methods (among them
every one that names arq's global abort set, :data:`ABORT_SET_USERS`), drives its
private attributes as arq's own methods do, and :mod:`smith_worker.queue.claim`
answers the first transaction of arq's ``run_job`` from the claim script. None
of that is arq's promise. :func:`check_arq` runs when a worker is built, so an
arq that breaks one of these assumptions stops ``smith-worker`` at start with
one line naming it, and ``tests/unit/test_arq_internals.py`` checks each
against the installed arq (a test per assumption), so an upgrade fails there
first.
"""

from __future__ import annotations

import inspect
from importlib import metadata

from arq.worker import Worker

from smith_client.errors import ConfigurationError

#: The arq release the assumptions below were read from (pyproject.toml pins it).
ARQ_VERSION = "0.28.0"

#: ``Worker`` methods :class:`SmithWorker` overrides: arq calls them, so each keeps arq's name and parameters.
OVERRIDDEN_METHODS = (
    "main",
    "close",
    "_poll_iteration",
    "_release_sem_dec_counter_on_complete",
    "handle_sig",
    "handle_sig_wait_for_completion",
    "_cancel_aborted_jobs",
    "finish_job",
    "finish_failed_job",
)

#: Every function of arq that names its global abort set (``arq:abort``,
#: :meth:`~smith_client.keys.Keys.arq_abort_set`), which every prefix of a database would share; the project
#: keeps abort requests in the prefix's own (:attr:`~smith_client.keys.Keys.abort_set`). Each ``Worker`` method
#: of them but ``run_job`` is in :data:`OVERRIDDEN_METHODS`; ``run_job``'s use is its first transaction, which
#: the claim answers (:mod:`smith_worker.queue.claim`); ``Job.abort``, the client's, is never called
#: (``abort.lua`` aborts).
ABORT_SET_USERS = (
    "Worker._cancel_aborted_jobs",
    "Worker.run_job",
    "Worker.finish_job",
    "Worker.finish_failed_job",
    "Job.abort",
)

#: ``Worker`` properties :class:`SmithWorker` overrides (``pool``: arq's code reads the client through it).
OVERRIDDEN_PROPERTIES = ("pool",)

#: ``Worker`` methods :class:`SmithWorker` calls as arq's poll loop does (coroutine functions).
CALLED_COROUTINES = ("heart_beat", "run_job")

#: Attributes ``Worker.__init__`` sets that :class:`SmithWorker` reads or drives: the job slots (``sem``,
#: ``job_counter``, ``tasks``), the client (``_pool``), the signal set-up (``_handle_signals``, ``on_stop``),
#: the settings its claim and its ``finish_failed_job`` read, and the running jobs' tasks its abort check
#: cancels (``job_tasks``) and marks aborted for ``run_job`` (``aborting_tasks``).
DRIVEN_ATTRIBUTES = (
    "sem",
    "job_counter",
    "tasks",
    "_pool",
    "_handle_signals",
    "on_stop",
    "allow_pick_jobs",
    "allow_abort_jobs",
    "in_progress_timeout_s",
    "queue_read_limit",
    "health_check_key",
    "max_jobs",
    "keep_result_s",
    "keep_result_forever",
    "job_tasks",
    "aborting_tasks",
)

#: The commands ``run_job`` queues, in this order, in its first transaction (``self.pool.pipeline()``):
#: read the job record, count the try, refresh the try counter's lifetime. The claim script ran them.
RUN_JOB_FIRST_TRANSACTION = ("get", "incr", "expire")
#: The command a worker with ``allow_abort_jobs`` adds to that transaction: take the job's abort request (from
#: arq's global abort set; the claim took it from the prefix's).
RUN_JOB_ABORT_COMMAND = "zrem"


def check_arq() -> None:
    """Check the installed arq against the assumptions above that can be read without running a job.

    Raises :class:`~smith_client.errors.ConfigurationError` naming the first one broken: another arq
    version, or a method, property or coroutine missing or renamed. (The attributes ``Worker.__init__``
    sets and ``run_job``'s transaction are checked by the tests, on a constructed worker and a run job.)
    """
    installed = metadata.version("arq")
    if installed != ARQ_VERSION:
        raise ConfigurationError(f"arq {installed} is installed; the workers rely on arq {ARQ_VERSION}'s internals")
    for name in OVERRIDDEN_METHODS + CALLED_COROUTINES:
        if not callable(getattr(Worker, name, None)):
            raise ConfigurationError(f"arq's Worker has no method {name!r}, which the workers rely on")
    for name in CALLED_COROUTINES:
        if not inspect.iscoroutinefunction(getattr(Worker, name)):
            raise ConfigurationError(f"arq's Worker.{name} is not a coroutine function, as the workers expect")
    for name in OVERRIDDEN_PROPERTIES:
        if not isinstance(inspect.getattr_static(Worker, name, None), property):
            raise ConfigurationError(f"arq's Worker.{name} is not a property, as the workers expect")
