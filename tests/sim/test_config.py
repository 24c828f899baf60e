"""The configuration: presets, validation messages, overrides, round trips."""

import re

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
        ([{"type": "conv", "channels": 2}, {"type": "maxpool", "before_bn": 1}, {"type": "dense", "units": 10}],
         "before_bn = 1: expected true or false"),
        ([{"type": "maxpool", "before_bn": True}, {"type": "dense", "units": 10}], r"layers\[0\].before_bn = true"),
        ([{"type": "conv", "channels": 2}, {"type": "maxpool"}, {"type": "maxpool", "before_bn": True},
          {"type": "dense", "units": 10}], "only a maxpool right after a conv layer"),
        ([{"type": "dense", "units": 4, "before_bn": True}, {"type": "dense", "units": 10}], "not a field"),
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


def test_files_that_cannot_be_read_are_errors_naming_the_file(tmp_path):
    """A folder, a path through a file, non-UTF-8 bytes, a non-string preset: one ConfigError naming the file."""
    (tmp_path / "folder.toml").mkdir()
    (tmp_path / "plain").write_text("x")
    latin = tmp_path / "latin1.toml"
    latin.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    listed = tmp_path / "listed.toml"
    listed.write_text('preset = ["mlp"]\n')
    cases = [
        (tmp_path / "folder.toml", "is a folder"),
        (tmp_path / "plain" / "x.toml", "not found"),
        (latin, "not a UTF-8 text file"),
        (listed, "preset = ['mlp']: expected a string"),
    ]
    for path, words in cases:
        with pytest.raises(ConfigError) as err:
            load_config(path)
        msg = str(err.value)
        assert msg.startswith(f"{path}: ") and words in msg and "\n" not in msg, msg
    # a field error in a file names the file and the field
    bad = tmp_path / "bad_field.toml"
    bad.write_text('preset = "mlp"\n[train]\nbatch_size = -1\n')
    with pytest.raises(ConfigError, match=r"bad_field.toml: train.batch_size = -1 is out of range"):
        load_config(bad)


@pytest.mark.parametrize("section", ["model", "data", "train", "train.lr", "approx", "optimizer", "optimizer.bop",
                                     "e2train", "hw"])
@pytest.mark.parametrize("value", ["0", "x", "[1, 2]", "true"])
def test_a_section_set_to_a_value_is_refused_naming_it(section, value):
    with pytest.raises(ConfigError) as err:
        apply_overrides(load_config("mlp"), [f"{section}={value}"])
    msg = str(err.value)
    assert f"{section} is a section, not a value" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match=f"{section}: expected a table"):
        config_from_dict({**_nested(section, 0), "preset": "mlp"})


def _nested(dotted: str, value) -> dict:
    out: dict = {}
    node = out
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


@pytest.mark.parametrize("key", ["name", "train.batch_size", "approx.bn_eps", "hw.lanes_in", "optimizer.name",
                                 "e2train.psg", "train.lr.milestones"])
