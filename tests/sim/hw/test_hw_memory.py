"""On-chip memory accounting of the hardware model (docs/arithmetic.md section 10)."""

from sim.config import apply_overrides, load_config
from sim.hw.memory import ZYNQ7020_KIB, memory_report


def test_default_fits_zynq7020():
    cfg = load_config("mlp")
    r = memory_report(cfg)
    assert ZYNQ7020_KIB == 630.0
    assert r["optimizer"] == cfg.hw.optimizer and r["fits"]
    assert r["n_weights"] == 399_872
    # weights + state = n_weights x bits / 8 / 1024
    assert abs(r["weights_state_kib"] - 399_872 * r["bits_per_weight"] / 8192) < 0.01
    assert abs(r["total_kib"] - r["weights_state_kib"] - r["buffers_kib"]) < 0.05
    assert r["total_kib"] <= 630.0


def test_latent_baselines_do_not_fit_and_binary_input_shrinks_buffers():
    cfg = apply_overrides(load_config("mlp"), ["hw.input=int8"])
    assert not memory_report(apply_overrides(cfg, ["hw.optimizer=sgd"]))["fits"]
    assert not memory_report(apply_overrides(cfg, ["hw.optimizer=iir"]))["fits"]
    a = memory_report(cfg)["buffers_kib"]
    b = memory_report(apply_overrides(cfg, ["hw.input=binary"]))["buffers_kib"]
    assert a - b >= 100 * 784 * 7 / 8192  # at least 7 bits per retained input pixel saved
