"""Memory model against the source paper's Tables 2, 3 and 4, and its own invariants."""

import json

import pytest

from sim.config import ConfigError, apply_overrides, config_from_dict, load_config
from sim.memory_model import (
    MIB,
    compare_with_paper,
    dtype_bits,
    memory_table,
    paper_reference,
    report,
    switch_acc_bits,
)


def cfg_for(model, *overrides):
    return apply_overrides(load_config(model), list(overrides))


def scheme(model, s, *more):
    return cfg_for(model, f"approx.scheme={s}", *more)


# --------------------------------------------------------------------------- Table 2

TABLE2 = {
    # variable: (standard MiB, proposed MiB), BinaryNet, CIFAR-10, Adam, B = 100
    "X": (111.33, 3.48),
    "dX, Y": (50.00, 25.00),
    "dY": (50.00, 7.81),
    "W": (53.49, 26.74),
    "dW": (53.49, 1.67),
    "Momenta": (106.98, 53.49),
}


@pytest.mark.parametrize("which,total", [("standard", 425.35), ("proposed", 118.23)])
def test_table2_total_within_1_percent(which, total):
    r = memory_table(scheme("binarynet", which))
    assert r.total_mib == pytest.approx(total, rel=0.01)
    # the reconstruction is in fact exact to the printed digits
    assert round(r.total_mib, 2) == total


@pytest.mark.parametrize("which", ["standard", "proposed"])
def test_table2_rows(which):
    r = memory_table(scheme("binarynet", which))
    col = 0 if which == "standard" else 1
    for name, vals in TABLE2.items():
        assert r.row(name).mib == pytest.approx(vals[col], abs=0.006), name
    # the small per-channel rows print as 0.03 (float32) and 0.01-0.02 (float16)
    assert r.row("mu, sigma").mib < 0.035 and r.row("beta, dbeta").mib < 0.035
    assert r.row("dX, Y").per_layer and r.row("dY").per_layer
    assert not any(x.per_layer for x in r.rows if x.name not in ("dX, Y", "dY"))


def test_table2_data_types():
    std = memory_table(scheme("binarynet", "standard"))
    assert {x.dtype for x in std.rows} == {"float32"}
    prop = memory_table(scheme("binarynet", "proposed"))
    types = {x.name: x.dtype for x in prop.rows}
    assert types["X"] == "bool" and types["dW"] == "bool" and types["dY"] == "po2_5"
    assert types["W"] == types["Momenta"] == types["dX, Y"] == "float16"


# --------------------------------------------------------------------------- Table 3


@pytest.mark.parametrize(
    "model,which,total",
    [("mlp", "standard", 7.40), ("mlp", "proposed", 2.56), ("cnv", "standard", 128.33), ("cnv", "proposed", 27.13)],
)
def test_table3_within_2_percent(model, which, total):
    r = memory_table(scheme(model, which))
    assert r.total_mib == pytest.approx(total, rel=0.02)
    assert r.paper_mib == total
    assert abs(r.paper_diff_pct()) < 2


# --------------------------------------------------------------------------- Table 4 (memory savings, BinaryNet)

ABLATION = [
    ("l2", "float16", "float", "float16"),
    ("l2", "float16", "bool", "float16"),
    ("l2", "int", "bool", "float16"),
    ("l2", "po2", "bool", "float16"),
    ("l1", "po2", "bool", "float16"),
    ("l1_bnn", "po2", "bool", "float16"),
]
TABLE4 = {
    "adam": [2.00, 2.27, 2.50, 2.50, 2.50, 3.60],
    "sgdm": [2.00, 2.31, 2.59, 2.59, 2.59, 4.07],
    "bop": [2.00, 2.37, 2.72, 2.72, 2.72, 4.92],
}


