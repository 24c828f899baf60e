"""The description hash covers the hardware only (rtl_gen.contract.description_hash, issue 34 section 4).

Fields only the host uses (seed, epochs, data, learning rate, the float reference's settings) leave the hash, and so
the Verilog, as they are: a new seed reuses the simulated board. Any other field changes the hash, and the driver
refuses the description on a bitstream built from the other one."""

from __future__ import annotations

import pytest
from small_mlp import SMALL

from host.driver import Driver
from host.errors import HardwareMismatch
from host.transports.base import BlockingTransport
from rtl_gen.contract import HOST_ONLY_CONFIG, description_hash
from rtl_gen.top import Accelerator, SystemPlan
from sim.config import apply_overrides, load_config

# one change of every host-only entry of the contract (a section: one of its fields)
HOST_ONLY_CHANGES = {
    "name": "name=another_run",
    "preset": None,  # not a --set field: set on the loaded configuration below
    "data": "data.train_limit=200",
    "optimizer": "optimizer.switch.lam=0.3",
    "e2train": "e2train.smd_prob=0.5",
    "train.epochs": "train.epochs=3",
    "train.max_steps": "train.max_steps=7",
    "train.seed": "train.seed=1234",
    "train.eval_batch_size": "train.eval_batch_size=50",
    "train.lr": "train.lr.initial=0.01",
}
HOST_ONLY_MORE = ["data.test_limit=100", "data.dither=false", "optimizer.iir.decay_every=3", "train.lr.schedule=step"]


def small(*extra, preset: str = "mlp"):
    cfg = apply_overrides(load_config("mlp"), SMALL + [e for e in extra if e])
    cfg.preset = preset
    return cfg


class Bitstream(BlockingTransport):
    """The registers of a built accelerator as the bus reads them: every register at its build-time value."""

    def __init__(self, plan):
        self.map = plan.regmap

    def read(self, addr):
        return sum(f.encode(f.reset) for f in self.map.at(addr).fields)


def test_every_host_only_entry_has_a_change_here():
    assert set(HOST_ONLY_CHANGES) == set(HOST_ONLY_CONFIG)


def test_host_only_fields_leave_the_hash_and_the_verilog_as_they_are():
    base = SystemPlan(small())
    other = SystemPlan(small(*HOST_ONLY_CHANGES.values(), *HOST_ONLY_MORE, preset="another"))
    assert other.description().config != base.description().config  # accelerator.json keeps them for the host
    assert other.description().schedule["lr0"] == 0.01
    assert other.desc_hash == base.desc_hash
    assert Accelerator(other).verilog() == Accelerator(base).verilog()


@pytest.mark.parametrize("change", ["hw.rng_seed=5", "hw.switch_lambda=0.25", "hw.dw_window=0", "train.batch_size=2",
                                    "hw.lanes_out=4", "approx.dy_bits=4"])
def test_a_hardware_field_changes_the_hash(change):
    assert SystemPlan(small(change)).desc_hash != SystemPlan(small()).desc_hash


def test_connect_takes_a_new_seed_and_refuses_other_hardware():
    built = SystemPlan(small())  # the bitstream
    run = SystemPlan(small("train.seed=99", "train.epochs=2", "data.train_limit=400", "train.lr.initial=0.004"))
    drv = Driver(run.description(), Bitstream(built))  # connects: same hardware, another training run
    assert drv.read_register("id_hash")["value"] == description_hash(run.description())
    other = SystemPlan(small("hw.rng_seed=5"))  # the generators' power-on seed: the identification fields agree
    with pytest.raises(HardwareMismatch, match=r"description hash \(id_hash\)") as e:
        Driver(other.description(), Bitstream(built))
    assert len(e.value.fields) == 1  # only the hash tells the two apart
