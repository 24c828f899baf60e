# amaranth: UnusedElaboratable=no
"""The generate flow (host.generate), verify (host.verify) and their commands.

Fast: ``xnortrain generate --no-synth`` writes the Verilog, the register map and a report whose cycle figures
are the cycle model's; configuration mistakes stop with the field named; the mismatch finder reports the
first differing element. ``rtl``: ``xnortrain verify`` on a small MLP exits 0 after comparing every step.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from test_system import SMALL  # same folder (pytest puts it on sys.path)

from host.cli import EXIT_USER_ERROR, main
from rtl_gen.contract import AcceleratorDescription
from rtl_gen.cycle_model import step_cycles
from rtl_gen.regmap import RegisterMap
from rtl_gen.top import SystemPlan
from sim.config import apply_overrides, load_config
from tb.system_tb import first_mismatch

SMALL_SET = SMALL  # the small MLP of the system tests


def _set_args():
    out = []
    for s in SMALL_SET:
        out += ["--set", s]
    return out


def test_generate_writes_verilog_regmap_and_report(tmp_path, capsys):
    out = tmp_path / "acc"
    assert main(["generate", "--model", "mlp", *_set_args(), "--out", str(out), "--no-synth"]) == 0
    text = (out / "xnortrain_top.v").read_text()
    assert "module xnortrain_top" in text and "s_axi_awaddr" in text and "s_axis_tdata" in text
    cfg = apply_overrides(load_config("mlp"), SMALL_SET)
    plan = SystemPlan(cfg)
    assert RegisterMap.from_json(out / "regmap.json").to_dict() == plan.regmap.to_dict()
    desc = AcceleratorDescription.from_json(out / "accelerator.json")
    assert desc.batch == 4 and desc.layers == [(784, 12), (12, 10)]
    rep = json.loads((out / "report.json").read_text())
    model = step_cycles(plan)
    assert rep["cycles"]["per_step"] == model.step
    assert rep["cycles"]["per_image"] == round(model.step / 4, 1)
    assert "cycles per training step" in (out / "report.txt").read_text()
    assert "cycles per training step" in capsys.readouterr().out


def test_verify_names_the_unsupported_field(capsys):
    # an 8-bit first layer needs the engine the RTL does not have yet
    assert main(["verify", "--model", "mlp", "--set", "hw.input=int8", "--steps", "1"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "hw.input = 'int8'" in err and "hw.input = 'binary'" in err


def test_verify_rejects_a_bad_step_count(capsys):
    assert main(["verify", "--model", "mlp", *_set_args(), "--steps", "0"]) == EXIT_USER_ERROR
    assert "steps = 0" in capsys.readouterr().err


def test_first_mismatch_reports_the_first_differing_element():
    want = {"w0": np.array([[1, -1], [1, 1]]), "acc0": np.array([[3, 0], [-2, 5]]), "e_beta1": np.int64(-3)}
    assert first_mismatch({k: np.copy(v) for k, v in want.items()}, want) is None
    got = {k: np.copy(v) for k, v in want.items()}
    got["acc0"][1, 0] = 7
    got["acc0"][1, 1] = 0
    mm = first_mismatch(got, want)
    assert mm == {"quantity": "acc", "layer": 0, "index": [1, 0], "expected": -2, "got": 7, "count": 2}
    got = {k: np.copy(v) for k, v in want.items()}
    got["e_beta1"] = np.int64(4)
    assert first_mismatch(got, want)["quantity"] == "e_beta"
    got = {k: np.copy(v) for k, v in want.items() if k != "w0"}
    assert first_mismatch(got, want) == {"quantity": "w0", "layer": None, "index": None, "expected": "present",
                                         "got": "missing"}


@pytest.mark.rtl
def test_verify_command_on_a_small_mlp(capsys):
    assert main(["verify", "--model", "mlp", *_set_args(), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "OK: all 2 steps matched the bit-exact model" in out
    assert out.count("cycles (") == 2


@pytest.mark.rtl
def test_verify_finds_a_model_that_disagrees_with_the_hardware():
    """The comparison can fail: the same accelerator (same Verilog, so the cached build) checked against a model
    whose running statistics follow another EMA rate must mismatch at step 0, in those statistics only."""
    from host.verify import verify

    cfg = apply_overrides(load_config("mlp"), SMALL_SET)
    lines = []
    res = verify(cfg, 1, log=lines.append, model_overrides=[f"hw.running_shift={cfg.hw.running_shift + 1}"])
    assert not res.ok and res.mismatch is not None and res.mismatch["step"] == 0
    assert res.mismatch["quantity"] == "mu_r", res.mismatch  # the first differing quantity in sorted order
    assert {k.rstrip("0123456789") for k in res.mismatch["all"]} == {"mu_r", "s_r"}, res.mismatch
    assert lines[-1].startswith("FAILED: first mismatch at step 0"), lines[-1]


@pytest.mark.synth
def test_generate_with_synthesis_reports_resources_and_fit(tmp_path):
    """``generate`` with Yosys: report.json holds the xc7z020 resource counts and percentages, and the fit
    verdict agrees with them and names every resource over the device. (Measured: this small MLP needs
    about 66,000 LUTs, 125 % of the device, so the verdict here is "does not fit", naming LUT.)"""
    from host.generate import generate

    cfg = apply_overrides(load_config("mlp"), SMALL_SET)
    rep = generate(cfg, tmp_path / "acc", log=lambda *_: None)
    assert rep["device"] == "xc7z020"
    assert rep["resources"]["LUT"] > 0 and rep["resources"]["FF"] > 0
    assert rep["percent"]["LUT"] == pytest.approx(100 * rep["resources"]["LUT"] / 53200, abs=0.01)
    over = sorted(k for k, v in rep["percent"].items() if v > 100)
    assert rep["fits"] == (not over)
    assert sorted(o.split(":")[0] for o in rep["overflows"]) == over
    saved = json.loads((tmp_path / "acc" / "report.json").read_text())
    assert saved["resources"] == rep["resources"]
    text = (tmp_path / "acc" / "report.txt").read_text()
    assert "xc7z020" in text and (("DOES NOT FIT" in text) == bool(over))
    for name in over:
        assert f"{name}: needs" in text


@pytest.mark.synth
def test_generate_by_unit_adds_up_the_submodules(tmp_path, capsys):
    """``xnortrain generate --synth-by-unit``: every direct submodule synthesised on its own plus the top
    level's own logic (black boxes for the submodules), one progress line per part, and the report's totals
    are the parts' sum (measured on this small MLP: 44,393 LUT, 531 s cold; cached parts make reruns fast)."""
    out = tmp_path / "acc"
    code = main(["generate", "--model", "mlp", *_set_args(), "--out", str(out), "--synth-by-unit"])
    text = capsys.readouterr().out
    rep = json.loads((out / "report.json").read_text())
    assert rep["synth"]["by_unit"] is True
    assert code == (0 if rep["fits"] else 1)
    parts = [line for line in text.splitlines() if re.match(r"\s+\[\d+/\d+\] ", line)]
    assert len(parts) > 20 and "(top level)" in parts[-1]
    luts = [int(re.search(r": ([\d,]+) LUT", line).group(1).replace(",", "")) for line in parts]
    assert rep["resources"]["LUT"] == sum(luts)
