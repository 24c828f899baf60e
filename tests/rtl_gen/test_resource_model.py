"""The resource model against its calibration (per-unit Yosys synthesis), and the explorer's choices.

Tolerance: every modelled resource of every calibration sample within 10 % of the synthesised figure, or within
an absolute floor for small counts (``resource_model.FLOOR``: 50 LUT / FF, 1 BRAM36, 2 DSP48), since a relative
error of a 40-LUT unit means nothing for a device of 53,200. One documented exception: ``resource_model.TOLERANCE``
(the BN backward unit's FF within 15 %).
"""

from __future__ import annotations

import json
import re

import pytest

from rtl_gen import resource_model as rm
from rtl_gen.explore import _Cycles, explore, fits, limits_of, pareto, write_best
from sim.config import ConfigError, apply_overrides, load_config


@pytest.fixture(scope="module")
def model():
    return rm.load_model()


def _errors(model):
    out = []
    for kind, samples in model.samples.items():
        for s in samples:
            pred = model.predict_instance(s["instance"])
            for res in rm.RESOURCES:
                got, want = pred[res], s["measured"][res]
                tol = max(rm.TOLERANCE.get((kind, res), 0.10) * want, rm.FLOOR[res])
                out.append((kind, s["point"], res, got, want, abs(got - want) <= tol))
    return out


def test_every_kind_is_calibrated(model):
    assert set(model.samples) == set(rm.KINDS)
    for kind, samples in model.samples.items():
        assert len(samples) >= 2 or kind == "io", f"{kind}: {len(samples)} calibration samples"


def test_model_within_10_percent_of_every_calibration_point(model):
    bad = [e for e in _errors(model) if not e[5]]
    assert not bad, "\n".join(f"{k} at {p}: {r} model {g:,.1f} vs synthesis {w:,.1f}" for k, p, r, g, w, _ in bad)


def test_tolerance_can_fail(model):
    # a model 15 % off on the XNOR engine's LUTs must fail the check
    fit = model.fits["engine"]["LUT"]
    model.fits["engine"]["LUT"] = rm.Fit(fit.features, tuple(1.15 * c for c in fit.coef))
    try:
        bad = [e for e in _errors(model) if not e[5]]
    finally:
        model.fits["engine"]["LUT"] = fit
    assert any(e[0] == "engine" and e[2] == "LUT" for e in bad)


@pytest.mark.parametrize(("width", "depth", "want"), [
    (64, 404, 1.0),  # a weight bank of the paper MLP: 512 x 72
    (15, 1024, 0.5),  # one RAMB18 in 1K x 18
    (112, 24576, 78.0),  # the switch accumulators' bulk: 4K x 9, 13 x 6
    (112, 432, 2.0),  # and its tail: 512 x 72
    (240, 16, 0.0),  # shallow: distributed RAM
])
def test_bram_tiling(width, depth, want):
    assert rm.bram36(width, depth) == want


def test_bram_tiling_matches_every_synthesised_part():
    """The block RAM of every calibration part is the tiling (:func:`bram36`) of its memories Yosys put in block
    RAM, and the one-read one-write memories it put in LUTRAM are the ones :func:`bram36` calls small. Parts with a
    memory written in parts (the weight banks, YDX: granularity not in the declaration) are checked through the
    model (test above)."""
    data = json.loads(rm.CALIBRATION_PATH.read_text())
    checked = 0
    for name, point in data["points"].items():
        for r in point["rows"]:
            shapes = r.get("mem_shapes")
            if shapes is None or rm.unit_kind(r["part"]) in ("wmem", "top"):
                continue
            got = sum(rm.bram36(m["width"], m["depth"]) for m in shapes if m["mapped"].startswith("BRAM"))
            assert got == r["BRAM36"], f"{name} {r['part']}: tiling {got} vs synthesis {r['BRAM36']}: {shapes}"
            small = [m for m in shapes if m["mapped"] in ("LUTRAM SDP", "LUTRAM SP")]
            assert all(rm.bram36(m["width"], m["depth"]) == 0 for m in small), f"{name} {r['part']}: {small}"
            checked += 1
    assert checked >= 10


