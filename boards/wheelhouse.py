"""The board wheelhouse (``make board-wheels``): what a PYNQ board without internet installs the host from.

``python -m boards.wheelhouse DIR`` writes into ``DIR`` the xnortrain wheel and the pure-Python wheels
(``py3-none-any``) of every dependency of ``xnortrain[board]`` as a board's Python 3.10 resolves them, and nothing
the board image already carries compiled: numpy, pynq, matplotlib and MarkupSafe (PyPI has no armv7l wheels of
them; on the PYNQ-Z1/Z2 images v3.0.1/v3.1 they come from apt or the pynq venv). On the board::

    pip install --no-index --find-links DIR 'xnortrain[board]'

installs it offline and leaves numpy and pynq as they are. A dependency that has no pure-Python wheel and is not
one of the image's packages stops the command naming it (it would need a compiler on the board).
"""

from __future__ import annotations

import argparse
import email.parser
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

__all__ = ["IMAGE_PACKAGES", "TARGET_ENV", "build_wheelhouse", "wheel_requirements"]

#: Compiled packages the PYNQ-Z1/Z2 images carry (Ubuntu 22.04: numpy 1.21.5, matplotlib 3.5.1, MarkupSafe 2.0.1;
#: pynq 3.0.1 / 3.1 in /usr/local/share/pynq-venv, built with --system-site-packages): never in the wheelhouse.
IMAGE_PACKAGES = frozenset({"numpy", "pynq", "matplotlib", "markupsafe"})

#: The marker environment of a PYNQ-Z1/Z2 image's Python (Ubuntu 22.04's 3.10 on the Cortex-A9).
TARGET_ENV = {
    "python_version": "3.10", "python_full_version": "3.10.12", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
    "platform_machine": "armv7l", "os_name": "posix",
}


class WheelhouseError(RuntimeError):
    """The wheelhouse cannot be made (one line)."""


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        if name is None:
            raise WheelhouseError(f"{wheel}: no METADATA in the wheel")
        return email.parser.Parser().parsestr(zf.read(name).decode())


def wheel_requirements(wheel: Path, extras=()) -> list[Requirement]:
    """The requirements of ``wheel`` that apply on the board with ``extras`` requested."""
    reqs = []
    for line in _metadata(wheel).get_all("Requires-Dist") or []:
        req = Requirement(line)
        envs = [{**TARGET_ENV, "extra": e} for e in (*extras, "")]
        if req.marker is None or any(req.marker.evaluate(env) for env in envs):
            reqs.append(req)
    return reqs


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        tail = " | ".join((run.stderr or run.stdout).strip().splitlines()[-3:])
        raise WheelhouseError(f"{' '.join(cmd[2:])} failed: {tail}")


def _clean_setuptools_build(source: Path) -> None:
    """setuptools builds in the source tree's build/lib and build/bdist.*; the rest of build/ is the project's."""
    import shutil

    for d in [source / "build" / "lib", *(source / "build").glob("bdist.*")]:
        shutil.rmtree(d, ignore_errors=True)


def build_wheelhouse(out: Path, source: Path, *, log=print) -> list[Path]:
    """Build the xnortrain wheel of ``source`` into ``out`` and download its pure-Python dependencies beside it.
    Returns the wheels written."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    _clean_setuptools_build(source)  # a stale build/lib would put files deleted since into the wheel
    try:
        _pip("wheel", "--no-deps", "-q", "-w", str(out), str(source))
    finally:
        _clean_setuptools_build(source)
    [own] = out.glob("xnortrain-*.whl")
    pure = ["--only-binary=:all:", "--platform", "any", "--implementation", "py", "--abi", "none",
            "--python-version", TARGET_ENV["python_version"]]
    todo = [(r, "xnortrain") for r in wheel_requirements(own, extras=("board",))]
    seen = {"xnortrain"}
    while todo:
        req, parent = todo.pop(0)
        name = canonicalize_name(req.name)
        if name in IMAGE_PACKAGES:
            log(f"  {req} ({parent}): from the board image, not in the wheelhouse")
            continue
        if name in seen:
            continue
        seen.add(name)
        before = set(out.glob("*.whl"))
        try:
            _pip("download", "--no-deps", "-q", "-d", str(out), *pure, str(Requirement(f"{req.name}{req.specifier}")))
        except WheelhouseError as e:
            raise WheelhouseError(f"{req} (needed by {parent}) has no pure-Python wheel for the board: {e}") from None
        [got] = set(out.glob("*.whl")) - before
        log(f"  {got.name}")
        todo += [(r, req.name) for r in wheel_requirements(got, extras=tuple(req.extras))]
    return sorted(out.glob("*.whl"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m boards.wheelhouse", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the wheelhouse folder (its old wheels are removed)")
    ap.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the xnortrain source tree (default: this one)")
    args = ap.parse_args(argv)
    try:
        wheels = build_wheelhouse(args.out, args.source)
    except WheelhouseError as e:
        print(f"board-wheels: {e}", file=sys.stderr)
        return 5
    print(f"board-wheels: {len(wheels)} wheels in {args.out}; on the board: "
          f"pip install --no-index --find-links {args.out} 'xnortrain[board]'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
