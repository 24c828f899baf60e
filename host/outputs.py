"""The files a command writes: checked against each other and against its inputs before any work, refused when
they hold an earlier run's results (unless ``--force``, or ``--resume`` names that run), and locked while a run
writes them, so a second run naming the same files is refused at its start and the first finishes untouched.
Writing itself is atomic (:func:`sim.train_loop.atomic_write`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from host.common import UserError

__all__ = ["check_distinct", "refuse_existing", "OutputLock", "lock_path", "same_file"]


def _key(path: str | os.PathLike) -> Path:
    return Path(os.path.abspath(os.path.expanduser(str(path)))).resolve()


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two names reach one file (symbolic links and ``..`` followed; the file need not exist)."""
    return _key(a) == _key(b)


def check_distinct(outputs: Sequence[tuple[str, str | os.PathLike | None]],
                   inputs: Sequence[tuple[str, str | os.PathLike | None]] = (),
                   allow: Iterable[tuple[str, str]] = ()) -> None:
    """Refuse two outputs naming one file, and an output naming one of the inputs (``allow``: pairs of option
    names that may share a file, e.g. ``("--checkpoint", "--resume")``)."""
    allowed = {frozenset(p) for p in allow}
    outs = [(o, p) for o, p in outputs if p not in (None, "")]
    ins = [(o, p) for o, p in inputs if p not in (None, "")]
    for i, (o1, p1) in enumerate(outs):
        for o2, p2 in outs[i + 1:]:
            if same_file(p1, p2) and frozenset((o1, o2)) not in allowed:
                raise UserError(f"{o1} and {o2} name the same file {p1}; give each output its own file")
        for o2, p2 in ins:
            if same_file(p1, p2) and frozenset((o1, o2)) not in allowed:
                raise UserError(f"{o1} {p1} is the {o2} input: writing it would destroy the input")


def refuse_existing(outputs: Sequence[tuple[str, str | os.PathLike | None]], *, force: bool,
                    allowed: Iterable[str | os.PathLike] = (), hint: str = "--force") -> None:
    """Refuse an output file that already holds something (an earlier run's results) unless ``force``;
    ``allowed``: files this run may rewrite (the outputs of the run ``--resume`` continues)."""
    if force:
        return
    keep = {_key(p) for p in allowed if p}
    for option, path in outputs:
        if path in (None, ""):
            continue
        p = Path(path)
        if p.is_file() and p.stat().st_size > 0 and _key(p) not in keep:
            raise UserError(f"{option} {path}: holds an earlier run's results; give another file, {hint} to "
                            "overwrite it, or --resume that run's checkpoint to continue it")


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of an output: ``.<name>.lock`` beside it (removed when the run ends)."""
    p = Path(path)
    return p.with_name(f".{p.name}.lock")


class OutputLock:
    """Exclusive locks (``filelock``) on a run's output files, taken without waiting: an output another run
    holds is a :class:`UserError` naming it. Use as a context manager; released when the run ends, however."""

    def __init__(self, outputs: Sequence[tuple[str, str | os.PathLike | None]]):
        self.outputs = [(o, Path(p)) for o, p in outputs if p not in (None, "")]
        self._locks: list = []

    def __enter__(self) -> OutputLock:
        from filelock import FileLock, Timeout

        seen: set[Path] = set()
        try:
            for option, path in self.outputs:
                key = _key(path)
                if key in seen:
                    continue
                seen.add(key)
                path.parent.mkdir(parents=True, exist_ok=True)
                lock = FileLock(str(lock_path(key)), timeout=0)
                try:
                    lock.acquire()
                except Timeout:
                    raise UserError(f"{option} {path}: another xnortrain run is writing it (lock {lock_path(path)}); "
                                    "wait for that run to end or give another file") from None
                self._locks.append(lock)
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        while self._locks:
            self._locks.pop().release()

    def __exit__(self, *exc) -> None:
        self.release()