@pytest.mark.parametrize("opt", list(TABLE4))
def test_table4_memory_savings(opt):
    base = memory_table(scheme("binarynet", "standard", f"optimizer.name={opt}")).total_mib
    for (bn, dy, dw, st), want in zip(ABLATION, TABLE4[opt], strict=True):
        cfg = cfg_for(
            "binarynet",
            f"optimizer.name={opt}",
            f"approx.bn={bn}",
            f"approx.dy={dy}",
            f"approx.dw={dw}",
            f"approx.storage={st}",
        )
        assert base / memory_table(cfg).total_mib == pytest.approx(want, abs=0.011), (opt, bn, dy, dw)


# --------------------------------------------------------------------------- invariants


def test_bool_x_is_one_32nd_of_float32_x():
    real = memory_table(scheme("binarynet", "standard", "approx.bn=l1"))
    binary = memory_table(scheme("binarynet", "standard", "approx.bn=l1_bnn"))
    assert binary.row("X").bytes * 32 == real.row("X").bytes
    assert binary.row("X").dtype == "bool"


@pytest.mark.parametrize("k", [2, 5, 8])
def test_po2_dy_is_k_32nds_of_float32(k):
    f32 = memory_table(scheme("cnv", "standard"))
    po2 = memory_table(scheme("cnv", "standard", "approx.dy=po2", f"approx.dy_bits={k}"))
    assert po2.row("dY").bytes * 32 == f32.row("dY").bytes * k
    assert po2.row("dY").dtype == f"po2_{k}"
    assert memory_table(scheme("cnv", "standard", "approx.dy=int", f"approx.dy_bits={k}")).row("dY").dtype == f"int{k}"


def test_bool_dw_and_16_bit_storage():
    f32 = memory_table(scheme("mlp", "standard"))
    assert memory_table(scheme("mlp", "standard", "approx.dw=bool")).row("dW").bytes * 32 == f32.row("dW").bytes
    for st in ("float16", "bfloat16"):
        half = memory_table(scheme("mlp", "standard", f"approx.storage={st}"))
        for a, b in zip(half.rows, f32.rows, strict=True):
            # dY has its own switch (approx.dy), still float32 here
            assert a.bytes * (1 if a.name == "dY" else 2) == b.bytes, a.name
        assert half.row("W").dtype == st


@pytest.mark.parametrize("model", ["mlp", "cnv", "binarynet"])
@pytest.mark.parametrize("convention", ["paper", "exact"])
def test_memory_linear_in_batch_through_activations_only(model, convention):
    a = memory_table(cfg_for(model, "train.batch_size=100"), convention)
    b = memory_table(cfg_for(model, "train.batch_size=250"), convention)
    activ = {"X", "X (network input)", "dX, Y", "dY", "STE mask", "pool arg-max"}
    for ra, rb in zip(a.rows, b.rows, strict=True):
        assert ra.name == rb.name
        if ra.name in activ:
            assert rb.bytes == pytest.approx(2.5 * ra.bytes), ra.name
        else:
            assert rb.bytes == ra.bytes, ra.name


def test_percentages_and_json():
    text, d = report(load_config("cnv"))
    json.dumps(d)
    assert sum(r["percent"] for r in d["rows"]) == pytest.approx(100.0)
    assert d["total_mib"] == pytest.approx(sum(r["bytes"] for r in d["rows"]) / MIB)
    assert d["paper"]["mib"] == 27.13
    first = text.splitlines()[0]
    for word in ("cnv_cifar10", "proposed", "adam", "batch 100"):
        assert word in first
    assert "paper (Table 3): 27.13 MiB" in text


def test_paper_reference_only_for_the_paper_settings():
    assert paper_reference(scheme("mlp", "standard")) == 7.40
    assert paper_reference(scheme("binarynet", "proposed")) == 118.23
    assert paper_reference(scheme("mlp", "proposed", "train.batch_size=200")) is None
    assert paper_reference(scheme("mlp", "proposed", "optimizer.name=sgdm")) is None
    assert paper_reference(scheme("mlp", "proposed", "approx.dy_bits=4")) is None
    assert paper_reference(scheme("mlp", "standard", "approx.dw=bool")) is None
    custom = config_from_dict({"model": {"layers": [{"type": "dense", "units": 10}]}})
    assert paper_reference(custom) is None
    assert memory_table(custom).paper_mib is None
    assert "paper (" not in memory_table(custom).format_table()


