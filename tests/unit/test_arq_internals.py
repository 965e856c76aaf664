"""The arq internals the workers rely on (smith_worker/queue/arq_internals.py), each checked against the installed
arq: an arq upgrade that breaks one fails the test naming it."""

from __future__ import annotations

import ast
import asyncio
import inspect
import itertools
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import arq
import pytest
from arq.constants import abort_jobs_ss
from arq.worker import Worker, func

from smith_client.errors import ConfigurationError
from smith_client.keys import Keys
from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.queue import arq_internals
from smith_worker.queue.arq_internals import (
    ABORT_SET_USERS,
    ARQ_VERSION,
    CALLED_COROUTINES,
    DRIVEN_ATTRIBUTES,
    OVERRIDDEN_METHODS,
    OVERRIDDEN_PROPERTIES,
    RUN_JOB_ABORT_COMMAND,
    RUN_JOB_FIRST_TRANSACTION,
    check_arq,
)
from smith_worker.queue.worker import SmithWorker, build_worker

ROOT = Path(__file__).resolve().parents[2]


async def _job(ctx: dict[str, Any]) -> None:
    return None


def _worker(allow_abort_jobs: bool = False) -> Worker:
    return Worker(functions=[func(_job, name="job")], handle_signals=False, allow_abort_jobs=allow_abort_jobs)


def test_the_installed_arq_is_the_one_pyproject_pins_and_the_internals_were_read_from():
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"arq=={ARQ_VERSION}" in pins
    assert metadata.version("arq") == ARQ_VERSION
    check_arq()


def test_another_arq_version_stops_the_worker_at_start(monkeypatch):
    monkeypatch.setattr(arq_internals.metadata, "version", lambda _name: "0.29.0")
    with pytest.raises(ConfigurationError, match="arq 0.29.0 is installed"):
        check_arq()


def test_smith_worker_overrides_exactly_the_listed_methods_and_properties_of_arqs_worker():
    overridden = {name for name in vars(SmithWorker) if hasattr(Worker, name) and not name.startswith("__")}
    assert overridden == set(OVERRIDDEN_METHODS) | set(OVERRIDDEN_PROPERTIES)


@pytest.mark.parametrize("name", OVERRIDDEN_METHODS)
def test_each_overridden_method_keeps_the_parameters_arq_calls_it_with(name):
    ours, arqs = inspect.signature(getattr(SmithWorker, name)), inspect.signature(getattr(Worker, name))
    assert list(ours.parameters) == list(arqs.parameters)
    assert inspect.iscoroutinefunction(getattr(SmithWorker, name)) == inspect.iscoroutinefunction(
        getattr(Worker, name)
    )


@pytest.mark.parametrize("name", OVERRIDDEN_PROPERTIES)
def test_each_overridden_property_is_a_property_in_arq(name):
    assert isinstance(inspect.getattr_static(Worker, name), property)


@pytest.mark.parametrize("name", CALLED_COROUTINES)
def test_each_called_method_is_a_coroutine_function_of_arqs_worker(name):
    assert inspect.iscoroutinefunction(getattr(Worker, name))


@pytest.mark.parametrize("name", DRIVEN_ATTRIBUTES)
def test_arqs_worker_init_sets_each_driven_attribute(name):
    assert name in vars(_worker())


def test_the_job_slots_are_a_bounded_semaphore_one_above_max_jobs_a_counter_and_a_task_dict():
    worker = _worker()
    assert isinstance(worker.sem, asyncio.BoundedSemaphore) and worker.sem._value == worker.max_jobs + 1
    assert worker.job_counter == 0 and worker.tasks == {}


class _Recorded(Exception):
    pass


class _RecordingPool:
    """Records what ``run_job`` queues on its first pipeline, then stops it."""

    def __init__(self) -> None:
        self.queued: list[str] = []
        self.transaction: bool | None = None

    def pipeline(self, transaction: bool = True) -> _RecordingPool:
        self.transaction = transaction
        return self

    async def __aenter__(self) -> _RecordingPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def __getattr__(self, command: str) -> Any:
        return lambda *args, **kwargs: self.queued.append(command)

    async def execute(self) -> list[Any]:
        raise _Recorded