@pytest.mark.parametrize("value", ["{a = 1}", "{}", "[[1]]"])
def test_a_value_set_to_a_table_or_wrong_list_is_refused(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        apply_overrides(load_config("mlp"), [f"{key}={value}"])


def test_milestones_are_epoch_numbers_not_booleans():
    with pytest.raises(ConfigError, match="train.lr.milestones"):
        apply_overrides(load_config("mlp"), ["train.lr.milestones=[true]"])


@pytest.mark.parametrize("override, words", [
    ("optimizer.lr=1e300", ["optimizer.lr", "<= 10.0"]),
    ("optimizer.lr=11", ["optimizer.lr", "<= 10.0"]),
    ("optimizer.lr=1e-300", ["optimizer.lr", "2**-63", "lr_shift"]),
    ("train.lr.initial=1e-300", ["train.lr.initial", ">= 1.0842021724855044e-19 (2**-63)"]),
    ("train.lr.initial=1e300", ["train.lr.initial", "<= 10.0"]),
    ("train.lr.min=1e300", ["train.lr.min", "<= 10.0"]),
])
def test_learning_rates_have_the_hardwares_and_the_schedules_limits(override, words):
    with pytest.raises(ConfigError) as err:
        apply_overrides(load_config("mlp"), [override])
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("override, words", [
    ("hw.lanes_in=abc", "hw.lanes_in = 'abc': expected an integer; allowed: >= 1"),
    ("hw.lanes_in=1.5", "hw.lanes_in = 1.5: expected an integer"),
    ("train.lr.initial=abc", "train.lr.initial = 'abc': expected a number; allowed: >= "),
    ("train.batch_size=true", "train.batch_size = True: expected an integer"),
])
def test_a_value_of_the_wrong_type_names_the_field_and_the_type(override, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        apply_overrides(load_config("mlp"), [override])


def test_learning_rates_at_the_limits_are_accepted_and_represented_by_the_hardware():
    from sim.config import LR_MAX, LR_MIN
    from sim.hw.optim import lr_shift

    for lr in (0.0, LR_MIN, 1e-3, LR_MAX):
        cfg = apply_overrides(load_config("mlp"), [f"optimizer.lr={lr!r}"])
        assert cfg.optimizer.lr == lr
    assert lr_shift(LR_MIN) == 63  # the largest shift of the 6-bit lr_shift register, not beyond it
    assert apply_overrides(load_config("mlp"), [f"train.lr.initial={LR_MIN!r}"]).lr == LR_MIN


@pytest.mark.parametrize("override, words", [
    ("hw.lanes_in=3", "hw.lanes_in = 3: must divide 32"),
    ("hw.lanes_in=48", "hw.lanes_in = 48: must divide 32"),
    ("hw.update_lanes=3", "hw.update_lanes = 3 must divide lanes_in = 64"),
    ("hw.rng_block=48", "hw.rng_block = 48 must be a multiple of layer 0's lanes_in = 64"),
    ("hw.loss_lanes=3", "hw.loss_lanes = 3 must divide the output layer's lanes_out = 16"),
    ("hw.po2_lanes=3", "hw.po2_lanes = 3 must divide lanes_out = 16"),
    ("hw.lanes_out=128", "hw.lanes_out = 128: layer"),
])
def test_rtl_lane_constraints_are_checked_when_the_configuration_loads(override, words):
    """What ``xnortrain generate`` would refuse, ``xnortrain config`` refuses: the check is the generator's
    (sim.hw_config.layer_lanes, used by rtl_gen.top.SystemPlan)."""
    with pytest.raises(ConfigError) as err:
        apply_overrides(load_config("mlp"), [override])
    assert words in str(err.value)


def test_the_generators_plan_takes_its_lanes_from_the_shared_check():
    from rtl_gen.buffers import BEAT_BITS
    from rtl_gen.top import SystemPlan
    from sim.hw_config import STREAM_BITS, layer_lanes

    assert STREAM_BITS == BEAT_BITS
    cfg = apply_overrides(load_config("mlp"), ['model.layers=[{type="dense",units=20},{type="dense",units=10}]',
                                               "hw.lanes_in=32", "hw.lanes_out=8", "hw.update_lanes=8"])
    plan = SystemPlan(cfg)
    got = [(lp.lanes_in, lp.lanes_out, lp.lanes_b, lp.update_lanes, lp.dw_passes, lp.dx_passes) for lp in plan.layers]
    assert got == [(x.lanes_in, x.lanes_out, x.lanes_b, x.update_lanes, x.dw_passes, x.dx_passes)
                   for x in layer_lanes(cfg)]
    # the conv presets are not built by the generator: their hw lanes are not checked against their layers
    assert load_config("cnv").hw.lanes_in == 64


@pytest.mark.parametrize("name", ["two\nlines", "cr\rlf", "tab\t", 'quo"te', "back\\slash", "nul\x00", "del\x7f",
                                  "ünï ✓", "'single'", "trailing\\"])
def test_every_accepted_string_reloads_to_itself(tmp_path, name):
    # (``name`` names files, so it takes plain names only: sim.config.check_name)
    cfg = apply_overrides(load_config("mlp"), {"data.path": name})
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml(), encoding="utf-8")
    again = load_config(path)
    assert again.data.path == name and again.to_dict() == cfg.to_dict()


def test_strings_that_cannot_be_written_are_refused():
    with pytest.raises(ConfigError, match="name = .*not valid Unicode"):
        apply_overrides(load_config("mlp"), {"name": "bad\udcff"})


def test_unknown_keys_with_odd_names_give_one_line():
    for key in ("a\nb", "with space", ""):
        with pytest.raises(ConfigError) as err:
            config_from_dict({"preset": "mlp", "train": {key: 1}})
        assert "\n" not in str(err.value) and repr(key) in str(err.value)


def test_the_rtls_layer_count_is_checked_when_the_configuration_loads():
    from sim.hw_config import LAYER_FIELD_BITS

    most = (1 << LAYER_FIELD_BITS) - 1
    layers = ",".join(['{type="dense",units=8}'] * (most - 1) + ['{type="dense",units=10}'])
    assert len(apply_overrides(load_config("mlp"), [f"model.layers=[{layers}]"]).weight_layers()) == most
    layers = '{type="dense",units=8},' + layers
    with pytest.raises(ConfigError, match=f"model.layers: {most + 1} weight layers; .* at most {most} layers"):
        apply_overrides(load_config("mlp"), [f"model.layers=[{layers}]"])
