"""Property-based fuzzing (Hypothesis) of every subcommand's command line and input files: whatever the options,
values and files, a command ends with a documented exit status (0, 2 a usage/input error, 3 does not fit, 4 a
mismatch, 130 interrupted) and never with a traceback (status 1, an internal error).

Kept fast for the default suite: training runs the bit-exact model or the float reference on a tiny network for at
most two steps; the heavy parts of generate (elaboration, synthesis), verify (the Verilator build) and explore (the
search) are replaced by stubs once the command has checked its options and inputs. The number of examples per
command is ``XNORTRAIN_FUZZ_EXAMPLES`` (default 12); docs/results.md records one run with a large budget.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host.cli import main
from host.common import UserError
from tests.host.test_train_cli import TINY

EXAMPLES = int(os.environ.get("XNORTRAIN_FUZZ_EXAMPLES", "12"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("XNORTRAIN_FUZZ_RANDOM"),
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
DOCUMENTED = {0, 2, 3, 4, 130}

# a budget appended to every training command line: whatever was fuzzed before, the run stays tiny
BUDGET = ["--set", "data.train_limit=120", "--set", "data.test_limit=40", "--set", "train.max_steps=2",
          "--set", "train.eval_batch_size=40", "--no-progress"]


class Reached(UserError):
    """Raised by a stub where the heavy work would start: the command accepted its options and inputs."""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A folder of input files, good and bad, shared by the examples (each example writes in its own folder);
    pytest's temporary folders, so nothing is left in /tmp."""
    root = tmp_path_factory.mktemp("fuzz-inputs")
    f = {}

    def put(name, data):
        p = root / name
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        f[name] = str(p)

    tiny = TINY.replace("EPOCHS", "2")
    put("tiny.toml", tiny)
    put("bom.toml", "\ufeff" + tiny)
    put("binary.toml", b"\x00\x01\x02\xff" * 10)
    put("latin1.toml", 'name = "caf\xe9"\n'.encode("latin-1"))
    put("bad.toml", "model = [[[\n")
    put("wrongfield.toml", 'preset = "mlp"\n[train]\nepocs = 3\n')
    put("empty.toml", "")
    put("text.npz", "not a zip")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (150, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, 150)
    for name, arrays in {"good.npz": dict(x=x, y=y), "float.npz": dict(x=x / 255.0, y=y),
                         "onehot.npz": dict(x=x, y=np.eye(10)[y]), "short.npz": dict(x=x, y=y[:3]),
                         "neg.npz": dict(x=x, y=-y)}.items():
        np.savez(root / name, **arrays)
        f[name] = str(root / name)
    (root / "folder").mkdir()
    f["folder"] = str(root / "folder")
    f["missing"] = str(root / "missing.file")
    # energy-measure inputs: a power log and a step log, good and bad
    put("power.csv", "time,power\n" + "".join(f"{t / 10:.1f},{2 + (t % 3) * 0.1:.2f}\n" for t in range(100)))
    put("power_latin1.csv", "time,power\n0,1\n1,caf\xe9\n".encode("latin-1"))
    put("steps.jsonl", "".join(json.dumps({"step": i, "t_start": 1.0 + i, "t_end": 1.5 + i, "batch": 20,
                                           "cycles": 1000}) + "\n" for i in range(5)))
    put("steps_bad.jsonl", '{"step": 0, "t_start": "x"}\nnot json\n')
    # a checkpoint of a real tiny run, and damaged copies made by the examples
    run = root / "run"
    run.mkdir()
    assert main(["train", "--config", f["tiny.toml"], "--target", "model", "--checkpoint", str(run / "c.npz"),
                 *BUDGET]) == 0
    f["ckpt"] = str(run / "c.npz")
    # a run stopped inside its first epoch: a running epoch (position, accumulators, data order) to damage
    from sim.config import apply_overrides, load_config
    from sim.hw.engine import HwEngine
    from sim.train_loop import run_training

    class Cut(HwEngine):
        steps = 0

        def train_step(self, *a, **k):
            Cut.steps += 1
            if Cut.steps == 3:
                raise KeyboardInterrupt
            return super().train_step(*a, **k)

    cfg = apply_overrides(load_config(f["tiny.toml"]), ["data.train_limit=120", "data.test_limit=40",
                                                        "train.eval_batch_size=40"])
    run_training(cfg, Cut(cfg), progress=False, log=None, state_file=run / "mid.npz", handle_signals=False)
    f["mid"] = str(run / "mid.npz")
    f["report.json"] = str(root / "report.json")
    (root / "report.json").write_text('{"resources": {"LUT": "many"}}')
    return f


@pytest.fixture
def stubs(monkeypatch):
    import host.explore
    import host.generate
    import host.verify

    def reached(*a, **k):
        raise Reached("the command accepted its options and inputs")

    monkeypatch.setattr(host.generate, "check_memory_budget", reached)
    monkeypatch.setattr(host.explore, "explore", reached)
    monkeypatch.setattr(host.verify, "verify", reached)


