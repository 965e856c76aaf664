"""The demo's file tools: ``read_local_file`` reads a small UTF-8 text file from a sandbox,
``write_local_file`` writes one into it (the demo gates it behind a person's approval).

Error messages quote the path exactly as the caller gave it and never reveal
where the sandbox lives on the host.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

__all__ = ["DEFAULT_MAX_BYTES", "DEMO_SANDBOX", "SandboxError", "read_local_file", "write_local_file"]

DEFAULT_MAX_BYTES = 64 * 1024
"""Default size limit, in bytes (not characters), of a file that may be read."""

DEMO_SANDBOX = Path(__file__).resolve().parent / "demo_fs"
"""The sandbox directory shipped with the demo."""

# O_NOFOLLOW: never let the kernel follow a symlink (the walk reads links itself).
# O_NONBLOCK: opening a FIFO must not hang; it is refused as "not a regular file".
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Writing: created if missing, never through a symlink (O_NOFOLLOW: ELOOP, a dangling one too), never blocking
# on a FIFO (O_NONBLOCK: ENXIO without a reader); truncated only once it is known to be a lone regular file.
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: Symlinks followed for one path before it counts as a loop (Linux's own limit is 40).
_MAX_SYMLINKS = 40


class SandboxError(ValueError):
    """A path that may not (or cannot) be read from the sandbox."""


def read_local_file(path: str, sandbox: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """Return the text of the UTF-8 file at ``path`` inside ``sandbox``.

    Args:
        path: a relative path such as ``"notes/todo.txt"``, resolved against
            ``sandbox``.  Symlinks are followed, but only as long as the real
            path stays inside the sandbox; the walk is race-free (each
            component opened relative to its parent's descriptor with
            ``O_NOFOLLOW``), so a symlink swapped meanwhile cannot lead out.
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
            file, a file with more than one hard link, larger than ``max_bytes`` (the message gives both sizes),
            not valid UTF-8, or unreadable.  Also raised if ``sandbox`` is not
            an existing directory.
        ValueError: ``max_bytes`` is not a positive integer.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive integer, not {max_bytes!r}")
    _check_path_syntax(path)
    root = _resolve_sandbox(sandbox)
    data = _read_regular_file(root, path, max_bytes)
    return _decode_utf8(data, path)


