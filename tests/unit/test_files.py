"""Tests for the demo read_local_file tool (smith_worker.demo.files)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smith_worker.demo.files import (
    DEFAULT_MAX_BYTES,
    DEMO_SANDBOX,
    SandboxError,
    read_local_file,
    write_local_file,
)


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """A sandbox ``box`` next to an ``outside`` directory holding a secret.

    box/hello.txt        "hello\\n"
    box/sub/deep.txt     "deep\\n"
    box/link_in          -> hello.txt           (stays inside)
    box/link_out         -> ../outside/secret.txt
    box/link_abs         -> <abs>/outside/secret.txt
    box/dir_out          -> ../outside          (symlinked parent directory)
    box/dir_in           -> sub                 (stays inside)
    box/dangling_out     -> ../outside/missing.txt
    box/dangling_in      -> missing.txt
    box/loop_a <-> box/loop_b
    """
    box = tmp_path / "box"
    outside = tmp_path / "outside"
    (box / "sub").mkdir(parents=True)
    outside.mkdir()
    (box / "hello.txt").write_text("hello\n", encoding="utf-8")
    (box / "sub" / "deep.txt").write_text("deep\n", encoding="utf-8")
    (outside / "secret.txt").write_text("secret\n", encoding="utf-8")
    links = {
        "link_in": "hello.txt",
        "link_out": "../outside/secret.txt",
        "link_abs": str(outside / "secret.txt"),
        "dir_out": "../outside",
        "dir_in": "sub",
        "dangling_out": "../outside/missing.txt",
        "dangling_in": "missing.txt",
        "loop_a": "loop_b",
        "loop_b": "loop_a",
    }
    for name, target in links.items():
        os.symlink(target, box / name)
    return box


def assert_refused(path: str, sandbox: Path, message: str, **kwargs: int) -> None:
    with pytest.raises(SandboxError) as caught:
        read_local_file(path, sandbox, **kwargs)
    assert message in str(caught.value)
    assert str(sandbox) not in str(caught.value)  # host paths are not leaked


# ---------------------------------------------------------------- happy paths


def test_sandbox_error_is_a_value_error() -> None:
    assert issubclass(SandboxError, ValueError)


def test_reads_a_file(layout: Path) -> None:
    assert read_local_file("hello.txt", layout) == "hello\n"


@pytest.mark.parametrize("path", ["sub/deep.txt", "./sub/deep.txt", "sub//deep.txt", "dir_in/deep.txt"])
def test_reads_nested_and_inside_symlinked_paths(layout: Path, path: str) -> None:
    assert read_local_file(path, layout) == "deep\n"


def test_follows_a_symlink_that_stays_inside(layout: Path) -> None:
    assert read_local_file("link_in", layout) == "hello\n"


def test_accepts_sandbox_given_as_str_or_relative_or_via_symlink(
    layout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.symlink(layout, tmp_path / "box_alias")
    assert read_local_file("hello.txt", tmp_path / "box_alias") == "hello\n"
    assert read_local_file("hello.txt", str(layout)) == "hello\n"  # type: ignore[arg-type]
    monkeypatch.chdir(tmp_path)
    assert read_local_file("hello.txt", Path("box")) == "hello\n"


def test_preserves_content_exactly(tmp_path: Path) -> None:
    text = "caf\u00e9 \u2603\r\nline two\n\n"
    (tmp_path / "t.txt").write_bytes(text.encode("utf-8"))
    assert read_local_file("t.txt", tmp_path) == text


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").touch()
    assert read_local_file("empty.txt", tmp_path) == ""


def test_size_limit_is_inclusive_and_in_bytes(tmp_path: Path) -> None:
    (tmp_path / "e.txt").write_text("\u00e9" * 5, encoding="utf-8")  # 5 chars, 10 bytes
    assert read_local_file("e.txt", tmp_path, max_bytes=10) == "\u00e9" * 5
    assert_refused("e.txt", tmp_path, "is too large: 10 bytes (limit 9 bytes)", max_bytes=9)


def test_default_limit_is_64_kib(tmp_path: Path) -> None:
    assert DEFAULT_MAX_BYTES == 64 * 1024
    (tmp_path / "ok.txt").write_bytes(b"a" * DEFAULT_MAX_BYTES)
    (tmp_path / "big.txt").write_bytes(b"a" * (DEFAULT_MAX_BYTES + 1))
    assert len(read_local_file("ok.txt", tmp_path)) == DEFAULT_MAX_BYTES
    assert_refused("big.txt", tmp_path, "file 'big.txt' is too large: 65537 bytes (limit 65536 bytes)")


@pytest.mark.parametrize("name", ["README.txt", "numbers.txt"])
def test_demo_sandbox_files_are_readable(name: str) -> None:
    assert read_local_file(name, DEMO_SANDBOX).strip()


def test_demo_numbers_are_numbers() -> None:
    lines = read_local_file("numbers.txt", DEMO_SANDBOX).split()
    assert lines
    for line in lines:
        float(line)  # raises if the line is not a number


# ------------------------------------------------------------ path syntax errors


@pytest.mark.parametrize("path", ["", " ", "\t\n"])
def test_refuses_empty_path(layout: Path, path: str) -> None:
    assert_refused(path, layout, "empty path")


def test_refuses_non_string_path(layout: Path) -> None:
    assert_refused(42, layout, "path must be a string, not int")  # type: ignore[arg-type]


@pytest.mark.parametrize("path", ["hello.txt\x00", "\x00", "sub/\x00deep.txt"])
def test_refuses_nul_bytes(layout: Path, path: str) -> None:
    assert_refused(path, layout, "contains a NUL byte")


@pytest.mark.parametrize("path", ["/etc/passwd", "//etc/passwd", "C:\\Windows\\win.ini", "\\\\server\\share\\x"])
def test_refuses_absolute_paths(layout: Path, path: str) -> None:
    assert_refused(path, layout, f"absolute path {path!r} refused")


def test_refuses_absolute_path_even_inside_the_sandbox(layout: Path) -> None:
    with pytest.raises(SandboxError, match="absolute path"):
        read_local_file(str(layout / "hello.txt"), layout)


@pytest.mark.parametrize(
    "path", ["..", "../outside/secret.txt", "sub/../hello.txt", "sub/..", "a/b/../../hello.txt", "..\\outside\\secret.txt"]
)
def test_refuses_dot_dot_components(layout: Path, path: str) -> None:
    assert_refused(path, layout, "'..' components are not allowed")


def test_dots_inside_a_name_are_fine(tmp_path: Path) -> None:
    (tmp_path / "..notes..txt").write_text("ok", encoding="utf-8")
    assert read_local_file("..notes..txt", tmp_path) == "ok"


# ------------------------------------------------------------------ escapes


@pytest.mark.parametrize(
    "path",
    [
        "link_out",  # relative symlink out
        "link_abs",  # absolute symlink out
        "dir_out/secret.txt",  # symlinked parent directory
        "dir_out",
        "dangling_out",  # reported as an escape even though the target is missing
    ],
)
def test_refuses_symlink_escapes(layout: Path, path: str) -> None:
    assert_refused(path, layout, f"path {path!r} refused: it resolves outside the sandbox")


def test_sibling_sharing_the_sandbox_name_prefix_is_outside(tmp_path: Path) -> None:
    """``box2`` is outside ``box`` even though the string 'box2' starts with 'box'."""
    box = tmp_path / "box"
    box.mkdir()
    (tmp_path / "box2").mkdir()
    (tmp_path / "box2" / "x.txt").write_text("x", encoding="utf-8")
    os.symlink("../box2/x.txt", box / "x")
    assert_refused("x", box, "resolves outside the sandbox")


# ------------------------------------------------------------ target errors


@pytest.mark.parametrize("path", ["missing.txt", "sub/missing.txt", "nodir/x.txt", "dangling_in"])
def test_missing_file(layout: Path, path: str) -> None:
    assert_refused(path, layout, f"no such file: {path!r}")


def test_path_through_a_file(layout: Path) -> None:
    assert_refused("hello.txt/x", layout, "no such file: 'hello.txt/x'")


@pytest.mark.parametrize("path", ["sub", "sub/", ".", "dir_in"])
def test_refuses_directories(layout: Path, path: str) -> None:
    assert_refused(path, layout, "is a directory, not a file")


def test_refuses_symlink_loops(layout: Path) -> None:
    assert_refused("loop_a", layout, "cannot resolve 'loop_a': symlink loop")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_refuses_fifo_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    assert_refused("pipe", tmp_path, "'pipe' is not a regular file")


@pytest.mark.parametrize(
    ("content", "offset"),
    [(b"\xff\xfe", 0), (b"ok \xc3(", 3), (b"abc\xe2\x82", 3), (b"\x80", 0)],
)
def test_refuses_non_utf8(tmp_path: Path, content: bytes, offset: int) -> None:
    (tmp_path / "bin.dat").write_bytes(content)
    assert_refused("bin.dat", tmp_path, f"file 'bin.dat' is not UTF-8 text (invalid byte at offset {offset})")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read anything")
def test_unreadable_file(tmp_path: Path) -> None:
    locked = tmp_path / "locked.txt"
    locked.write_text("x", encoding="utf-8")
    locked.chmod(0)
    assert_refused("locked.txt", tmp_path, "cannot open 'locked.txt': Permission denied")


# ---------------------------------------------------------- bad arguments


def test_refuses_missing_sandbox(tmp_path: Path) -> None:
    assert_refused("x.txt", tmp_path / "nope", "sandbox directory is not accessible")


def test_refuses_sandbox_that_is_a_file(layout: Path) -> None:
    assert_refused("x", layout / "hello.txt", "sandbox is not a directory")


@pytest.mark.parametrize("max_bytes", [0, -1, True, 1.5])
def test_rejects_bad_max_bytes(layout: Path, max_bytes: object) -> None:
    with pytest.raises(ValueError, match="max_bytes must be a positive integer"):
        read_local_file("hello.txt", layout, max_bytes=max_bytes)  # type: ignore[arg-type]


# -------------------------------------------------------------- property test


@pytest.fixture(scope="module")
def shared_box(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One layout for all hypothesis examples; ``outside`` holds the only "secret"."""
    root = tmp_path_factory.mktemp("prop")
    (root / "box" / "sub").mkdir(parents=True)
    (root / "outside").mkdir()
    (root / "box" / "hello.txt").write_text("hello\n", encoding="utf-8")
    (root / "box" / "sub" / "hello.txt").write_text("deep\n", encoding="utf-8")
    (root / "outside" / "hello.txt").write_text("secret\n", encoding="utf-8")
    os.symlink("../outside/hello.txt", root / "box" / "link_out")
    os.symlink("../outside", root / "box" / "dir_out")
    os.symlink("../../outside", root / "box" / "sub" / "dir_out")
    return root / "box"