def run(argv, capsys) -> int:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        rc = e.code
    cap = capsys.readouterr()
    assert rc in DOCUMENTED, (argv, rc, cap.err[-3000:])
    assert "Traceback" not in cap.err, (argv, cap.err[-3000:])
    return rc


# --- the strategies --------------------------------------------------------------------------------------------

NUMBERS = st.one_of(st.integers(-5, 300).map(str), st.sampled_from(["0", "-1", "1e9", "nan", "inf", "2.5", "x", "",
                                                                     "1_000", "0x10", " 3"]))
VALUES = st.one_of(NUMBERS, st.sampled_from(["true", "false", "[]", "[1, 2]", "{}", '"s"', "'../../x'", "a/b", "..",
                                             "l2", "l1", "float16", "po2", "bool", "switch", "bop", "sgd", "binary",
                                             "int8", '[{type="dense",units=16},{type="dense",units=10}]',
                                             '[{type="dense",units=0}]', "\x00", "ünï"]),
                   st.text(max_size=12))
KEYS = st.sampled_from([
    "name", "train.epochs", "train.batch_size", "train.seed", "train.loss", "train.lr.schedule", "train.lr.initial",
    "train.eval_batch_size", "data.dev_size", "data.dither", "data.path", "data.binarize_threshold",
    "model.layers", "model.num_classes", "approx.scheme", "approx.bn", "approx.bn_eps", "approx.bn_momentum",
    "approx.storage", "approx.dy_bits", "e2train.psg", "e2train.smd_prob", "optimizer.name", "optimizer.lr",
    "optimizer.clip", "optimizer.switch.lam", "optimizer.sgdm.momentum", "hw.optimizer", "hw.switch_cutoff",
    "hw.switch_lambda", "hw.running_shift", "hw.input", "hw.lanes_in", "hw.lanes_out", "hw.dw_window", "hw.nope",
    "nope", "train", "",
])
SETS = st.lists(st.tuples(KEYS, VALUES).map(lambda kv: ["--set", f"{kv[0]}={kv[1]}"]), max_size=3).map(
    lambda sets: [a for s in sets for a in s])


def flat(parts):
    return [a for p in parts for a in p]


def config_source(files):
    return st.one_of(st.just([]), st.sampled_from(["tiny.toml", "bom.toml", "binary.toml", "latin1.toml", "bad.toml",
                                                   "wrongfield.toml", "empty.toml", "folder", "missing"]).map(
        lambda n: ["--config", files[n]]), st.sampled_from(["mlp", "cnv", "nope"]).map(lambda m: ["--model", m]))


def out_path(where: Path):
    """An output path: new, nested, an existing folder, under a file, the same as another output."""
    return st.sampled_from(["new.json", "sub/deep/o.json", ".", "infile/x.json", "o.png", "o.toml", "same"]).map(
        lambda n: str(where / n) if n != "." else str(where))


def option(name, values):
    return st.one_of(st.just([]), values.map(lambda v: [name, v]))


def fresh(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "infile").write_text("a file, not a folder")
    return where


# --- the properties ---------------------------------------------------------------------------------------------

@SETTINGS
@given(data=st.data())
def test_train_command_lines(files, capsys, tmp_path_factory, data):
    where = fresh(tmp_path_factory.mktemp("train"))
    src = data.draw(st.one_of(st.just(["--config", files["tiny.toml"]]), config_source(files)))
    parts = [st.just(src),
             option("--target", st.sampled_from(["model", "sim", "board"])),
             option("--arith", st.sampled_from(["float", "hw"])),
             option("--scheme", st.sampled_from(["standard", "proposed"])),
             option("--optimizer", st.sampled_from(["adam", "sgdm", "bop", "iir", "switch"])),
             option("--epochs", NUMBERS), option("--batch-size", NUMBERS), option("--seed", NUMBERS),
             option("--max-steps", NUMBERS), option("--eval-every", NUMBERS), option("--check-every", NUMBERS),
             option("--json", out_path(where)), option("--plot", out_path(where)),
             option("--checkpoint", out_path(where)),
             option("--resume", st.sampled_from([files["ckpt"], files["text.npz"], files["missing"], files["folder"],
                                                 files["good.npz"]])),
             option("--bitstream", st.sampled_from([files["missing"], files["tiny.toml"]])),
             st.sampled_from([[], ["--no-checkpoint"], ["--force"]]),
             SETS]
    argv = ["train", *flat(data.draw(st.tuples(*parts)))]
    if "--target" in argv and "sim" in argv or "board" in argv:
        argv = [a if a not in ("sim", "board") else "model" for a in argv]  # no Verilator build, no board here
    if "--resume" in argv and files["ckpt"] in argv:  # never overwrite the shared checkpoint
        argv += ["--checkpoint", str(where / "resumed.npz")]
    run([*argv, *BUDGET], capsys)