def test_memory_shapes_match_the_verilog():
    """The memories the model derives from the plan (weight memory, generators, top-level buffers) are the ones in
    the calibration's Verilog that map to block RAM."""
    from rtl_gen.buffers import split_segments
    from rtl_gen.top import SystemPlan

    data = json.loads(rm.CALIBRATION_PATH.read_text())
    checked = 0
    for name, point in data["points"].items():
        plan = SystemPlan(apply_overrides(load_config(point["preset"]), point["set"]))
        rows = {r["part"]: r for r in point["rows"]}
        for inst in rm.unit_instances(plan):
            r = rows.get(inst.part)
            if inst.kind not in rm.BRAM_FROM_SHAPES or r is None or r.get("mem_shapes") is None:
                continue
            verilog = sorted((m["width"], m["depth"]) for m in r["mem_shapes"] if rm.bram36(m["width"], m["depth"]))
            model = []
            for m in inst.memories:
                if m.block:
                    model += [(m.width, n) for _, n in split_segments(m.depth, m.block)]
                else:
                    model.append((m.width, m.depth))
            model = sorted(x for x in model if rm.bram36(*x))
            assert model == verilog, f"{name} {inst.part}"
            checked += 1
    assert checked >= 3


def test_paper_weight_memory_bram():
    # the paper MLP's weight memory with 7-bit accumulators and 16 update lanes (the preset until explore's
    # choice) synthesised to 96 BRAM36 (16 banks + 80 accumulators), the calibration point wm_paper
    from benchmarks.calibrate_resources import PINNED
    from rtl_gen.top import SystemPlan

    plan = SystemPlan(apply_overrides(load_config("mlp"), PINNED))
    wm = next(i for i in rm.unit_instances(plan) if i.kind == "wmem")
    assert sum(m.bram36 for m in wm.memories) == 96


def test_calibration_records_its_provenance():
    from benchmarks.calibrate_resources import POINTS

    data = json.loads(rm.CALIBRATION_PATH.read_text())
    assert data["yosys"] and data["points"]
    for name, point in data["points"].items():
        assert point["commit"], name
        assert all(len(r["verilog_sha256"]) == 64 for r in point["rows"]), name
        # the model rebuilds each sample from the recorded preset and overrides: they must be the point's
        assert (point["preset"], point["set"]) == POINTS[name][:2], name


def test_calibration_points_do_not_follow_the_preset():
    """Every point pins the hardware fields the paper preset sets, so that retuning the preset (as explore's
    choice did) leaves the synthesised samples' features alone."""
    from benchmarks.calibrate_resources import POINTS, point_config
    from sim.config import load_config

    preset_hw = load_config("mlp").hw
    default_hw = type(preset_hw)()
    moved = [f for f in vars(default_hw) if getattr(preset_hw, f) != getattr(default_hw, f) and f != "input"]
    for name in POINTS:
        hw = point_config(name).hw
        sets = " ".join(POINTS[name][1])
        for f in moved:
            if f"hw.{f}=" not in sets:
                assert getattr(hw, f) == getattr(default_hw, f), (name, f)


def test_part_hash_ignores_serial_numbers_but_not_logic():
    """A part's hash survives Amaranth renumbering its ``$N`` names (a change elsewhere in the design) but not a
    change of its own logic or a swap of two of its names."""
    from benchmarks.calibrate_resources import text_hash

    a = "assign x = { 1'h0, \\port$18309$0  };\nassign \\$679 = y & \\port$18309$0 ;\n"
    renumbered = a.replace("18309", "18399").replace("679", "702")
    assert text_hash(a) == text_hash(renumbered)
    assert text_hash(a) != text_hash(a.replace("y &", "y |"))
    swapped = "assign x = { 1'h0, \\port$679$0  };\nassign \\$18309 = y & \\port$679$0 ;\n"
    assert text_hash(swapped) == text_hash(a)  # same structure, consistently renamed
    crossed = "assign x = { 1'h0, \\port$18309$0  };\nassign \\$679 = y & \\port$679$0 ;\n"
    assert text_hash(crossed) != text_hash(a)  # two names merged: different wiring
    # two names that share a number in one elaboration and not in the next (a counter moved by a change elsewhere)
    shared = "assign \\abort$23 = x;\nassign \\$23 = y & \\abort$23 ;\n"
    apart = shared.replace("abort$23", "abort$24")
    assert text_hash(shared) == text_hash(apart)
    assert text_hash(shared) != text_hash(shared.replace("y & \\abort$23", "y & \\$23"))