@given(
    st.lists(
        st.sampled_from(["..", ".", "sub", "link_out", "dir_out", "hello.txt", "x", "", "/"]),
        max_size=6,
    )
)
def test_never_returns_content_from_outside(shared_box: Path, parts: list[str]) -> None:
    path = "/".join(parts)
    try:
        content = read_local_file(path, shared_box)
    except SandboxError:
        return
    assert content in {"hello\n", "deep\n"}


# ------------------------------------------------------- races and hard links


def test_a_symlink_swapped_during_reads_never_leads_outside(tmp_path: Path) -> None:
    """One thread swaps ``box/swing`` between an inside and an outside directory for 5 s while
    this one reads ``swing/file.txt`` through it: no read may return the outside content."""
    box, outside = tmp_path / "box", tmp_path / "outside"
    (box / "inside").mkdir(parents=True)
    outside.mkdir()
    (box / "inside" / "file.txt").write_text("inside\n", encoding="utf-8")
    (outside / "file.txt").write_text("outside\n", encoding="utf-8")
    os.symlink("inside", box / "swing")
    stop = threading.Event()
    swaps = 0

    def swap() -> None:
        nonlocal swaps
        targets = ["../outside", "inside", str(outside), str(box / "inside")]
        while not stop.is_set():
            temp = box / f"swing.{swaps % 2}"
            os.symlink(targets[swaps % len(targets)], temp)
            os.replace(temp, box / "swing")  # atomic swap, like an attacker would
            swaps += 1

    swapper = threading.Thread(target=swap)
    swapper.start()
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 5.0
    try:
        while time.monotonic() < deadline:
            try:
                outcome = read_local_file("swing/file.txt", box)
            except SandboxError as exc:
                outcome = "refused: " + str(exc).split(":")[0]
            seen[outcome] = seen.get(outcome, 0) + 1
    finally:
        stop.set()
        swapper.join()
    assert "outside\n" not in seen
    assert seen.get("inside\n", 0) > 0 and sum(seen.values()) > 100 and swaps > 100  # the race really ran


