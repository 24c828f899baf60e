"""The import layers (pyproject [tool.importlinter], `make lint`): kept by the tree, and a broken one is reported.

The check runs on a copy of the source packages, so that one import can be planted without touching the tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "rtl_gen", "host", "boards", "tb", "benchmarks", "notebooks")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _copy(dest: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__", "data", "*.ipynb"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=folder, capture_output=True, text=True, check=False)


def test_the_layers_hold_and_a_planted_import_breaks_them(tmp_path):
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS}: import-linter (the dev extra, make setup) is missing"
    tree = _copy(tmp_path)
    ok = _lint(tree)
    assert ok.returncode == 0, ok.stdout[-2000:]
    # the generator reaching into the host again (what host_interface.py once did)
    target = tree / "rtl_gen" / "plan.py"
    target.write_text(target.read_text() + "\nfrom host.driver import Driver  # noqa\n")
    bad = _lint(tree)
    assert bad.returncode != 0
    assert "the generator (rtl_gen/) does not import the host or the testbenches BROKEN" in " ".join(bad.stdout.split())
    assert "rtl_gen.plan -> host.driver" in bad.stdout
