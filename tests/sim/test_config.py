"""The configuration: presets, validation messages, overrides, round trips."""

import pytest

from sim.config import PRESETS, ConfigError, apply_overrides, config_from_dict, load_config


def test_presets_have_the_papers_topologies():
    mlp = load_config("mlp")
    assert [s.out_shape for s in mlp.layer_shapes()] == [(256,), (256,), (256,), (256,), (10,)]
    assert mlp.n_weights == 784 * 256 + 3 * 256 * 256 + 256 * 10 == 399_872
    assert all(s.spec.bn for s in mlp.weight_layers())  # BN after every dense layer, the last too

    cnv = load_config("cnv")
    assert [s.out_shape for s in cnv.layer_shapes() if s.spec.type != "dense"][-1] == (256, 1, 1)
    assert [s.fan_in for s in cnv.weight_layers()] == [27, 576, 576, 1152, 1152, 2304, 256, 512, 512]

    bnn = load_config("binarynet")
    assert bnn.layer_shapes()[8].out_shape == (512, 4, 4)
    assert bnn.weight_layers()[6].fan_in == 8192
    # Table 2: float32 W of BinaryNet is 53.49 MiB.
    assert bnn.n_weights * 4 / 2**20 == pytest.approx(53.49, abs=0.005)


def test_every_preset_loads_and_round_trips_through_toml(tmp_path):
    for name in PRESETS:
        cfg = load_config(name)
        path = tmp_path / f"{name}.toml"
        path.write_text(cfg.to_toml())
        again = load_config(path)
        assert again.to_dict() == cfg.to_dict()


def test_schemes_set_each_approximation_and_explicit_values_win():
    std = apply_overrides(load_config("mlp"), ["approx.scheme=standard"])
    assert (std.approx.bn, std.approx.dy, std.approx.dw, std.approx.storage) == ("l2", "float32", "float", "float32")
    prop = apply_overrides(std, ["approx.scheme=proposed"])
    assert (prop.approx.bn, prop.approx.dy, prop.approx.dw, prop.approx.storage) == ("l1_bnn", "po2", "bool", "float16")
    # A Table 4 row: bool dW, int5 dY, l2 BN.
    row = apply_overrides(std, ["approx.dw=bool", "approx.dy=int", "approx.dy_bits=5"])
    assert (row.approx.bn, row.approx.dy, row.approx.dw) == ("l2", "int", "bool")
    # Explicit choices survive a later scheme change.
    again = apply_overrides(row, ["approx.scheme=proposed"])
    assert again.approx.dy == "int" and again.approx.bn == "l1_bnn"


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.batch_size=0", ["train.batch_size", "0", ">= 1"]),
        ("approx.dy_bits=9", ["approx.dy_bits", "9", "<= 8"]),
        ("optimizer.name=rmsprop", ["optimizer.name", "rmsprop", "bop"]),
        ("optimizer.iir.alpha=0", ["optimizer.iir.alpha", "> 0.0"]),
        ("e2train.smd_prob=1.0", ["e2train.smd_prob", "< 1.0"]),
        ("train.epochs=2.5", ["train.epochs", "2.5", "int"]),
        ("train.nonsense=1", ["nonsense", "known"]),
        ("approx.bn=batch", ["approx.bn", "l1_bnn"]),
        ("optimizer.switch.undo=3", ["optimizer.switch.undo", "true or false"]),
    ],
)
def test_bad_values_fail_naming_field_value_and_limit(override, words):
    with pytest.raises(ConfigError) as err:
        apply_overrides(load_config("mlp"), [override])
    for w in words:
        assert w in str(err.value)


def test_topology_errors_are_caught_at_load_time():
    base = {"model": {"input_shape": [1, 8, 8], "num_classes": 10}}
    cases = [
        ([{"type": "dense", "units": 5}], "num_classes"),
        ([{"type": "conv", "channels": 4, "kernel": 9}, {"type": "dense", "units": 10}], "does not fit"),
        (
            [{"type": "dense", "units": 4}, {"type": "conv", "channels": 4}, {"type": "dense", "units": 10}],
            "cannot follow",
        ),
        ([{"type": "pool"}], "type"),
        ([{"type": "dense"}], "units is required"),
        ([{"type": "conv", "channels": 2, "padding": "full"}], "padding"),
        ([{"type": "conv", "channels": 2, "kernel": 4, "padding": "same"}], "odd kernel"),
        ([{"type": "dense", "units": 10, "kernel": 3}], "not a field"),
        ([], "empty"),
    ]
    for layers, words in cases:
        with pytest.raises(ConfigError, match=words):
            config_from_dict({**base, "model": {**base["model"], "layers": layers}})


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ConfigError, match="bad.toml: not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="unknown model preset"):
        config_from_dict({"preset": "resnet"})


def test_a_file_can_start_from_a_preset(tmp_path):
    f = tmp_path / "small.toml"
    f.write_text('preset = "mlp"\n[train]\nbatch_size = 20\n[optimizer]\nname = "bop"\n')
    cfg = load_config(f)
    assert cfg.train.batch_size == 20 and cfg.optimizer.name == "bop"
    assert cfg.n_weights == 399_872 and cfg.train.lr.initial == 0.001