def test_refuses_a_hard_link_to_an_outside_file(layout: Path) -> None:
    os.link(layout.parent / "outside" / "secret.txt", layout / "hard.txt")
    assert_refused("hard.txt", layout, "'hard.txt' refused: it has 2 hard links")


# ------------------------------------------------------- write_local_file (the chat agent's gated tool)


def assert_write_refused(path: str, sandbox: Path, message: str, content: str = "x", **kwargs: int) -> None:
    with pytest.raises(SandboxError) as caught:
        write_local_file(path, content, sandbox, **kwargs)
    assert message in str(caught.value)
    assert str(sandbox) not in str(caught.value)


def test_writes_creates_and_replaces_a_file_inside(layout: Path) -> None:
    assert write_local_file("new.txt", "héllo\n", layout) == len("héllo\n".encode())
    assert (layout / "new.txt").read_bytes() == "héllo\n".encode()
    assert write_local_file("sub/new.txt", "one", layout) == 3
    assert write_local_file("./sub/new.txt", "two", layout) == 3  # replaced, not appended
    assert (layout / "sub" / "new.txt").read_text() == "two"
    assert write_local_file("dir_in/other.txt", "in", layout) == 2  # a folder symlink that stays inside
    assert (layout / "sub" / "other.txt").read_text() == "in"
    write_local_file("hello.txt", "", layout)
    assert (layout / "hello.txt").read_text() == ""


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../outside/new.txt", "'..' components are not allowed"),
        ("/tmp/new.txt", "absolute path"),
        ("", "empty path"),
        ("link_out", "'link_out' refused: it is a symlink"),
        ("link_in", "'link_in' refused: it is a symlink"),
        ("dangling_out", "'dangling_out' refused: it is a symlink"),  # O_CREAT never follows it outside
        ("dir_out/new.txt", "resolves outside the sandbox"),
        ("sub", "'sub' is a directory, not a file"),
        (".", "names a folder, not a file"),
        ("missing/new.txt", "no such file"),
        ("hello.txt/new.txt", "no such folder for 'hello.txt/new.txt'"),
    ],
)
def test_write_refuses_what_leaves_the_sandbox_or_is_not_a_file(layout: Path, path: str, message: str) -> None:
    assert_write_refused(path, layout, message)
    assert (layout.parent / "outside" / "secret.txt").read_text() == "secret\n"
    assert not (layout.parent / "outside" / "new.txt").exists()
    assert not (layout.parent / "outside" / "missing.txt").exists()


def test_write_refuses_a_hard_link_to_an_outside_file(layout: Path) -> None:
    os.link(layout.parent / "outside" / "secret.txt", layout / "hard.txt")
    assert_write_refused("hard.txt", layout, "'hard.txt' refused: it has 2 hard links")
    assert (layout.parent / "outside" / "secret.txt").read_text() == "secret\n"  # not truncated


def test_write_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    assert_write_refused("pipe", tmp_path, "'pipe' is not a regular file")


def test_write_checks_the_content(tmp_path: Path) -> None:
    assert_write_refused("a.txt", tmp_path, "content is too large: 5 bytes (limit 4 bytes)", "héll", max_bytes=4)
    assert write_local_file("a.txt", "four", tmp_path, max_bytes=4) == 4
    assert_write_refused("b.txt", tmp_path, "lone surrogate", "\ud800")
    with pytest.raises(SandboxError, match="content must be a string"):
        write_local_file("b.txt", 5, tmp_path)  # type: ignore[arg-type]
    assert not (tmp_path / "b.txt").exists()
