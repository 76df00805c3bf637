"""A file a command was asked to write beside what it prints (``compare --gate``'s ``--junit``
and ``--markdown``, ``history --html``): its missing parent folders made (a fresh CI workspace
has no ``reports/``), written whole through a temporary file and a rename (a CI step never picks
up half a file), and a path that cannot be written refused with an error naming it."""

from __future__ import annotations

import contextlib
import os

# exit code of ``compare --gate`` and ``history`` when an output asked for could not be written:
# ``replayer run``'s code for results it could not write (a gate that regressed, 7, or could not
# compare, 2, keeps its own code, which a CI job acts on first)
from replayer.record.rolling import EXIT_WRITE_FAILED as EXIT_WRITE_FAILED


class OutputError(OSError):
    """An output file that could not be written; the message names it and why."""


def write_text(path: str, text: str, what: str = "output") -> None:
    """Write ``text`` to ``path``, making its parent folders. Raises ``OutputError`` naming
    ``path`` (a folder, a parent that is a file, no permission, a full disk)."""
    if os.path.isdir(path):
        raise OutputError(f"{path}: cannot write the {what} there: it is a folder (name a file)")
    parent = os.path.dirname(path)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp")
    try:
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise OutputError(f"{path}: cannot write the {what}: {e.strerror or e}") from None