def write_local_file(path: str, content: str, sandbox: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """Write ``content`` as UTF-8 to the file at ``path`` inside ``sandbox``, creating or replacing it.

    Args:
        path: a relative path such as ``"notes/todo.txt"``; its folder must exist inside ``sandbox`` (reached
            as :func:`read_local_file` reaches a file: race-free, symlinks followed only inside it).
        content: the text to write (``str``), unchanged (no newline translation).
        sandbox: an existing directory; nothing outside its real path is written.
        max_bytes: the largest content accepted, in UTF-8 bytes.

    Returns:
        The number of bytes written (``int``).

    Raises:
        SandboxError: the path is refused as :func:`read_local_file` refuses it, names a folder, or its folder
            is missing, not a folder or outside the sandbox; the target is a symlink (followed never, a dangling
            one neither), a folder or other non-regular file, or a file with more than one hard link (it may
            be a file outside the sandbox too); ``content`` is not a string, not valid Unicode, or larger than
            ``max_bytes``; or the file cannot be written.  Also raised if ``sandbox`` is not an existing
            directory.
        ValueError: ``max_bytes`` is not a positive integer.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive integer, not {max_bytes!r}")
    _check_path_syntax(path)
    data = _encode_utf8(content, max_bytes)
    root = _resolve_sandbox(sandbox)
    parts = _components(path)  # reversed: the file's name first
    if not parts:
        raise SandboxError(f"{path!r} names a folder, not a file")
    fd = _create_inside(root, path, parts[0], "/".join(reversed(parts[1:])) or ".")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SandboxError(f"{path!r} is not a regular file")
        if info.st_nlink > 1:
            raise SandboxError(f"{path!r} refused: it has {info.st_nlink} hard links")
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        raise SandboxError(f"cannot write {path!r}: {_reason(exc)}") from None
    finally:
        os.close(fd)
    return len(data)


def _encode_utf8(content: str, max_bytes: int) -> bytes:
    if not isinstance(content, str):
        raise SandboxError(f"content must be a string, not {type(content).__name__}")
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SandboxError(f"content is not valid Unicode (lone surrogate at {exc.start})") from None
    if len(data) > max_bytes:
        raise SandboxError(f"content is too large: {len(data)} bytes (limit {max_bytes} bytes)")
    return data


def _create_inside(root: Path, path: str, name: str, folder: str) -> int:
    """Open (creating it) file ``name`` of ``folder`` inside ``root`` for writing; ``path`` is for messages."""
    dir_fd = _open_inside(root, folder)
    try:
        if not stat.S_ISDIR(os.fstat(dir_fd).st_mode):
            raise SandboxError(f"no such folder for {path!r}")
        return os.open(name, _WRITE_FLAGS, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SandboxError(f"{path!r} refused: it is a symlink") from None
        if exc.errno == errno.EISDIR:
            raise SandboxError(f"{path!r} is a directory, not a file") from None
        if exc.errno == errno.ENXIO:
            raise SandboxError(f"{path!r} is not a regular file") from None
        raise SandboxError(f"cannot write {path!r}: {_reason(exc)}") from None
    finally:
        os.close(dir_fd)


def _check_path_syntax(path: str) -> None:
    """Refuse paths that are malformed or escape the sandbox by their spelling."""
    if not isinstance(path, str):
        raise SandboxError(f"path must be a string, not {type(path).__name__}")
    if not path.strip():
        raise SandboxError("empty path: give a file name relative to the sandbox")
    if "\x00" in path:
        raise SandboxError(f"path {path!r} contains a NUL byte")
    if os.path.isabs(path) or PureWindowsPath(path).anchor:
        raise SandboxError(f"absolute path {path!r} refused: give a path relative to the sandbox")
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


def _open_inside(root: Path, path: str) -> int:
    """Open ``path`` inside ``root`` race-free and return the descriptor (the caller closes it).

    An ``openat``-style walk: each component is opened relative to the
    descriptor of its parent directory with ``O_NOFOLLOW``, so the kernel never
    follows a link on its own. A symlink is read (``readlinkat``) and its
    target walked the same way from the directory holding it (an absolute
    target only when it lies under the sandbox's real path); ``..`` pops a
    directory this walk opened and cannot go above the sandbox. A component
    swapped for a symlink after it was examined makes its ``O_NOFOLLOW`` open
    fail, and it is examined again. So whatever changes meanwhile, the file
    opened is inside the sandbox.
    """
    stack = [os.open(root, _DIR_FLAGS)]  # descriptors of the directories from the sandbox down
    pending = _components(path)
    hops = 0
    try:
        while pending:
            name = pending.pop()
            if name == "..":
                if len(stack) == 1:
                    raise SandboxError(f"path {path!r} refused: it resolves outside the sandbox")
                os.close(stack.pop())
                continue
            final = not pending
            try:
                target = _symlink_target(stack[-1], name)
                if target is None:
                    fd = os.open(name, _OPEN_FLAGS if final else _DIR_FLAGS, dir_fd=stack[-1])
                    if final:
                        return fd
                    stack.append(fd)
                    continue
            except FileNotFoundError:
                raise SandboxError(f"no such file: {path!r}") from None
            except NotADirectoryError:
                raise SandboxError(f"no such file: {path!r} (a parent is not a directory)") from None
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise SandboxError(f"cannot open {path!r}: {_reason(exc)}") from None
                target = name  # swapped for a symlink after the check: examine it again
            hops += 1
            if hops > _MAX_SYMLINKS:
                raise SandboxError(f"cannot resolve {path!r}: symlink loop")
            if target != name and os.path.isabs(target):
                _restart_at_root(stack, root, target, path)
                target = os.path.relpath(target, root)
            pending += _components(target)
        return os.dup(stack[-1])  # the path names a directory ("." or "sub/"): refused by the caller
    finally:
        for fd in stack:
            os.close(fd)


def _components(path: str) -> list[str]:
    """Components of ``path``, reversed (the next one last, to pop), without empty ones and ``.``."""
    return [part for part in reversed(path.replace("\\", "/").split("/")) if part not in ("", ".")]


def _symlink_target(dir_fd: int, name: str) -> str | None:
    """The target of ``name`` in ``dir_fd`` if it is a symlink, else None (``lstat`` + ``readlinkat``)."""
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    return os.readlink(name, dir_fd=dir_fd) if stat.S_ISLNK(info.st_mode) else None


def _restart_at_root(stack: list[int], root: Path, target: str, path: str) -> None:
    """An absolute symlink target: only one under the sandbox's real path is followed, from the sandbox."""
    if not Path(os.path.normpath(target)).is_relative_to(root):
        raise SandboxError(f"path {path!r} refused: it resolves outside the sandbox")
    while len(stack) > 1:
        os.close(stack.pop())


def _read_regular_file(root: Path, path: str, max_bytes: int) -> bytes:
    """Open race-free inside ``root``; check type, links and size on the opened descriptor itself."""
    fd = _open_inside(root, path)
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
    if info.st_nlink > 1:  # a hard link may name a file outside the sandbox; no walk can tell
        raise SandboxError(f"{path!r} refused: it has {info.st_nlink} hard links")
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
        raise SandboxError(f"file {path!r} is not UTF-8 text (invalid byte at offset {exc.start})") from None


def _reason(exc: BaseException) -> str:
    """Describe an OS error without the host paths that its str() would include."""
    if isinstance(exc, RuntimeError):  # pathlib's "Symlink loop from '/abs/path'"
        return "symlink loop"
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.strerror or errno.errorcode.get(exc.errno, str(exc.errno))
    return type(exc).__name__
