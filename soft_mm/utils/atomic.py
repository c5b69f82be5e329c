"""Write files so that a kill at any moment leaves either the old file or the complete new one, never a partial one.

The bytes go to a hidden temporary file in the same folder (same file system, so the final ``os.replace`` is a
rename), are flushed to disk with ``fsync``, and only then take the final name; the folder is synced too, so the
rename itself survives a power cut. A temporary file left by a killed writer is named ``.<name>.<random>.partial``.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any

import torch

PARTIAL_SUFFIX = '.partial'


def _fsync_dir(directory: str) -> None:
    """Persist a rename inside ``directory`` (no-op where folders cannot be opened, e.g. on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def partial_path(path: str | os.PathLike) -> str:
    """A fresh temporary path next to ``path`` (created empty, so no two writers share it)."""
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f'.{name}.', suffix=PARTIAL_SUFFIX, dir=directory)
    os.close(fd)
    umask = os.umask(0)  # mkstemp creates 0o600; give the file the permissions open() would
    os.umask(umask)
    os.chmod(temp, 0o666 & ~umask)
    return temp


def publish(temp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Flush the finished file ``temp`` to disk and rename it to ``path`` (atomic on POSIX and Windows)."""
    with open(temp, 'rb+') as f:
        os.fsync(f.fileno())
    os.replace(temp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(os.fspath(path))))


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = 'wb') -> Iterator[IO[Any]]:
    """``open(path, mode)`` for writing whose result appears at ``path`` only when the block ends without error."""
    if mode not in ('w', 'wb'):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    temp = partial_path(path)
    try:
        with open(temp, mode) as f:
            yield f
        publish(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write(file)`` on a temporary binary file and rename it to ``path`` once complete."""
    with atomic_open(path, 'wb') as f:
        write(f)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (e.g. mmengine's ``last_checkpoint``)."""
    with atomic_open(path, 'w') as f:
        f.write(text)


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)``, atomically: a kill during the write leaves ``path`` as it was."""
    atomic_write(path, lambda f: torch.save(obj, f))