@SETTINGS
@given(data=st.data())
def test_resume_with_damaged_checkpoints(files, capsys, tmp_path_factory, data):
    from sim.train_loop import load_checkpoint, save_checkpoint

    where = fresh(tmp_path_factory.mktemp("resume"))
    good = load_checkpoint(files[data.draw(st.sampled_from(["mid", "ckpt"]))])
    meta = json.loads(json.dumps(good.meta, default=float))
    # replace one field of a section of the meta tree by another JSON value, or drop it
    section = data.draw(st.sampled_from([[], ["loop"], ["loop", "running_epoch"], ["rngs"], ["schedule"],
                                         ["history"], ["data"], ["config"], ["history", "meta"]]))
    paths = []

    def walk(node, path, depth):
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append(path + [k])
                if depth:
                    walk(v, path + [k], depth - 1)

    node = meta
    for k in section:
        node = node.get(k) if isinstance(node, dict) else None
    walk(node, list(section), 1)
    if not paths:
        return
    path = data.draw(st.sampled_from(paths))
    parent = meta
    for k in path[:-1]:
        parent = parent[k]
    junk = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True),
                     st.text(max_size=5), st.lists(st.integers(-3, 3), max_size=4),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
    if data.draw(st.booleans()):
        parent.pop(path[-1])
    else:
        parent[path[-1]] = data.draw(junk)
    arrays = dict(good.arrays)
    if arrays and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(arrays)))
        arrays[key] = data.draw(st.sampled_from([arrays[key][:-1], arrays[key].astype(float), np.array([])]))
    ck = where / "damaged.npz"
    try:
        save_checkpoint(ck, type(good)(meta, good.engine_state, arrays))
    except (TypeError, ValueError):
        return  # not writable as a checkpoint at all
    run(["train", "--resume", str(ck), "--no-progress"], capsys)


@SETTINGS
@given(data=st.data())
def test_report_and_config_command_lines(files, capsys, tmp_path_factory, data):
    where = fresh(tmp_path_factory.mktemp("report"))
    command = data.draw(st.sampled_from(["memory", "energy", "config"]))
    parts = [config_source(files), option("--scheme", st.sampled_from(["standard", "proposed"])),
             option("--optimizer", st.sampled_from(["adam", "switch"])), option("--batch-size", NUMBERS), SETS]
    if command != "config":
        parts.append(option("--json", out_path(where)))
    if command == "memory":
        parts.append(option("--convention", st.sampled_from(["paper", "exact", "x"])))
    if command == "energy":
        parts.append(option("--memory", st.sampled_from(["dram", "sram"])))
    run([command, *flat(data.draw(st.tuples(*parts)))], capsys)


@SETTINGS
@given(data=st.data())
def test_generate_explore_verify_command_lines(files, capsys, tmp_path_factory, stubs, data):
    where = fresh(tmp_path_factory.mktemp("gen"))
    command = data.draw(st.sampled_from(["generate", "explore", "verify"]))
    parts = [config_source(files), SETS]
    if command == "generate":
        parts += [option("--out", out_path(where)), st.sampled_from([[], ["--force"]]),
                  st.sampled_from([[], ["--no-synth"], ["--synth-by-unit"], ["--no-synth", "--synth-by-unit"]]),
                  option("--jobs", NUMBERS), option("--board", st.sampled_from(["pynq-z2", "ulx3s-85f"])),
                  option("--device", st.sampled_from(["xc7z020", "xck26"])),
                  st.sampled_from([[], ["--energy-estimate"]])]
    elif command == "explore":
        parts += [option("--device", st.sampled_from(["xc7z020", "xck26", "nope", ""])),
                  option("--write", out_path(where)), option("--png", out_path(where)),
                  option("--json", out_path(where))]
    else:
        parts += [option("--steps", NUMBERS),
                  option("--data", st.sampled_from([files[n] for n in ("good.npz", "float.npz", "onehot.npz",
                                                                        "short.npz", "neg.npz", "text.npz", "folder",
                                                                        "missing", "tiny.toml")])),
                  option("--energy-estimate", st.sampled_from([files["report.json"], files["missing"]]))]
    argv = [command, *flat(data.draw(st.tuples(*parts)))]
    if command == "generate" and "--out" not in argv:
        argv += ["--out", str(where / "g")]
    run(argv, capsys)


@SETTINGS
@given(data=st.data())
def test_energy_measure_command_lines(files, capsys, tmp_path_factory, data):
    where = fresh(tmp_path_factory.mktemp("energy"))
    parts = [option("--power", st.sampled_from([files[n] for n in ("power.csv", "power_latin1.csv", "tiny.toml",
                                                                    "missing", "folder", "binary.toml")])),
             option("--steps", st.sampled_from([files[n] for n in ("steps.jsonl", "steps_bad.jsonl", "missing",
                                                                    "power.csv")])),
             st.one_of(st.just([]), option("--idle-watts", NUMBERS), option("--idle-seconds", NUMBERS),
                       option("--idle-window", st.sampled_from(["0:1", "1:0", "a:b", "0.1:0.5", ":"]))),
             option("--time-offset", NUMBERS), option("--min-samples", NUMBERS),
             option("--json", out_path(where)), option("--plot", out_path(where))]
    run(["energy-measure", *flat(data.draw(st.tuples(*parts)))], capsys)
