"""Where a consumer keeps its cursor between runs.

Owns: durable, atomic cursor storage in a file. Must never: leave a torn or empty cursor file
after a crash (it writes a temporary file, fsyncs it, renames it over the old one, and fsyncs
the directory).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union


class FileCursor:
    """A consumer's cursor (the last seq it fully processed; 0 for none) in a small text file
    holding the seq in decimal, the format of the Rust client's ``FileCursor``.

    Save it *after* the side effect of that seq is durable; on restart, subscribe after
    ``load()``."""

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self.path = Path(path)

    def load(self) -> int:
        """The saved cursor, 0 when none was saved (``-1`` also means 0).

        Errors: ``OSError`` when the file cannot be read; ``ValueError`` when it holds something
        that is not a seq."""
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return 0
        if text == "-1":
            return 0
        if not text.isdigit():
            raise ValueError(f"{self.path} holds {text!r}, not a seq")
        return int(text)

    def save(self, cursor: int) -> None:
        """Saves ``cursor`` durably before returning: a temporary file beside it, fsynced, renamed
        over it, and the directory fsynced. On an error the previous cursor is kept.

        Errors: ``OSError``; ``ValueError`` for a negative cursor."""
        if cursor < 0:
            raise ValueError(f"a cursor is a seq, at least 0, not {cursor}")
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"{cursor}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