@pytest.mark.parametrize("allow_abort_jobs", [False, True])
async def test_run_jobs_first_use_of_the_pool_is_one_transaction_of_the_listed_commands(allow_abort_jobs):
    worker, pool = _worker(allow_abort_jobs), _RecordingPool()
    worker._pool = pool
    with pytest.raises(_Recorded):
        await worker.run_job("j1", 0)
    expected = [*RUN_JOB_FIRST_TRANSACTION, *([RUN_JOB_ABORT_COMMAND] if allow_abort_jobs else [])]
    assert pool.transaction is True and pool.queued == expected


def _functions_naming_the_abort_set() -> set[str]:
    """``Class.method`` (or ``function``) of each function of arq's modules whose code names its global abort set."""
    found = set()
    for module in Path(arq.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                    isinstance(name, ast.Name) and name.id == "abort_jobs_ss" for name in ast.walk(child)
                ):
                    found.add(f"{node.name}.{child.name}" if isinstance(node, ast.ClassDef) else child.name)
    return found


def test_arqs_uses_of_its_global_abort_set_are_the_listed_ones():
    assert _functions_naming_the_abort_set() == set(ABORT_SET_USERS)


def test_each_worker_method_naming_arqs_abort_set_is_overridden_but_run_job_which_the_claim_answers():
    methods = {name.removeprefix("Worker.") for name in ABORT_SET_USERS if name.startswith("Worker.")}
    assert methods - set(OVERRIDDEN_METHODS) == {"run_job"}


class _TransactionRecorder:
    """A pool whose pipelines record the commands queued (name, args, kwargs) and the transaction flag."""

    def __init__(self) -> None:
        self.queued: list[tuple[Any, ...]] = []

    def pipeline(self, transaction: bool = True) -> _TransactionRecorder:
        self.queued.append(("transaction", transaction))
        return self

    async def __aenter__(self) -> _TransactionRecorder:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def __getattr__(self, command: str) -> Any:
        return lambda *args, **kwargs: self.queued.append((command, *args, *sorted(kwargs.items())))

    async def execute(self) -> list[Any]:
        return [None] * (len(self.queued) - 1)


def _smith_worker() -> SmithWorker:
    return build_worker(SmithApp(), "tools", Settings(redis_url="redis://127.0.0.1:1/0", prefix="ai"))


async def _recorded(worker: SmithWorker, method: Any, *args: Any) -> list[tuple[Any, ...]]:
    worker._pool = recorder = _TransactionRecorder()
    await method(worker, *args)
    return recorder.queued


def _on_the_prefixs_set(queued: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """arq's recorded commands with its global abort set replaced by the prefix's."""
    return [tuple(Keys("ai").abort_set if arg == abort_jobs_ss else arg for arg in command) for command in queued]


@pytest.mark.parametrize(
    ("finish", "result_data", "keep_result_forever", "incr_score", "keep_in_progress"),
    list(itertools.product([True, False], [None, b"result"], [False, True], [None, 500], [None, 2.5])),
)
async def test_finish_job_sends_arqs_transaction_on_the_prefixs_abort_set(
    finish, result_data, keep_result_forever, incr_score, keep_in_progress
):
    worker = _smith_worker()
    args = ("ai:job", finish, result_data, 60.0, keep_result_forever, incr_score, keep_in_progress)
    arqs = await _recorded(worker, Worker.finish_job, *args)
    ours = await _recorded(worker, SmithWorker.finish_job, *args)
    assert ours == _on_the_prefixs_set(arqs) and all(abort_jobs_ss not in command for command in ours)


@pytest.mark.parametrize(
    ("result_data", "keep_result_s", "keep_result_forever"),
    list(itertools.product([None, b"result"], [0.0, 60.0], [False, True])),
)
async def test_finish_failed_job_sends_arqs_transaction_on_the_prefixs_abort_set(
    result_data, keep_result_s, keep_result_forever
):
    worker = _smith_worker()
    worker.keep_result_s, worker.keep_result_forever = keep_result_s, keep_result_forever
    arqs = await _recorded(worker, Worker.finish_failed_job, "ai:job", result_data)
    ours = await _recorded(worker, SmithWorker.finish_failed_job, "ai:job", result_data)
    assert ours == _on_the_prefixs_set(arqs) and all(abort_jobs_ss not in command for command in ours)
