"""``xnortrain train``: help, output paths checked first, --arith hw optimisers, exit 130, checkpoints, --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from host.cli import main
from sim.train_loop import History, load_checkpoint

ROOT = Path(__file__).resolve().parents[2]

TINY = """\
preset = "mlp"
name = "tiny"
[model]
layers = [{ type = "dense", units = 16 }, { type = "dense", units = 10 }]
[data]
train_limit = 240
test_limit = 60
dev_size = 40
[train]
batch_size = 20
epochs = EPOCHS
[train.lr]
patience = 1
[e2train]
smd_prob = 0.2
"""


def tiny_config(tmp_path: Path, epochs: int = 3) -> str:
    path = tmp_path / f"tiny{epochs}.toml"
    path.write_text(TINY.replace("EPOCHS", str(epochs)))
    return str(path)


def test_help_says_what_train_does(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in ("Train on the generated accelerator: --target sim (the default off a board)",
                 "the accelerator's infer command", "--arith float trains the NumPy float reference",
                 "integer model alone", "--check-every K", "--bitstream BIT",
                 "'mlp' preset (configs/mlp_mnist.toml)", "exit status 130", "--resume FILE", "bit-identically",
                 "results/<config name>-<float|hw|sim|board>.ckpt.npz", "adam has no hardware equivalent"):
        assert text in out, text


@pytest.fixture
def no_training(monkeypatch):
    """run_training replaced: records what it was given, trains nothing."""
    import sim.train_loop

    calls = []

    def fake(cfg, engine, data=None, **kw):
        calls.append((cfg, engine, kw))
        return History(meta={"stopped": "finished"})

    monkeypatch.setattr(sim.train_loop, "run_training", fake)
    return calls


def _bad_paths(tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    t = str(tmp_path)
    return [
        (["--json", f"{t}/adir"], f"--json {t}/adir: is a folder"),
        (["--json", f"{t}/afile/h.json"], f"--json {t}/afile/h.json: {t}/afile is not a folder"),
        (["--plot", f"{t}/afile/sub/c.png"], f"--plot {t}/afile/sub/c.png: {t}/afile is not a folder"),
        (["--plot", f"{t}/curves"], f"--plot {t}/curves: the file is written as PNG; give a name ending in .png"),
        (["--plot", f"{t}/curves.pdf"], "give a name ending in .png"),
        (["--checkpoint", f"{t}/adir"], f"--checkpoint {t}/adir: is a folder"),
        (["--json", f"{t}/h.json", "--checkpoint", f"{t}/h.json"], "--json and --checkpoint name the same file"),
        (["--json", f"{t}/adir/h.json", "--no-checkpoint"], None),  # fine: reaches training
        (["--json", f"{t}/new/sub/h.json", "--plot", f"{t}/new/c.png"], None),  # missing folders are created
    ]


def test_output_paths_are_checked_before_training(tmp_path, capsys, no_training):
    cfg = tiny_config(tmp_path)
    for extra, msg in _bad_paths(tmp_path):
        rc = main(["train", "--config", cfg, "--arith", "float", "--no-progress", *extra])
        cap = capsys.readouterr()
        if msg is None:
            assert rc == 0 and no_training
            continue
        err = cap.err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and msg in err[0], (extra, cap.err)
        assert not no_training and "training" not in cap.out
    assert (tmp_path / "new" / "sub").is_dir() and not list(tmp_path.rglob("*.tmp"))


def test_unwritable_folder_is_refused(tmp_path, capsys, monkeypatch, no_training):
    cfg = tiny_config(tmp_path)
    target = tmp_path / "ro"
    target.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == target else real(p, mode))
    assert main(["train", "--config", cfg, "--arith", "float", "--json", str(target / "h.json")]) == 2
    assert f"folder {target} is not writable" in capsys.readouterr().err and not no_training
    assert main(["train", "--config", cfg, "--arith", "float", "--checkpoint", str(target / "a" / "b" / "c.npz")]) == 2
    assert f"folder {target} is not writable" in capsys.readouterr().err and not no_training
    assert not (target / "a").exists()


def test_default_checkpoint_locations(tmp_path, monkeypatch, capsys, no_training):
    cfg = tiny_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", cfg, "--arith", "hw"]) == 0
    assert no_training[-1][2]["state_file"] == Path("results/tiny-hw.ckpt.npz") and Path("results").is_dir()
    assert main(["train", "--config", cfg, "--arith", "float", "--json", "h.json"]) == 0
    assert no_training[-1][2]["state_file"] == Path("h.ckpt.npz")
    assert "checkpoint: h.ckpt.npz" in capsys.readouterr().out
    assert main(["train", "--config", cfg, "--arith", "float", "--no-checkpoint"]) == 0
    assert no_training[-1][2]["state_file"] is None


@pytest.mark.parametrize("opt,hw", [("switch", "switch"), ("bop", "bop"), ("iir", "iir"), ("sgdm", "sgd")])
def test_arith_hw_optimizer_selects_the_hardware_optimiser(opt, hw, tmp_path, capsys, no_training):
    assert main(["train", "--config", tiny_config(tmp_path), "--arith", "hw", "--optimizer", opt,
                 "--no-checkpoint"]) == 0
    cfg, engine, _ = no_training[-1]
    assert cfg.hw.optimizer == hw and engine.name == "hw" and engine.model.h.optimizer == hw
    assert f"hw optimizer {hw}" in capsys.readouterr().out
    if opt == "sgdm":
        assert cfg.hw.sgd_momentum_shift > 0 and "m" in engine.model.opt


def test_arith_hw_optimizer_without_hardware_equivalent_is_refused(tmp_path, capsys, no_training):
    cfg = tiny_config(tmp_path)
    assert main(["train", "--config", cfg, "--arith", "hw", "--optimizer", "adam"]) == 2
    err = capsys.readouterr().err
    assert "--optimizer adam has no hardware equivalent with --arith hw" in err and len(err.splitlines()) == 1
    assert main(["train", "--config", cfg, "--arith", "hw", "--optimizer", "sgdm",
                 "--set", "hw.sgd_momentum_shift=0"]) == 2
    assert "hw.sgd_momentum_shift = 0" in capsys.readouterr().err
    # --set comes after the shortcut and wins; the float optimiser is untouched by --arith hw defaults
    assert main(["train", "--config", cfg, "--arith", "hw", "--optimizer", "bop", "--set", "hw.optimizer=iir",
                 "--no-checkpoint"]) == 0
    assert no_training[-1][0].hw.optimizer == "iir"
    assert main(["train", "--config", cfg, "--arith", "float", "--optimizer", "adam", "--no-checkpoint"]) == 0
    assert no_training[-1][1].name == "reference"
    assert not any(c[1].name == "hw" and c[0].optimizer.name == "adam" for c in no_training)


def _history(path):
    d = json.loads(Path(path).read_text())
    d.pop("seconds")
    for k in ("resumed", "signal", "outputs", "checkpoint"):  # the runs' own files differ
        d["meta"].pop(k, None)
    return d


@pytest.mark.parametrize("arith", ["hw", "float"])
def test_interrupted_train_exits_130_and_resume_continues_identically(arith, tmp_path, capsys, monkeypatch):
    cfg = tiny_config(tmp_path)
    full = tmp_path / "full.json"
    assert main(["train", "--config", cfg, "--arith", arith, "--json", str(full), "--no-progress"]) == 0
    capsys.readouterr()

    from sim.hw.engine import HwEngine
    from sim.reference.engine import ReferenceEngine

    cls = HwEngine if arith == "hw" else ReferenceEngine
    original = cls.train_step
    calls = [0]

    def train_step(self, *a, **k):
        calls[0] += 1
        if calls[0] == 12:
            raise KeyboardInterrupt
        return original(self, *a, **k)

    monkeypatch.setattr(cls, "train_step", train_step)
    part = tmp_path / "part.json"
    assert main(["train", "--config", cfg, "--arith", arith, "--json", str(part), "--no-progress"]) == 130
    out = capsys.readouterr().out
    ck = tmp_path / "part.ckpt.npz"
    assert f"interrupted (KeyboardInterrupt) after 11 steps; training state saved to {ck}" in out
    assert f"continue with: xnortrain train --resume {ck}" in out
    monkeypatch.undo()
    assert load_checkpoint(ck).step == 11

    assert main(["train", "--resume", str(ck), "--json", str(part), "--no-progress"]) == 0
    assert "resuming from" in capsys.readouterr().out
    assert _history(part) == _history(full)
    assert load_checkpoint(ck).stopped == "finished"


def test_resume_with_another_configuration_is_refused(tmp_path, capsys):
    cfg = tiny_config(tmp_path)
    js = tmp_path / "h.json"
    assert main(["train", "--config", cfg, "--arith", "hw", "--max-steps", "2", "--json", str(js),
                 "--no-progress"]) == 0
    ck = str(tmp_path / "h.ckpt.npz")
    capsys.readouterr()
    assert main(["train", "--resume", ck, "--config", cfg, "--arith", "hw", "--seed", "5"]) == 2
    err = capsys.readouterr().err
    assert "train.seed = 5 differs from the checkpoint's 0" in err and len(err.splitlines()) == 1
    # options alone are compared with the checkpoint's configuration, not with the default preset
    assert main(["train", "--resume", ck, "--set", "data.dev_size=30"]) == 2
    err = capsys.readouterr().err
    assert "data.dev_size = 30 differs from the checkpoint's 40" in err and "name" not in err
    assert main(["train", "--resume", ck, "--arith", "float"]) == 2
    assert f"--arith float: {ck} was written with --arith hw" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nope.npz")]) == 2
    assert "no such checkpoint file" in capsys.readouterr().err
    # the same options again are accepted (and the finished run has nothing left to do)
    assert main(["train", "--resume", ck, "--config", cfg, "--arith", "hw", "--max-steps", "2",
                 "--no-progress"]) == 0
    assert "nothing to resume" in capsys.readouterr().out


def test_sigterm_leaves_a_resumable_checkpoint_and_exit_130(tmp_path):
    cfg = tiny_config(tmp_path, epochs=500)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "host.cli", "train", "--config", cfg, "--arith", "hw", "--no-progress"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        for line in proc.stdout:
            if line.startswith("epoch   2/"):
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    ck = tmp_path / "results" / "tiny-hw.ckpt.npz"
    assert "interrupted (SIGTERM)" in out and f"xnortrain train --resume {Path('results/tiny-hw.ckpt.npz')}" in out
    saved = load_checkpoint(ck)
    assert saved.stopped == "interrupted" and saved.meta["history"]["meta"]["signal"] == "SIGTERM"
    assert saved.step == saved.meta["history"]["meta"]["total_steps"] >= sum(saved.meta["history"]["steps"])
    from sim.hw.engine import HwEngine

    eng = HwEngine(saved.config)
    eng.load_state_dict(saved.engine_state)  # validated whole
    assert int(eng.state_dict()["steps"]) == saved.step
    assert not list(tmp_path.rglob("*.tmp"))


def test_target_options_that_do_not_fit_together_are_refused(tmp_path, capsys, no_training):
    cfg = tiny_config(tmp_path)
    for argv, msg in [
        (["--arith", "float", "--eval-every", "-1"], "--eval-every -1: must be >= 0"),
        (["--target", "sim", "--check-every", "-2"], "--check-every -2: must be >= 0"),
        (["--target", "model", "--check-every", "5"], "--target model has no accelerator"),
        (["--arith", "float", "--target", "sim"], "--target sim: --arith float"),
        (["--target", "sim", "--bitstream", "x.bit"], "--bitstream is for --target board"),
        (["--target", "board", "--bitstream", str(tmp_path / "nope.bit")], "nope.bit: no such file"),
    ]:
        assert main(["train", "--config", cfg, "--no-checkpoint", *argv]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], (argv, err)
        assert not no_training


def test_resume_with_epochs_continues_the_same_run(tmp_path, capsys):
    cfg = tiny_config(tmp_path, epochs=1)
    js = tmp_path / "h.json"
    assert main(["train", "--config", cfg, "--arith", "hw", "--json", str(js), "--no-progress"]) == 0
    ck = tmp_path / "h.ckpt.npz"
    first = load_checkpoint(ck)
    assert first.stopped == "finished" and len(first.meta["history"]["epoch"]) == 1
    capsys.readouterr()
    assert main(["train", "--resume", str(ck), "--epochs", "2", "--json", str(js), "--no-progress"]) == 0
    assert "nothing to resume" not in capsys.readouterr().out
    after = load_checkpoint(ck)
    assert after.meta["history"]["epoch"] == [1, 2] and after.step == 2 * first.step
    assert after.config.train.epochs == 2 and json.loads(js.read_text())["epoch"] == [1, 2]
    assert main(["train", "--resume", str(ck), "--epochs", "1", "--no-progress"]) == 2
    assert "train.epochs = 1, but the run already finished 2 epochs" in capsys.readouterr().err


def test_outputs_of_an_earlier_run_are_refused_unless_force_or_resume(tmp_path, capsys):
    cfg = tiny_config(tmp_path, epochs=1)
    js, png = tmp_path / "h.json", tmp_path / "h.png"
    base = ["train", "--config", cfg, "--arith", "hw", "--no-progress"]
    assert main([*base, "--json", str(js), "--plot", str(png)]) == 0
    before = {p: p.read_bytes() for p in (js, png, tmp_path / "h.ckpt.npz")}
    capsys.readouterr()
    for extra, option in ((["--json", str(js)], "--json"), (["--json", str(tmp_path / "o.json"), "--plot", str(png)],
                                                           "--plot"),
                          (["--checkpoint", str(tmp_path / "h.ckpt.npz")], "--checkpoint")):
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{option} " in err[0] and "holds an earlier run's results" in err[0], err
    assert {p: p.read_bytes() for p in before} == before  # nothing of the earlier run was touched
    # --resume names that run: its --json and --plot may be rewritten; --force overwrites
    assert main(["train", "--resume", str(tmp_path / "h.ckpt.npz"), "--epochs", "2", "--json", str(js),
                 "--plot", str(png), "--no-progress"]) == 0
    assert json.loads(js.read_text())["epoch"] == [1, 2]
    assert main([*base, "--json", str(js), "--force"]) == 0
    assert json.loads(js.read_text())["epoch"] == [1]


def test_the_continue_command_is_whole_and_continues_the_same_outputs(tmp_path, capsys, monkeypatch):
    import shlex

    from sim.hw.engine import HwEngine

    cfg = tiny_config(tmp_path, epochs=2)
    original, calls = HwEngine.train_step, [0]

    def train_step(self, *a, **k):
        calls[0] += 1
        if calls[0] == 11:  # in the second epoch
            raise KeyboardInterrupt
        return original(self, *a, **k)

    monkeypatch.setattr(HwEngine, "train_step", train_step)
    js, png = tmp_path / "out dir" / "h.json", tmp_path / "out dir" / "h.png"
    assert main(["train", "--config", cfg, "--target", "model", "--eval-every", "4", "--json", str(js),
                 "--plot", str(png), "--no-progress"]) == 130
    line = next(x for x in capsys.readouterr().out.splitlines() if "continue with:" in x)
    argv = shlex.split(line.split("continue with: ", 1)[1])
    assert argv[:2] == ["xnortrain", "train"]
    for option, value in (("--json", str(js)), ("--plot", str(png)), ("--eval-every", "4"), ("--target", "model"),
                          ("--resume", str(js.with_suffix(".ckpt.npz")))):
        assert argv[argv.index(option) + 1] == value, option
    monkeypatch.undo()
    assert main(argv[1:]) == 0
    hist = json.loads(js.read_text())
    assert hist["meta"]["stopped"] == "finished" and hist["epoch"] == [1, 2] and png.is_file()


def test_output_paths_of_every_command_are_checked_against_each_other(tmp_path, capsys):
    t = tmp_path
    (t / "p.csv").write_text("time,power\n0,1\n")
    (t / "s.jsonl").write_text("")
    (t / "c.toml").write_text(TINY.replace("EPOCHS", "1"))
    for argv, msg in [
        (["explore", "--write", f"{t}/B.toml", "--json", f"{t}/B.toml"], "--write and --json name the same file"),
        (["explore", "--png", f"{t}/x/../B.png", "--write", f"{t}/B.png"], "--write and --png name the same file"),
        (["energy-measure", "--power", f"{t}/p.csv", "--steps", f"{t}/s.jsonl", "--json", f"{t}/p.csv"],
         "--json " + f"{t}/p.csv is the --power input"),
        (["memory", "--config", f"{t}/c.toml", "--json", f"{t}/c.toml"], "is the --config input"),
        (["train", "--json", f"{t}/h.json", "--plot", f"{t}/h.json"], "the file is written as PNG"),
        (["train", "--config", f"{t}/c.toml", "--json", f"{t}/c.toml"], "is the --config input"),
        (["train", "--no-checkpoint", "--checkpoint", f"{t}/c.npz"], "--no-checkpoint and --checkpoint"),
        (["generate", "--no-synth", "--synth-by-unit", "--out", f"{t}/g"], "--synth-by-unit and --no-synth"),
        (["train", "--set", "name=../../escape", "--target", "model"], "name = '../../escape'"),
        (["config", "--set", "name=a/b"], "name = 'a/b'"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], (argv, err)
    assert not (t / "B.toml").exists() and not (t / "g").exists()


def test_training_data_are_checked_before_the_simulator_is_built(tmp_path, capsys, monkeypatch):
    import host.simboard

    def build(*a, **k):
        raise AssertionError("the simulator was built before the data were checked")

    monkeypatch.setattr(host.simboard.SimBoard, "build", classmethod(build))
    (tmp_path / "empty").mkdir()
    assert main(["train", "--config", tiny_config(tmp_path), "--target", "sim", "--no-checkpoint",
                 "--set", f"data.path={tmp_path / 'empty'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path / "empty") in err[0], err


def test_a_configuration_file_with_a_byte_order_mark_or_binary_content(tmp_path, capsys):
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + TINY.replace("EPOCHS", "1").encode())
    assert main(["config", "--config", str(bom)]) == 0 and 'name = "tiny"' in capsys.readouterr().out
    for name, data, msg in (("bin.toml", b"\x00\x01\x02PK", "a binary file"),
                            ("latin.toml", 'name = "caf\xe9"\n'.encode("latin-1"), "not a UTF-8 text file")):
        (tmp_path / name).write_bytes(data)
        assert main(["config", "--config", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and name in err[0] and msg in err[0], err


def test_a_network_too_large_for_memory_and_a_float_batch_of_one_are_refused(tmp_path, capsys, no_training,
                                                                            monkeypatch):
    import host.cli

    monkeypatch.setattr(host.cli, "_available_memory", lambda: 1 << 29)  # a machine with 0.5 GiB free
    cfg = tiny_config(tmp_path)
    huge = 'model.layers=[{type="dense",units=16384},{type="dense",units=10}]'  # 784 x 16384: about 1 GiB
    for argv, msg in ((["--target", "model", "--set", huge], "model.layers[0] (dense) needs about"),
                      (["--arith", "float", "--set", huge], "0.5 GiB available"),
                      (["--arith", "float", "--batch-size", "1"], "train.batch_size = 1: the float reference")):
        assert main(["train", "--config", cfg, "--no-checkpoint", *argv]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], (argv, err)
    assert not no_training


def test_float_only_settings_with_the_hardware_arithmetic_are_refused_or_mapped(tmp_path, capsys, no_training):
    cfg = tiny_config(tmp_path)
    for sets, msg in ((["--scheme", "standard"], "approx.scheme = 'standard' (--scheme) does nothing"),
                      (["--set", "approx.bn=l2"], "approx.bn = 'l2' does nothing"),
                      (["--set", "approx.bn_eps=0.001"], "approx.bn_eps = 0.001 does nothing"),
                      (["--set", "approx.storage=float32"], "approx.storage = 'float32' does nothing"),
                      (["--set", "e2train.psg=true"], "e2train.psg = True does nothing"),
                      (["--set", "optimizer.clip=0.5"], "optimizer.clip = 0.5 does nothing"),
                      (["--set", "approx.bn_momentum=0.3"], "approx.bn_momentum = 0.3: its hardware twin "
                                                             "hw.running_shift holds a rate 2**-s"),
                      (["--set", "optimizer.switch.lam=0.3", "--set", "hw.switch_lambda=0.2"], "contradict")):
        for target in ("model", "sim"):
            assert main(["train", "--config", cfg, "--target", target, "--no-checkpoint", *sets]) == 2, sets
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and msg in err[0], (sets, err)
    assert not no_training
    for sets, field, value in ((["--set", "optimizer.switch.lam=0.3"], "switch_lambda", 0.3),
                               (["--set", "approx.bn_momentum=0.25"], "running_shift", 2),
                               (["--set", "optimizer.sgdm.momentum=0.75"], "sgd_momentum_shift", 2)):
        assert main(["train", "--config", cfg, "--target", "model", "--no-checkpoint", *sets]) == 0, sets
        assert getattr(no_training[-1][0].hw, field) == value
    # the float reference takes them all
    assert main(["train", "--config", cfg, "--arith", "float", "--no-checkpoint", "--scheme", "standard",
                 "--set", "optimizer.clip=0.5", "--set", "approx.bn=l2"]) == 0
