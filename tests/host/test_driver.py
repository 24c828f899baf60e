"""host.driver against a mock bus: packing, layouts, the description file, and the exact register and
stream transactions of every driver operation (blocking and async transports run the same programs)."""

import asyncio
import sys
import time

import numpy as np
import pytest
from mock_accelerator import (
    AsyncMockTransport,
    B,
    C,
    F,
    MockAccelerator,
    MockTransport,
    batch,
    make_desc,
    random_state,
)

from host.driver import Driver
from host.errors import AcceleratorError, AcceleratorTimeout, HardwareMismatch, StateError
from host.transports.base import BlockingTransport, Read, Send
from host.transports.pynq import PynqTransport
from rtl_gen.contract import AcceleratorDescription, QuantityLayout, description_hash, pack_words, unpack_words

# --- packing --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits, per, signed", [(1, 32, False), (1, 8, False), (7, 4, True), (8, 4, True),
                                               (24, 1, True), (32, 1, False), (11, 5, True), (1, 64, False)])
def test_pack_unpack_roundtrip(bits, per, signed):
    rng = np.random.default_rng(bits * 100 + per)
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
    v = rng.integers(lo, hi, per * 6, dtype=np.int64)
    words = pack_words(v, elem_bits=bits, elems_per_word=per)
    assert words.dtype == np.uint32 and len(words) == 6 * -(-bits * per // 32)
    assert (unpack_words(words, elem_bits=bits, elems_per_word=per, signed=signed) == v).all()


def test_packing_bit_positions():
    # element e at bits e * elem_bits, words LSB beat first
    w = pack_words(np.array([1, 2, 3]), elem_bits=12, elems_per_word=3)
    assert w.tolist() == [1 | 2 << 12 | (3 & 0xFF) << 24, 3 >> 8]
    assert pack_words(np.array([-1, 0]), elem_bits=4, elems_per_word=2).tolist() == [0xF]


def test_quantity_layout_order_and_padding():
    # a (5, 3) array, padded to (8, 4), stored as (group, word, lane, bit) with 4 bits per word, 2 lanes
    q = QuantityLayout("w", 0, 0, (5, 3), elem_bits=1, elems_per_word=4, pad=(8, 4), reshape=(2, 4, 2, 2),
                       transpose=(2, 0, 3, 1), encoding="sign")
    w = np.where(np.random.default_rng(0).random((5, 3)) < 0.5, -1, 1).astype(np.int8)
    words = q.encode(w)
    assert len(words) == q.beats == 8
    assert (q.decode(words) == w).all() and q.decode(words).dtype == np.int8
    # stream element 0..3 = padded[(k=0, b=0..3), (g=0, l=0)] = column 0, rows 0..3
    col0 = [(int(v) > 0) for v in w[:4, 0]]
    assert words[0] == sum(int(b) << i for i, b in enumerate(col0))
    with pytest.raises(ValueError, match="shape"):
        q.encode(w.T)
    with pytest.raises(ValueError, match="pad"):
        QuantityLayout("x", 0, 0, (5,), 1, 1, pad=(4,), reshape=(4,), transpose=(0,))


def test_quantity_layout_range_check():
    q = QuantityLayout("acc", 0, 1, (4,), elem_bits=7, elems_per_word=4, pad=(4,), reshape=(4,), transpose=(0,),
                       signed=True)
    q.encode(np.array([-64, 63, 0, 1]))
    with pytest.raises(ValueError, match="do not fit 7 bits"):
        q.encode(np.array([64, 0, 0, 0]))


# --- tests ----------------------------------------------------------------------------------------------


def test_description_json_roundtrip(tmp_path):
    d = make_desc()
    path = d.write_json(tmp_path / "accelerator.json")
    e = AcceleratorDescription.from_json(path)
    assert e.to_dict() == d.to_dict()
    assert e.regmap == d.regmap
    with pytest.raises(ValueError, match="not an accelerator description"):
        AcceleratorDescription.from_dict({"format": "other"})


def test_batch_words_layout_and_checks():
    drv = Driver(make_desc(), MockTransport(MockAccelerator(make_desc())))
    x, y = batch()
    words = drv.batch_words(x, y)
    assert len(words) == B + 1  # one 32-bit word per 20-bit row, 4 labels in one word
    assert words[0] == sum(1 << i for i in range(F) if x[0, i] > 0)
    assert words[-1] == sum(int(v) << (8 * i) for i, v in enumerate(y))
    with pytest.raises(ValueError, match="labels must be in 0..2"):
        drv.batch_words(x, np.array([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="expected x of shape"):
        drv.batch_words(x[:3], y)


def test_train_step_transactions_are_exact():
    desc = make_desc()
    acc = MockAccelerator(desc)
    drv = Driver(desc, MockTransport(acc))
    acc.log.clear()  # the connect check's reads (test_constructor_reads_...)
    x, y = batch()
    logits = np.array([[256, -10, 5], [0, 300, -2], [1, 2, 3], [-5, -6, 100]])
    acc.memory[(desc.kinds["logits"], 1)] = desc.quantity("logits", 1).encode(logits)
    r = drv.train_step(x, y, lr=1e-3)
    m = desc.regmap
    cmd = lambda name: m.encode("cmd", **{name: 1})  # noqa: E731
    expected_start = [
        ("write", "sched", m.encode("sched", lr_shift=10, opt_shift=0, switch_gate=1 << 16)),
        ("write", "arg", m.encode("arg", batch=B)),
        ("write", "done", m["done"].field("upload").mask),
        ("write", "cmd", cmd("upload")),
        ("read", "error", 0),
        ("send", B + 1),
    ]
    assert acc.log[: len(expected_start)] == expected_start
    kinds = [e[:2] for e in acc.log]
    assert ("write", "cmd") in kinds and acc.log.count(("write", "cmd", cmd("train"))) == 1
    assert ("receive", desc.quantity("logits", 1).beats) in acc.log
    assert r.cycles == 1234 and r.correct == 2
    assert (r.logits == logits).all()
    from sim.hw.arith import ArithParams, loss_grad

    assert r.loss == loss_grad(logits, y, ArithParams())[1]
    # the schedule is written again only when it changes
    n_sched = sum(1 for e in acc.log if e[1] == "sched")
    drv.train_step(x, y, lr=1e-3)
    assert sum(1 for e in acc.log if e[1] == "sched") == n_sched
    drv.train_step(x, y, lr=2.5e-4)
    assert sum(1 for e in acc.log if e[1] == "sched") == n_sched + 1


def test_refused_command_raises_with_flags_and_clears_them():
    desc = make_desc()
    acc = MockAccelerator(desc)
    drv = Driver(desc, MockTransport(acc))
    acc.running = "train"  # the accelerator is busy
    with pytest.raises(AcceleratorError, match="busy") as info:
        drv.read("beta", 0)
    assert info.value.flags == ("busy",)
    assert acc.regs.values["error", "busy"] == 0  # cleared by the driver
    acc.running = None
    with pytest.raises(AcceleratorError, match="layer"):
        drv.transport.execute(drv._command("readback", layer=5, quantity=0))


def test_timeout_aborts():
    desc = make_desc()
    acc = MockAccelerator(desc, hang=True)
    t = MockTransport(acc)
    drv = Driver(desc, t, poll_cycles=10, timeout_cycles=1000)
    x, y = batch()
    with pytest.raises(AcceleratorTimeout, match="upload not done after"):
        drv.upload(x, y)
    assert ("write", "cmd", desc.regmap.encode("cmd", abort=1)) in acc.log
    assert t.sleeps[:4] == [10, 20, 40, 80] and max(t.sleeps) == 640


def test_state_dict_roundtrip_through_restore_and_readback():
    desc = make_desc()
    acc = MockAccelerator(desc)
    drv = Driver(desc, MockTransport(acc))
    state = random_state(desc, 3)
    drv.load_state_dict(state)
    back = drv.state_dict()
    assert set(back) == set(state)
    for k in state:
        assert (np.asarray(back[k]) == np.asarray(state[k])).all(), k
    with pytest.raises(ValueError, match="read-only"):
        drv.write("logits", 1, np.zeros((B, C)))


def test_async_transport_runs_the_same_program():
    desc = make_desc()
    acc_a, acc_b = MockAccelerator(desc), MockAccelerator(desc)
    x, y = batch(1)
    Driver(desc, MockTransport(acc_a), check=False).upload(x, y)
    asyncio.run(Driver(desc, AsyncMockTransport(acc_b)).upload(x, y))
    assert acc_a.log == acc_b.log


def test_programs_yield_plain_operations():
    drv = Driver(make_desc(), MockTransport(MockAccelerator(make_desc())))
    prog = drv._read_fields("id")
    op = next(prog)
    assert op == Read(drv.map.addr("id"))
    with pytest.raises(StopIteration) as stop:
        prog.send(drv.map["id"].reset_word)
    assert stop.value.value == {"magic": 0x584E, "version": 2}
    up = drv._upload(*batch())
    ops = [next(up)]
    while not isinstance(ops[-1], Send):
        ops.append(up.send(0))
    assert len(ops[-1].words) == B + 1


def test_pynq_is_never_imported():
    assert "pynq" not in sys.modules
    with pytest.raises(ImportError):
        PynqTransport(object())


# --- the connect check: the hardware must be the accelerator accelerator.json describes ----------------------


def test_constructor_reads_the_identification_and_geometry_registers():
    desc = make_desc()
    acc = MockAccelerator(desc)
    Driver(desc, MockTransport(acc))
    assert [e[:2] for e in acc.log] == [("read", "id"), ("read", "info"), ("read", "info_batch"),
                                        ("read", "id_hash")]


@pytest.mark.parametrize("reg, fld, value", [
    ("id", "magic", 0x1234),  # another design behind the address
    ("id", "version", 1),  # a bitstream of the register map before the description hash
    ("info", "layers", 3),
    ("info", "classes", 10),
    ("info", "input_int8", 1),
    ("info", "optimizer", 1),
    ("info_batch", "batch", 8),
])
def test_connect_mismatch_names_register_expected_and_read(reg, fld, value):
    desc = make_desc()
    acc = MockAccelerator(desc)
    acc.regs.values[reg, fld] = value  # the bitstream was built for something else
    expected = desc.regmap[reg].field(fld).reset
    with pytest.raises(HardwareMismatch, match=rf"{reg}\.{fld}: accelerator.json {expected}, hardware {value}\b"):
        Driver(desc, MockTransport(acc))
    assert not [e for e in acc.log if e[0] != "read"]  # nothing was written to the wrong device


def test_connect_reports_every_mismatching_field_and_a_dead_bus():
    desc = make_desc()
    acc = MockAccelerator(desc)
    t = MockTransport(acc)
    t.read = lambda addr: 0xFFFFFFFF  # nothing answers (a bus that reads all ones)
    with pytest.raises(HardwareMismatch, match=r"id\.magic: accelerator.json 22606, hardware 65535.*"
                                                r"info_batch\.batch: accelerator.json 4, hardware 65535"):
        Driver(desc, t)


def test_description_hash_ignores_its_own_register_and_the_clock_and_survives_the_json_file(tmp_path):
    desc = make_desc()
    h = description_hash(desc)
    assert desc.regmap["id_hash"].field("value").reset == h != 0
    assert description_hash(AcceleratorDescription.from_json(desc.write_json(tmp_path / "a.json"))) == h
    assert description_hash(desc.to_dict()) == h
    desc.clock_mhz = 142.0  # a bitstream-build setting, compared with the overlay by PynqTransport instead
    assert description_hash(desc) == h
    d = desc.to_dict()
    d["regmap"]["registers"][[r["name"] for r in d["regmap"]["registers"]].index("id_hash")]["reset"] = 123
    assert description_hash(d) == h


@pytest.mark.parametrize("edit", [
    lambda d: d.update(layers=[[F, 16], [16, C]]),  # a hidden layer's width
    lambda d: d["quantities"][0].update(elems_per_word=4),  # a lane count (elements per word of w0)
    lambda d: d["batch_layout"].update(elem_bits=2),  # the batch format
    lambda d: d.update(config=d["config"] + "[hw]\nlanes_in = 32\n"),  # a hardware field of the configuration
    lambda d: d["schedule"].update(switch_cutoff=62),
    lambda d: d["regmap"]["registers"][-1].update(addr=d["regmap"]["registers"][-1]["addr"] + 4),  # the map
])
def test_description_hash_changes_with_anything_the_host_relies_on(edit):
    d = make_desc().to_dict()
    h = description_hash(d)
    edit(d)
    assert description_hash(d) != h


def test_description_hash_leaves_out_what_only_the_host_uses():
    d = make_desc().to_dict()
    d.update(config="[train]\nbatch_size = 4\n")
    h = description_hash(d)
    d.update(config="# run 2\nname = 'run2'\n[data]\ntrain_limit = 9\n[train]\nbatch_size = 4\nseed = 3\nepochs = 2\n")
    d["schedule"].update(lr0=0.5, epochs=2)
    assert description_hash(d) == h


def test_connect_refuses_a_description_of_another_width_by_its_hash():
    acc = MockAccelerator(make_desc())  # the bitstream: hidden layer 8 wide
    other = make_desc(hidden=16)  # same id / info / info_batch fields, another hidden width
    assert description_hash(other) != description_hash(acc.desc)
    with pytest.raises(HardwareMismatch, match=rf"description hash \(id_hash\): accelerator.json "
                                               rf"{description_hash(other):#010x}, hardware "
                                               rf"{description_hash(acc.desc):#010x}") as e:
        Driver(other, MockTransport(acc))
    assert len(e.value.fields) == 1  # every other identity field agrees: only the hash tells them apart
    assert not [e for e in acc.log if e[0] != "read"]


def test_connect_refuses_an_edited_description_whose_map_still_records_the_hash():
    desc = make_desc()
    acc = MockAccelerator(desc)
    desc.schedule["switch_cutoff"] = 62  # edited by hand: the register map still records the bitstream's hash
    with pytest.raises(HardwareMismatch, match=r"description hash"):
        Driver(desc, MockTransport(acc))


def test_connect_refuses_a_description_without_the_hash_register():
    desc = make_desc()
    d = desc.to_dict()  # as the generator wrote it before the hash register existed
    d["regmap"]["registers"] = [r for r in d["regmap"]["registers"] if r["name"] != "id_hash"]
    old = AcceleratorDescription.from_dict(d)
    with pytest.raises(HardwareMismatch, match=r"accelerator.json \(mock\) has no 'id_hash' register.*regenerate"):
        Driver(old, MockTransport(MockAccelerator(desc)))


def test_connect_compares_with_the_description_fields_too():
    # a description whose batch was edited by hand: its register map still says 4, the driver would pack 8
    desc = make_desc()
    acc = MockAccelerator(desc)
    desc.batch = 8
    with pytest.raises(HardwareMismatch, match=r"info_batch\.batch: accelerator.json 8, hardware 4"):
        Driver(desc, MockTransport(acc))


def test_connect_can_be_skipped_and_run_later_blocking_and_async():
    desc = make_desc()
    acc = MockAccelerator(desc)
    acc.regs.values["info_batch", "batch"] = 8
    drv = Driver(desc, MockTransport(acc), check=False)
    assert acc.log == []
    with pytest.raises(HardwareMismatch, match="info_batch.batch"):
        drv.connect()
    adrv = Driver(desc, AsyncMockTransport(acc))  # an async transport cannot run it in the constructor
    with pytest.raises(HardwareMismatch, match="info_batch.batch"):
        asyncio.run(adrv.connect())
    acc.regs.values["info_batch", "batch"] = B
    assert asyncio.run(adrv.connect())["info_batch"] == {"batch": B}


# --- every wait is bounded in wall time -------------------------------------------------------------------


class NoSleepTransport(MockTransport):
    """Sleep returns at once (no time passes); a guard fails the test if polling goes on for seconds."""

    def __init__(self, acc, guard_s=3.0):
        super().__init__(acc)
        self.reads = 0
        self.guard = time.monotonic() + guard_s

    def read(self, addr):
        self.reads += 1
        assert time.monotonic() < self.guard, f"still polling after {self.reads} reads"
        return super().read(addr)

    def sleep(self, cycles):
        pass


def test_wait_done_has_a_wall_time_budget():
    desc = make_desc()
    acc = MockAccelerator(desc, hang=True)
    drv = Driver(desc, NoSleepTransport(acc), poll_cycles=1, timeout_cycles=1 << 62, timeout_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(AcceleratorTimeout, match=r"upload not done after [0-9.]+ s \([0-9]+ cycles; budget 0.05 s"):
        drv.upload(*batch())
    assert time.monotonic() - t0 < 1.0
    assert ("write", "cmd", desc.regmap.encode("cmd", abort=1)) in acc.log


def test_default_wall_time_budget_follows_the_cycle_budget():
    desc = make_desc()
    drv = Driver(desc, MockTransport(MockAccelerator(desc)), timeout_cycles=100_000_000)
    assert drv.timeout_s == pytest.approx(max(60.0, 2 * 100_000_000 / (desc.clock_mhz * 1e6)))
    with pytest.raises(ValueError, match="timeout_s"):
        Driver(desc, MockTransport(MockAccelerator(desc)), timeout_s=0)


# --- restore: the whole state is checked before anything is written -------------------------------------------


def _drop(key):
    return lambda s: s.pop(key)


def _set(key, value):
    return lambda s: s.__setitem__(key, value)


def _poke(key, index, value):
    def f(s):
        a = np.array(s[key], dtype=np.int64)
        a[index] = value
        s[key] = a
    return f


BROKEN_STATES = {
    "a late quantity missing": (_drop("beta1"), r"'beta1' is missing"),
    "rng missing": (_drop("rng"), r"'rng' is missing"),
    "steps missing": (_drop("steps"), r"'steps' is missing"),
    "unknown key": (_set("m0", np.zeros((F, 8), np.int64)), r"'m0'.* not held by the accelerator"),
    "wrong shape": (lambda s: s.__setitem__("acc1", s["acc1"].T), r"'acc1'.* shape \(3, 8\).* \(8, 3\)"),
    "float values": (lambda s: s.__setitem__("beta1", s["beta1"].astype(np.float64)), r"'beta1'.* float64"),
    "out of range, high": (_poke("acc1", (2, 1), 64), r"'acc1'.* 64 .*-64\.\.63"),
    "out of range, low": (_poke("beta1", 0, -(1 << 23) - 1), r"'beta1'.* -8388609"),
    "weight 0": (_poke("w1", (0, 0), 0), r"'w1'.* \+-1"),
    "rng zero": (_poke("rng", 9, 0), r"'rng'.* generator 9 .*0"),
    "rng too short": (lambda s: s.__setitem__("rng", s["rng"][:-1]), r"'rng'.* 10 generators.* 11"),
    "rng beyond 32 bits": (_poke("rng", 0, 1 << 32), r"'rng'.* 4294967296"),
    "negative steps": (_set("steps", np.array(-1)), r"'steps'.* -1"),
    "steps not a scalar": (_set("steps", np.array([1, 2])), r"'steps'.* shape \(2,\)"),
}


@pytest.mark.parametrize("name", list(BROKEN_STATES))
def test_restore_checks_the_whole_state_before_writing(name):
    desc = make_desc()
    acc = MockAccelerator(desc)
    drv = Driver(desc, MockTransport(acc))
    acc.log.clear()
    state = random_state(desc, 3)
    breakage, message = BROKEN_STATES[name]
    breakage(state)
    with pytest.raises(StateError, match=message):
        drv.load_state_dict(state)
    assert acc.log == []  # not one register or stream word went to the accelerator
    with pytest.raises(StateError, match=message):
        drv.check_state(state)


def test_restore_accepts_what_state_dict_returns_and_any_integer_dtype():
    desc = make_desc()
    acc = MockAccelerator(desc)
    drv = Driver(desc, MockTransport(acc))
    state = random_state(desc, 3)
    state = {k: (v.astype(np.int32) if k.startswith(("acc", "beta")) else v) for k, v in state.items()}
    drv.load_state_dict(state)
    back = drv.state_dict()
    drv.load_state_dict(back)
    for k in state:
        assert (np.asarray(drv.state_dict()[k]) == np.asarray(state[k])).all(), k


# --- restore: the bit-exact model's check of the state, from the description's configuration --------------------


def _small_description():
    from rtl_gen.top import SystemPlan
    from sim.config import apply_overrides, load_config

    cfg = apply_overrides(load_config("mlp"), [
        "model.input_format=binary", "train.batch_size=4", "hw.lanes_in=32", "hw.lanes_out=8", "hw.lanes_b=2",
        "hw.update_lanes=8", 'model.layers=[{type="dense",units=12},{type="dense",units=10}]'])
    return cfg, SystemPlan(cfg).description()


class NoBusTransport(BlockingTransport):
    """Fails the test on any bus operation: the state check must refuse before the first one."""

    def _do(self, op):
        raise AssertionError(f"bus operation {op!r} before the state was checked")


def test_restore_applies_the_models_state_check_from_the_description_config():
    from sim.hw.model import HwModel

    cfg, desc = _small_description()
    drv = Driver(desc, NoBusTransport(), check=False)
    assert drv.model_config().to_toml() == cfg.to_toml()
    state = HwModel(cfg).state_dict()
    drv.check_state(state)
    # -64 fits the accumulators' 7-bit field (-64..63), hw.switch_cutoff = 63 bounds them to +-63
    cut = cfg.hw.switch_cutoff
    assert -(cut + 1) >= -(1 << (desc.quantity("acc", 1).elem_bits - 1))
    state["acc1"][2, 3] = -(cut + 1)
    with pytest.raises(StateError, match=rf"acc1\[2, 3\] = {-(cut + 1)} is outside \[-{cut}, {cut}\]"):
        drv.load_state_dict(state)
    # without the configuration only the description's (bit width) check applies
    desc.config = ""
    Driver(desc, NoBusTransport(), check=False).check_state(state)


# --- infer ------------------------------------------------------------------------------------------------


def test_infer_uploads_n_samples_runs_infer_and_reads_the_classes():
    desc = make_desc()
    acc = MockAccelerator(desc)
    drv = Driver(desc, MockTransport(acc))
    x, _ = batch()
    acc.log.clear()
    got = drv.infer(x[:3])
    m = desc.regmap
    assert acc.log[:5] == [
        ("write", "arg", m.encode("arg", batch=3)),
        ("write", "done", m["done"].field("upload").mask),
        ("write", "cmd", m.encode("cmd", upload=1)),
        ("read", "error", 0),
        ("send", 3 + 1),  # three 20-bit rows, then the three labels in one word
    ]
    assert acc.log.count(("write", "cmd", m.encode("cmd", infer=1))) == 1
    assert ("receive", desc.quantity("classes").beats) in acc.log
    assert ("receive", desc.quantity("logits", 1).beats) not in acc.log
    assert got.shape == (3,) and (got == (x[:3] > 0).sum(axis=1) % C).all()
    assert drv.last_infer_cycles == 321
    classes, logits = drv.infer(x, logits=True)  # a full batch, with the logits
    assert (classes == (x > 0).sum(axis=1) % C).all() and logits.shape == (B, C)


@pytest.mark.parametrize("n", [0, B + 1])
def test_infer_refuses_an_empty_or_oversized_batch(n):
    desc = make_desc()
    acc = MockAccelerator(desc)
    drv = Driver(desc, MockTransport(acc))
    acc.log.clear()
    with pytest.raises(ValueError, match=f"infer: {n} samples; the accelerator classifies 1 .. {B}"):
        drv.infer(np.ones((n, F), np.int8))
    assert acc.log == []  # nothing reached the accelerator


def test_train_after_a_partial_upload_is_refused():
    desc = make_desc()
    acc = MockAccelerator(desc)
    drv = Driver(desc, MockTransport(acc))
    x, y = batch()
    drv.transport.execute(drv._command("upload", batch=2))
    drv.transport.execute(drv._stream(Send(drv.batch_words(x[:2], y[:2], partial=True)), "upload"))
    drv.transport.execute(drv._wait_done("upload"))
    with pytest.raises(AcceleratorError, match="batch"):
        drv.transport.execute(drv._command("train"))