def test_compare_with_paper_lists_six_cells():
    text = compare_with_paper()
    assert text.count("Table 3") == 4 and text.count("Table 2") == 2


# --------------------------------------------------------------------------- optimisers


def test_optimizer_state_rows():
    def rows(opt, *more):
        return {r.name: r for r in memory_table(scheme("mlp", "standard", f"optimizer.name={opt}", *more)).rows}

    n = load_config("mlp").n_weights
    assert rows("adam")["Momenta"].elements == 2 * n
    assert rows("sgdm")["Momenta"].elements == n
    assert "Momenta" not in rows("sgdm", "optimizer.sgdm.momentum=0.0")
    bop = rows("bop")
    assert bop["Momenta"].elements == n and "W" not in bop  # the paper counts no weights for Bop
    iir = rows("iir")
    assert iir["IIR filters"].elements == 2 * n and "W" not in iir
    sw = rows("switch", "optimizer.switch.mode=accumulate", "optimizer.switch.acc_cutoff=50")
    assert sw["Accumulators"].dtype == "int7" and sw["Accumulators"].bits == 7
    assert "Undo copy" in rows("switch", "optimizer.switch.undo=true")
    assert not any(r in rows("switch", "optimizer.switch.mode=deterministic") for r in ("Accumulators", "Momenta"))
    assert rows("switch", "optimizer.switch.mode=momentum")["Momenta"].elements == n


def test_switch_accumulator_bits():
    assert switch_acc_bits(1) == 2  # -1..1
    assert switch_acc_bits(50) == 7  # -50..50
    assert switch_acc_bits(63) == 7 and switch_acc_bits(64) == 8
    assert dtype_bits("int7") == 7 and dtype_bits("po2_5") == 5 and dtype_bits("bool") == 1
    with pytest.raises(ValueError):
        dtype_bits("float8")


# --------------------------------------------------------------------------- exact convention


def test_exact_convention():
    cfg = scheme("cnv", "proposed")
    r = memory_table(cfg, "exact")
    rows = {x.name: x for x in r.rows}
    # real (valid-padding) sizes: the biggest tensor is conv 0's 64x30x30 output
    assert rows["dX, Y"].elements == 100 * 64 * 30 * 30 and rows["dX, Y"].layer == 0
    assert rows["X (network input)"].dtype == "float16"  # model.input_format = float
    assert rows["STE mask"].dtype == "bool" and rows["W"].dtype == "float16"
    assert rows["beta momenta"].elements == 2 * sum(s.out_channels for s in cfg.weight_layers())
    binary_in = memory_table(scheme("cnv", "proposed", "model.input_format=binary"), "exact")
    assert binary_in.row("X (network input)").dtype == "bool"
    bop = memory_table(scheme("mlp", "proposed", "optimizer.name=bop"), "exact")
    assert bop.row("W").dtype == "bool"
    with pytest.raises(ConfigError, match="convention"):
        memory_table(cfg, "guess")


def test_conv_without_pool_or_bn():
    cfg = config_from_dict(
        {
            "model": {
                "input_shape": [1, 8, 8],
                "layers": [
                    {"type": "conv", "channels": 4, "kernel": 3, "bn": False},
                    {"type": "dense", "units": 10},
                ],
            },
            "train": {"batch_size": 7},
        }
    )
    for conv in ("paper", "exact"):
        r = memory_table(cfg, conv)
        assert r.total_bytes > 0
        assert r.row("mu, sigma").elements == 2 * 10  # only the dense layer has BN
    # paper convention: the conv keeps 8x8, so its output is 4*8*8 = 256 per image
    assert memory_table(cfg).row("dX, Y").elements == 7 * 256
    assert memory_table(cfg, "exact").row("dX, Y").elements == 7 * 4 * 6 * 6
