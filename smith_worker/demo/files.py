"""The demo ``read_local_file`` tool: read a small UTF-8 text file from a sandbox.

Error messages quote the path exactly as the caller gave it and never reveal
where the sandbox lives on the host.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

__all__ = ["DEFAULT_MAX_BYTES", "DEMO_SANDBOX", "SandboxError", "read_local_file"]

DEFAULT_MAX_BYTES = 64 * 1024
"""Default size limit, in bytes (not characters), of a file that may be read."""

DEMO_SANDBOX = Path(__file__).resolve().parent / "demo_fs"
"""The sandbox directory shipped with the demo."""

# O_NOFOLLOW: refuse a final component swapped for a symlink after the check.
# O_NONBLOCK: opening a FIFO must not hang; it is refused as "not a regular file".
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


class SandboxError(ValueError):
    """A path that may not (or cannot) be read from the sandbox."""


def read_local_file(
    path: str, sandbox: Path, max_bytes: int = DEFAULT_MAX_BYTES
) -> str:
    """Return the text of the UTF-8 file at ``path`` inside ``sandbox``.

    Args:
        path: a relative path such as ``"notes/todo.txt"``, resolved against
            ``sandbox``.  Symlinks are followed, but only as long as the real
            path stays inside the sandbox.
        sandbox: an existing directory (``Path`` or ``str``); everything
            outside its real path is off limits.
        max_bytes: the largest file size accepted, in bytes (a UTF-8 file of
            N bytes decodes to at most N characters).

    Returns:
        The decoded file content (``str``), unchanged (no newline translation).

    Raises:
        SandboxError: the path is empty, absolute (POSIX, or Windows-style
            drive/UNC), contains a NUL byte or a
            ``..`` component, or resolves outside the sandbox; or the target
            is missing ("no such file"), a directory or other non-regular
            file, larger than ``max_bytes`` (the message gives both sizes),
            not valid UTF-8, or unreadable.  Also raised if ``sandbox`` is not
            an existing directory.
        ValueError: ``max_bytes`` is not a positive integer.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive integer, not {max_bytes!r}")
    _check_path_syntax(path)
    root = _resolve_sandbox(sandbox)
    target = _resolve_inside(root, path)
    data = _read_regular_file(target, path, max_bytes)
    return _decode_utf8(data, path)


def _check_path_syntax(path: str) -> None:
    """Refuse paths that are malformed or escape the sandbox by their spelling."""
    if not isinstance(path, str):
        raise SandboxError(f"path must be a string, not {type(path).__name__}")
    if not path.strip():
        raise SandboxError("empty path: give a file name relative to the sandbox")
    if "\x00" in path:
        raise SandboxError(f"path {path!r} contains a NUL byte")
    if os.path.isabs(path) or PureWindowsPath(path).anchor:
        raise SandboxError(
            f"absolute path {path!r} refused: give a path relative to the sandbox"
        )
    components = PurePosixPath(path.replace("\\", "/")).parts
    if ".." in components:
        raise SandboxError(f"path {path!r} refused: '..' components are not allowed")


def _resolve_sandbox(sandbox: Path) -> Path:
    try:
        root = Path(sandbox).resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise SandboxError(f"sandbox directory is not accessible: {_reason(exc)}") from None
    if not root.is_dir():
        raise SandboxError("sandbox is not a directory")
    return root


def _resolve_inside(root: Path, path: str) -> Path:
    """Return the real path of ``root / path``, refusing escapes and missing files.

    The escape check runs before the existence check so that a symlink out of
    the sandbox is reported as such whether or not its target exists.
    """
    candidate = root / path
    if not Path(os.path.realpath(candidate)).is_relative_to(root):
        raise SandboxError(f"path {path!r} refused: it resolves outside the sandbox")
    try:
        return candidate.resolve(strict=True)
    except FileNotFoundError:
        raise SandboxError(f"no such file: {path!r}") from None
    except NotADirectoryError:
        raise SandboxError(f"no such file: {path!r} (a parent is not a directory)") from None
    except (OSError, RuntimeError) as exc:
        raise SandboxError(f"cannot resolve {path!r}: {_reason(exc)}") from None


def _read_regular_file(target: Path, path: str, max_bytes: int) -> bytes:
    """Read the file, checking type and size on the opened descriptor itself."""
    try:
        fd = os.open(target, _OPEN_FLAGS)
    except OSError as exc:
        raise SandboxError(f"cannot open {path!r}: {_reason(exc)}") from None
    try:
        _check_opened_file(os.fstat(fd), path, max_bytes)
        os.set_blocking(fd, True)
        data = _read_up_to(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # the file grew after fstat()
        raise _too_large(path, f"more than {max_bytes} bytes", max_bytes)
    return data


def _check_opened_file(info: os.stat_result, path: str, max_bytes: int) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise SandboxError(f"{path!r} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise SandboxError(f"{path!r} is not a regular file")
    if info.st_size > max_bytes:
        raise _too_large(path, f"{info.st_size} bytes", max_bytes)


def _read_up_to(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0 and (chunk := os.read(fd, remaining)):
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _too_large(path: str, size: str, max_bytes: int) -> SandboxError:
    return SandboxError(f"file {path!r} is too large: {size} (limit {max_bytes} bytes)")


def _decode_utf8(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SandboxError(
            f"file {path!r} is not UTF-8 text (invalid byte at offset {exc.start})"
        ) from None


def _reason(exc: BaseException) -> str:
    """Describe an OS error without the host paths that its str() would include."""
    if isinstance(exc, RuntimeError):  # pathlib's "Symlink loop from '/abs/path'"
        return "symlink loop"
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.strerror or errno.errorcode.get(exc.errno, str(exc.errno))
    return type(exc).__name__
