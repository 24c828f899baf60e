"""Energy model: constants, operation counts, consistency of the breakdown, and the paper's trends."""

import json
import math

import pytest

from sim.config import ConfigError, apply_overrides, config_from_dict, load_config
from sim.energy_model import (
    HOROWITZ_45NM_PJ,
    compare_with_paper,
    energy_table,
    int_add_pj,
    op_energy_pj,
    paper_reference,
    report,
)


def scheme(model, s, *more):
    return apply_overrides(load_config(model), [f"approx.scheme={s}", *more])


def test_constants_are_horowitz_45nm():
    # Horowitz, ISSCC 2014, Figure 1.1.9 (pJ)
    assert HOROWITZ_45NM_PJ == {
        "int8_add": 0.03,
        "int32_add": 0.1,
        "fp16_add": 0.4,
        "fp32_add": 0.9,
        "int8_mult": 0.2,
        "int32_mult": 3.1,
        "fp16_mult": 1.1,
        "fp32_mult": 3.7,
        "sram_8kb_64b": 10.0,
        "sram_32kb_64b": 20.0,
        "sram_1mb_64b": 100.0,
        "dram_64b_low": 1300.0,
        "dram_64b_high": 2600.0,
    }


def test_operation_energies():
    assert int_add_pj(8) == pytest.approx(0.03) and int_add_pj(32) == pytest.approx(0.1)
    widths = [1, 4, 8, 12, 16, 24, 32, 64]
    assert all(int_add_pj(a) < int_add_pj(b) for a, b in zip(widths[:-1], widths[1:], strict=True))
    assert op_energy_pj("int32_add") == 0.1 and op_energy_pj("fp32_mult") == 3.7
    assert op_energy_pj("bf16_add") == op_energy_pj("fp16_add")
    assert op_energy_pj("xnor") == int_add_pj(1)
    with pytest.raises(ValueError):
        op_energy_pj("fp64_add")


@pytest.mark.parametrize("model", ["mlp", "cnv", "binarynet"])
def test_proposed_cheaper_than_standard(model):
    std = energy_table(scheme(model, "standard"))
    prop = energy_table(scheme(model, "proposed"))
    assert prop.total_mj < std.total_mj
    assert prop.op_mj < std.op_mj and prop.mem_mj < std.mem_mj
    # same order of magnitude as the paper's Table 3 (the doc explains the differences)
    for r in (std, prop):
        assert 0.5 < r.total_mj / r.paper_mj < 2.0


@pytest.mark.parametrize("memory", ["dram", "dram_high", "sram"])
def test_breakdown_sums_to_total(memory):
    r = energy_table(scheme("cnv", "proposed"), memory)
    total = r.total_mj
    assert sum(d["total_mj"] for d in r.by_line()) == pytest.approx(total)
    assert sum(d["op_mj"] + d["mem_mj"] for d in r.by_layer()) == pytest.approx(total)
    assert sum(d["mj"] for d in r.by_variable()) == pytest.approx(r.mem_mj)
    assert sum(op_energy_pj(k) * n for k, n in r.op_counts().items()) * 1e-9 == pytest.approx(r.op_mj)


def test_dram_costs_1_3_nj_per_64_bits():
    r = energy_table(scheme("mlp", "standard"))
    bits = sum(d["read_bits"] + d["write_bits"] for d in r.by_variable())
    assert r.mem_mj == pytest.approx(bits * 1300 / 64 * 1e-9)
    assert energy_table(scheme("mlp", "standard"), "dram_high").mem_mj == pytest.approx(2 * r.mem_mj)
    assert energy_table(scheme("mlp", "standard"), "sram").mem_mj < r.mem_mj / 10


def tiny(*more):
    cfg = config_from_dict(
        {
            "model": {
                "input_shape": [1, 4, 4],
                "layers": [{"type": "dense", "units": 8}, {"type": "dense", "units": 10}],
            },
            "train": {"batch_size": 5},
        }
    )
    return apply_overrides(cfg, list(more))


def line(r, name, layer):
    (x,) = [x for x in r.lines if x.line == name and x.layer == layer]
    return x


def test_matmul_operation_counts():
    B, macs0, macs1 = 5, 5 * 8 * 16, 5 * 10 * 8
    std = energy_table(tiny("approx.scheme=standard"))
    # forward: float first layer, XNOR-popcount after it (accumulator of 1 + ceil(log2(9)) = 5 bits)
    assert line(std, "L3-4", 0).ops == {"fp32_mult": macs0, "fp32_add": macs0}
    assert line(std, "L3-4", 1).ops == {"xnor": macs1, "int5_add": macs1}
    # backward with float dY: multiply-accumulate; no dX for the first layer
    assert line(std, "L14", 1).ops == {"fp32_mult": macs1, "fp32_add": macs1}
    assert line(std, "L15", 0).ops == {"fp32_mult": macs0, "fp32_add": macs0}
    assert not [x for x in std.lines if x.line == "L14" and x.layer == 0]
    prop = energy_table(tiny("approx.scheme=proposed"))
    # po2 dY: shift + add/sub in int32 against binary operands
    assert line(prop, "L14", 1).ops == {"int32_add": 2 * macs1 + B * 8}  # + int32 -> float dX per element
    assert line(prop, "L15", 1).ops == {"int32_add": 2 * macs1}
    assert line(prop, "L15", 0).ops == {"int32_add": macs0, "fp32_add": macs0}  # real image x power of two
    assert line(prop, "L13", 1).ops == {"int32_add": 3 * B * 10}
    intk = energy_table(tiny("approx.scheme=proposed", "approx.dy=int"))
    assert line(intk, "L15", 1).ops == {"int32_add": macs1}


