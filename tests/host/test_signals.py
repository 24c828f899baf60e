"""Signals at any time leave a loadable checkpoint or say plainly that nothing was saved: a second signal during a
save, a second signal during the first step on an engine that keeps no per-step snapshot (the accelerator), SIGTERM
during the simulator build (the tools it started are stopped with it: a fake slow build stands in for Verilator),
and a second run on the same outputs refused while the first finishes untouched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from host.cli import main
from sim.train_loop import load_checkpoint
from tests.host.test_train_cli import tiny_config

ROOT = Path(__file__).resolve().parents[2]



def tiny(tmp_path: Path, epochs: int = 2) -> str:
    return tiny_config(tmp_path, epochs)


def test_more_signals_during_the_final_save_leave_a_loadable_checkpoint(tmp_path, monkeypatch, capsys):
    import sim.train_loop as tl
    from sim.hw.engine import HwEngine

    real_save, real_step = tl.save_checkpoint, HwEngine.train_step
    steps = [0]

    def train_step(self, *a, **k):
        steps[0] += 1
        if steps[0] == 3:  # Ctrl-C: the run stops after this step and saves
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, *a, **k)

    def save(path, ckpt):  # two more while the state is written
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        return real_save(path, ckpt)

    monkeypatch.setattr(HwEngine, "train_step", train_step)
    monkeypatch.setattr(tl, "save_checkpoint", save)
    js = tmp_path / "h.json"
    rc = main(["train", "--config", tiny(tmp_path), "--target", "model", "--json", str(js), "--no-progress"])
    out = capsys.readouterr().out
    ck = tmp_path / "h.ckpt.npz"
    assert rc == 130 and f"training state saved to {ck}" in out
    saved = load_checkpoint(ck)
    hist = json.loads(js.read_text())
    assert saved.stopped == "interrupted" and saved.step == 3
    assert hist["meta"]["checkpoint"] == {"path": str(ck), "step": 3}


def test_a_second_signal_in_the_first_accelerator_step_says_nothing_was_saved(tmp_path, monkeypatch, capsys):
    from sim.hw.engine import HwEngine

    original = HwEngine.train_step

    def train_step(self, *a, **k):  # the cut happens inside the step, as on the simulated board
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        return original(self, *a, **k)

    monkeypatch.setattr(HwEngine, "step_snapshot", False, raising=False)  # as the accelerator engine: no rollback
    monkeypatch.setattr(HwEngine, "train_step", train_step)
    js = tmp_path / "h.json"
    rc = main(["train", "--config", tiny(tmp_path), "--target", "model", "--json", str(js), "--no-progress"])
    out = capsys.readouterr().out
    ck = tmp_path / "h.ckpt.npz"
    assert rc == 130 and not ck.exists()
    assert "nothing was saved" in out and "training state saved" not in out and "continue with" not in out
    assert json.loads(js.read_text())["meta"]["checkpoint"] is None


FAKE_BUILD = """\
import sys
from pathlib import Path

import host.simboard as sb
from host.cli import main


def build(cfg, *, log=None, **kw):
    folder = Path(sys.argv[1])
    # a slow "build": a shell (the tool) that starts a long child (its compiler job) and waits
    sb._run(["sh", "-c", "sleep 300 & echo $! > child.pid; wait"], dict(__import__("os").environ), folder,
            "verilator")


sb.SimBoard.build = classmethod(lambda cls, cfg, **kw: build(cfg, **kw))
sys.exit(main(["train", "--config", sys.argv[2], "--target", "sim", "--no-progress", "--json",
               str(Path(sys.argv[1]) / "h.json")]))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def _sigterm_during_a_build(tmp_path: Path, fake: str) -> tuple[str, str]:
    """Run ``fake`` (argv: the folder, a tiny configuration), wait until its build's child process runs, send
    SIGTERM; the command must exit 130 and leave no child behind. Returns its stdout and stderr."""
    script = tmp_path / "fake_build.py"
    script.write_text(textwrap.dedent(fake))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-u", str(script), str(tmp_path), tiny(tmp_path)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pidfile = tmp_path / "child.pid"
    child = None
    try:
        for _ in range(1200):  # the build's child has started (up to 120 s on a loaded machine: verify elaborates)
            if pidfile.exists() and pidfile.read_text().strip():
                child = int(pidfile.read_text())
                break
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        assert child is not None and _alive(child), proc.stderr.read() if proc.poll() is not None else "no child"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        # the command's last act is a SIGKILL to the build's process group; on a loaded machine the child may take a
        # moment to be scheduled and exit after that, so it gets a few seconds (a child nobody killed sleeps 300 s)
        for _ in range(50):
            if child is None or not _alive(child):
                break
            time.sleep(0.1)
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
            pytest.fail("the build's child process outlived the command")
    assert proc.returncode == 130, err
    return out, err


def test_sigterm_during_the_simulator_build_stops_its_tools_and_exits_130(tmp_path):
    _, err = _sigterm_during_a_build(tmp_path, FAKE_BUILD)
    assert "interrupted before training started" in err and "nothing was saved" in err
    assert not (tmp_path / "h.json").exists() and not (tmp_path / "h.ckpt.npz").exists()


FAKE_COCOTB_BUILD = """
import sys
from pathlib import Path

import os

import cocotb_tools.runner as runner
from host.cli import main

folder = Path(sys.argv[1])
# cocotb's Verilator build stands in as a tool (a shell) that starts a long child (its compiler job) and waits
runner.Verilator._build_command = lambda self: [["sh", "-c", f"sleep 300 & echo $! > {folder}/child.pid; wait"]]
os.environ["XNORTRAIN_BUILD_DIR"] = str(folder / "build")  # a fresh build, never a cached one
sys.exit(main(["verify", "--config", sys.argv[2], "--steps", "1"]))
"""


def test_sigterm_during_verifys_cocotb_build_stops_its_tools_and_exits_130(tmp_path):
    _sigterm_during_a_build(tmp_path, FAKE_COCOTB_BUILD)


def test_a_second_run_on_the_same_outputs_is_refused_and_the_first_finishes(tmp_path, capsys):
    cfg = tiny(tmp_path, epochs=500)
    js = tmp_path / "h.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-u", "-m", "host.cli", "train", "--config", cfg, "--target", "model",
                             "--json", str(js), "--no-progress"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("epoch   1/"):
                break
        # the same --json (and so the same default checkpoint): refused at once, whatever --force says
        assert main(["train", "--config", cfg, "--target", "model", "--json", str(js), "--force"]) == 2
        err = capsys.readouterr().err
        assert "another xnortrain run is writing it" in err and len(err.strip().splitlines()) == 1
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    saved = load_checkpoint(tmp_path / "h.ckpt.npz")
    hist = json.loads(js.read_text())
    assert saved.stopped == hist["meta"]["stopped"] == "interrupted"
    assert hist["meta"]["checkpoint"]["step"] == saved.step
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))