@pytest.mark.slow
@pytest.mark.parametrize("point", sorted(json.loads(rm.CALIBRATION_PATH.read_text())["points"]))
def test_calibration_verilog_is_current(point):
    """The generator still emits the Verilog the calibration synthesised (else re-run
    benchmarks/calibrate_resources.py): about a minute of elaboration per point."""
    from benchmarks.calibrate_resources import point_parts, text_hash

    rows = json.loads(rm.CALIBRATION_PATH.read_text())["points"][point]["rows"]
    _, parts = point_parts(point, every_kind=True)
    now = {part: text_hash(text) for part, _, _, text in parts}
    stale = [r["part"] for r in rows if now.get(r["part"]) != r["verilog_sha256"]]
    assert not stale, f"{point}: the Verilog of {stale} changed since the calibration"


@pytest.mark.synth
@pytest.mark.slow
def test_resynthesise_one_small_point(tmp_path):
    """One small part of the calibration synthesised again (in a fresh folder: no cache) gives the recorded
    figures."""
    from benchmarks.calibrate_resources import point_parts
    from rtl_gen.synth import synthesize

    data = json.loads(rm.CALIBRATION_PATH.read_text())
    rows = {r["part"]: r for r in data["points"]["wm_small_narrow"]["rows"]}
    _, parts = point_parts("wm_small_narrow")
    part, _, alias, text = next(p for p in parts if p[1] == "rng")
    rep = synthesize(text, alias, workdir=tmp_path / "synth")
    assert not rep.cached
    for k in ("LUT", "FF", "BRAM36", "DSP"):
        assert rep.resources[k] == rows[part][k], k


# -- the explorer -------------------------------------------------------------------------------------------------

SMALL_GRID = {"lanes_in": (32, 64), "lanes_out": (8, 16), "dw_passes": (2, 4), "dx_passes": (4,),
              "po2_lanes": (2, 4), "update_lanes": (8, 16), "div_steps": (4,), "mul_steps": (4,),
              "loss_lanes": (1,)}


@pytest.fixture(scope="module")
def small_search(model):
    return explore(load_config("mlp"), "xc7z020", model=model, grid=SMALL_GRID)


def test_explorer_choices_fit_the_device(small_search, model):
    from rtl_gen.top import SystemPlan

    res = small_search
    lim = limits_of(res.device)
    assert res.best is not None and res.fronts["LUT"] and res.fronts["BRAM36"]
    for front in res.fronts.values():
        for d in front:
            assert fits(d.resources, lim) and d.exact
            plan = SystemPlan(apply_overrides(load_config("mlp"), {f"hw.{k}": v for k, v in d.hw.items()}))
            assert model.predict(plan)["total"] == pytest.approx(d.resources)
    # nothing on a front is beaten by the best in both cycles and LUT
    assert res.best.cycles == min(d.cycles for f in res.fronts.values() for d in f)


def test_best_toml_loads_and_gives_the_predicted_cycles(small_search, tmp_path):
    from rtl_gen.cycle_model import step_cycles
    from rtl_gen.top import SystemPlan

    path = tmp_path / "best.toml"
    write_best(load_config("mlp"), small_search.best, path)
    cfg = load_config(path)
    assert {k: getattr(cfg.hw, k) for k in small_search.best.hw} == small_search.best.hw
    assert step_cycles(SystemPlan(cfg)).per_image == pytest.approx(small_search.best.cycles)


def test_pareto():
    from rtl_gen.explore import Design

    pts = [Design({}, c, {"LUT": lut}) for c, lut in [(10, 5), (8, 7), (9, 9), (12, 4), (8, 6)]]
    assert [(d.cycles, d.resources["LUT"]) for d in pareto(pts, "LUT")] == [(8, 6), (10, 5), (12, 4)]


