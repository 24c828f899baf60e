"""The board notebooks (notebooks/*.py, jupytext percent format, paired with .ipynb) executed end to end
against the simulated board, as a user without a board runs them; cells tagged ``board-only`` are left out.
A cell that raises fails the test (the notebooks assert that the accelerator equals the bit-exact model)."""

from __future__ import annotations

import os
from pathlib import Path

import jupytext
import nbclient
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))


def _source(cell) -> str:
    return cell.source if isinstance(cell.source, str) else "".join(cell.source)


def test_every_notebook_is_paired_and_in_sync():
    """The reviewable text (.py) and the .ipynb hold the same cells with the same tags."""
    assert [p.stem for p in NOTEBOOKS] == sorted(["adapt_on_board", "energy", "train_mnist_on_board"])
    for py in NOTEBOOKS:
        ipynb = py.with_suffix(".ipynb")
        assert ipynb.is_file(), f"{ipynb.name} missing: run `jupytext --sync {py.relative_to(ROOT)}`"
        a, b = jupytext.read(py), jupytext.read(ipynb)
        assert [(c.cell_type, _source(c), sorted(c.metadata.get("tags", []))) for c in a.cells] == \
               [(c.cell_type, _source(c), sorted(c.metadata.get("tags", []))) for c in b.cells], \
               f"{py.name} and {ipynb.name} differ: run `jupytext --sync {py.relative_to(ROOT)}`"
        assert any("board-only" in c.metadata.get("tags", []) for c in a.cells), py.name


@pytest.mark.notebooks
@pytest.mark.parametrize("name", [p.stem for p in NOTEBOOKS])
def test_notebook_runs_on_the_simulated_board(name, tmp_path, monkeypatch):
    nb = jupytext.read(ROOT / "notebooks" / f"{name}.py")
    nb.cells = [c for c in nb.cells if "board-only" not in c.metadata.get("tags", [])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(nb, timeout=3600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    out = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    if name == "train_mnist_on_board":
        assert "every one equal to the bit-exact model" in out and "equal to the bit-exact model's" in out
    elif name == "adapt_on_board":
        assert "adaptation steps on chip, every one equal to the bit-exact model" in out and "after adapting" in out
    else:
        assert "synthetic power log" in out