def test_traffic_per_variable():
    B = 5
    std = energy_table(tiny("approx.scheme=standard"))
    prop = energy_table(tiny("approx.scheme=proposed"))
    # BN backward reads the retained activations: float32 vs 1 bit
    x_std = [b for v, rw, b in line(std, "L10-12", 1).traffic if v == "X"]
    x_prop = [b for v, rw, b in line(prop, "L10-12", 1).traffic if v == "X"]
    assert x_std == [B * 10 * 32] and x_prop == [B * 10 * 1]
    # dY written at 32 vs 5 bits; dW at 32 vs 1 bit
    assert [b for v, rw, b in line(prop, "L13", 1).traffic if v == "dY"] == [B * 10 * 5]
    assert [b for v, rw, b in line(std, "L15", 1).traffic if v == "dW"] == [80 * 32]
    assert [b for v, rw, b in line(prop, "L15", 1).traffic if v == "dW"] == [80 * 1]
    # Adam update: read dW, W, m, v; write W, m, v and the binary copy
    up = line(std, "L18", 0)
    assert sorted((v, rw) for v, rw, _ in up.traffic) == sorted(
        [
            ("dW", "r"),
            ("W", "r"),
            ("W", "w"),
            ("momenta", "r"),
            ("momenta", "w"),
            ("momenta", "r"),
            ("momenta", "w"),
            ("W_hat", "w"),
        ]
    )


def test_energy_grows_with_batch_but_weights_are_per_batch():
    e = {b: energy_table(scheme("mlp", "proposed", f"train.batch_size={b}")).total_mj for b in (50, 100, 200)}
    assert e[50] < e[100] < e[200] < 2 * e[100]
    # affine in B: equal steps for equal increments
    assert e[200] - e[100] == pytest.approx(2 * (e[100] - e[50]), rel=1e-6)


@pytest.mark.parametrize(
    "more",
    [
        ["optimizer.name=sgdm"],
        ["optimizer.name=bop"],
        ["optimizer.name=iir"],
        ["optimizer.name=switch", "optimizer.switch.mode=accumulate", "optimizer.switch.undo=true"],
        ["optimizer.name=switch", "optimizer.switch.mode=momentum"],
        ["optimizer.name=switch", "optimizer.switch.mode=stochastic"],
        ["approx.storage=bfloat16", "approx.dy=bfloat16", "approx.bn=l1"],
        ["model.input_format=binary"],
        ["model.input_format=int8"],
    ],
)
def test_variants_run(more):
    r = energy_table(scheme("cnv", "proposed", *more))
    assert math.isfinite(r.total_mj) and r.total_mj > 0
    assert sum(d["total_mj"] for d in r.by_line()) == pytest.approx(r.total_mj)


def test_latent_free_optimisers_move_less_than_adam():
    adam = energy_table(scheme("mlp", "proposed"))
    for opt in ("bop", "iir"):
        r = energy_table(scheme("mlp", "proposed", f"optimizer.name={opt}"))
        upd = sum(d["total_mj"] for d in r.by_line() if d["line"] == "L18")
        assert upd < sum(d["total_mj"] for d in adam.by_line() if d["line"] == "L18")


def test_fp16_arithmetic_option():
    fp32 = energy_table(scheme("binarynet", "proposed"))
    fp16 = energy_table(scheme("binarynet", "proposed"), float_ops="storage")
    assert fp16.op_mj < fp32.op_mj and fp16.mem_mj == pytest.approx(fp32.mem_mj)
    # standard stores float32, so its arithmetic is float32 either way
    std = scheme("binarynet", "standard")
    assert energy_table(std, float_ops="storage").total_mj == pytest.approx(energy_table(std).total_mj)
    with pytest.raises(ConfigError, match="float_ops"):
        energy_table(std, float_ops="fp8")
    with pytest.raises(ConfigError, match="memory"):
        energy_table(std, memory="cache")


def test_report_json_and_text():
    text, d = report(scheme("mlp", "proposed"))
    json.dumps(d)
    assert d["paper"]["mj"] == 0.97 and d["constants_pj"]["dram_64b_low"] == 1300.0
    assert d["total_mj"] == pytest.approx(d["arithmetic_mj"] + d["memory_mj"])
    first = text.splitlines()[0]
    for word in ("mlp_mnist", "proposed", "adam", "batch 100"):
        assert word in first
    assert "paper (Table 3): 0.97 mJ" in text


def test_paper_reference():
    want = {
        ("mlp", "standard"): 2.40,
        ("mlp", "proposed"): 0.97,
        ("cnv", "standard"): 144.24,
        ("cnv", "proposed"): 52.61,
        ("binarynet", "standard"): 855.41,
        ("binarynet", "proposed"): 196.26,
    }
    for (m, s), v in want.items():
        assert paper_reference(scheme(m, s)) == v
    assert paper_reference(scheme("mlp", "proposed", "train.batch_size=64")) is None
    assert paper_reference(tiny()) is None
    assert compare_with_paper().count("\n") == 8
