"""A worker raises its soft limit on open files to the hard one (smith_worker/ops/open_files.py)."""

from __future__ import annotations

import resource

import pytest

from smith_worker.ops.open_files import raise_open_files_limit


@pytest.fixture
def nofile():
    """This process's RLIMIT_NOFILE, restored after the test."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield limits
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_the_soft_limit_goes_up_to_the_hard_one(nofile):
    soft, hard = nofile
    if hard == resource.RLIM_INFINITY or hard < 64:
        pytest.skip(f"needs a finite hard limit of at least 64 files, this system has {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard // 2, hard))
    assert raise_open_files_limit() == (hard // 2, hard)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    assert raise_open_files_limit() == (hard, hard)  # already there: nothing changes


def test_a_refused_raise_leaves_the_limit_and_warns(nofile, monkeypatch, caplog):
    soft, hard = nofile
    if hard == resource.RLIM_INFINITY or hard < 64:
        pytest.skip(f"needs a finite hard limit of at least 64 files, this system has {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard // 2, hard))

    def refuse(*_args: object) -> None:
        raise ValueError("not allowed")

    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert raise_open_files_limit() == (hard // 2, hard // 2)
    assert "could not raise the open files limit" in caplog.text