def test_fast_cycles_match_the_cycle_model():
    """The search's memoised cycle model agrees with step_cycles on designs that share one memo the way the search
    shares it (one field moved at a time from a base design): a memo key missing a field the cycle model reads
    gives the base's count for the moved design."""
    from rtl_gen.cycle_model import step_cycles
    from rtl_gen.top import SystemPlan

    memo = _Cycles()
    base = {"lanes_in": 128, "lanes_out": 8, "dw_passes": 4, "dx_passes": 8, "po2_lanes": 4, "update_lanes": 16,
            "div_steps": 4, "mul_steps": 4, "loss_lanes": 2}
    moves = [{}] + [{k: 2 * v if k != "dx_passes" else v // 2} for k, v in base.items()]
    for move in moves:
        hw = {**base, **move}
        plan = SystemPlan(apply_overrides(load_config("mlp"), {f"hw.{k}": v for k, v in hw.items()}))
        assert memo(plan) == step_cycles(plan).per_image, move


def test_unknown_device_names_the_known_ones(capsys):
    from host.cli import EXIT_USER_ERROR, main

    assert main(["explore", "--model", "mlp", "--device", "xc9z999"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "xc9z999" in err and "xc7z020" in err


def test_the_zcu104_configuration_is_the_explorers_choice_for_the_xczu7ev(model):
    """configs/mlp_mnist_zcu104.toml is what `explore --device xczu7ev` writes for the paper's MLP (about a minute):
    a change of the cycle model, the resource model or the preset that moves the explorer's choice fails here."""
    from rtl_gen.cycle_model import step_cycles
    from rtl_gen.explore import FIXED
    from rtl_gen.top import SystemPlan
    from sim.config import CONFIG_DIR

    res = explore(load_config("mlp"), "xczu7ev", model=model)
    cfg = load_config(CONFIG_DIR / "mlp_mnist_zcu104.toml")
    assert {k: getattr(cfg.hw, k) for k in {**res.best.hw, **FIXED}} == {**res.best.hw, **FIXED}
    assert step_cycles(SystemPlan(cfg)).per_image == pytest.approx(res.best.cycles)
    assert res.best.cycles <= 1_200
    # only [hw] differs from the preset it names
    base = load_config("mlp")
    assert cfg.model == base.model and cfg.train == base.train and cfg.approx == base.approx


def test_explorer_prices_the_windowed_gradient(model):
    """hw.dw_window: the explorer prices the CodeWindow rings (one per layer geometry) and counts the array's
    ternary pairs (even dW passes: half the reads of each tile)."""
    cfg = load_config("mlp")  # the preset takes hw.dw_window = 3
    assert cfg.hw.dw_window == 3
    res = explore(cfg, "xc7z020", model=model, grid=SMALL_GRID)
    full = explore(apply_overrides(load_config("mlp"), ["hw.dw_window=0"]), "xc7z020", model=model, grid=SMALL_GRID)
    assert {u[0] for u in res.best.units} >= {"code_window"}
    assert "code_window" not in {u[0] for u in full.best.units}
    windows = [r for k, _, r in res.best.units if k == "code_window"]
    assert len(windows) == 2 and all(r["FF"] > 0 and r["LUT"] > 0 for r in windows)  # 256-wide layers, output layer
    assert res.best.cycles < full.best.cycles


@pytest.mark.parametrize("override, words", [
    ("hw.input=int8", "hw.input = 'int8': the generated RTL has no 8-bit first-layer engine yet"),
])
def test_explorer_says_what_no_lanes_can_change_instead_of_nothing_fits(override, words, model):
    with pytest.raises(ConfigError, match=re.escape(words)):
        explore(apply_overrides(load_config("mlp"), [override]), "xc7z020", model=model, grid=SMALL_GRID)
    with pytest.raises(ConfigError, match=re.escape("model.layers[0]: the RTL generator supports dense layers")):
        explore(load_config("cnv"), "xc7z020", model=model, grid=SMALL_GRID)
