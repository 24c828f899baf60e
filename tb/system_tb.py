"""cocotb testbench of the whole accelerator (rtl_gen.top.Accelerator) against sim.hw.model.HwModel.

The host side is the real driver (:class:`host.driver.Driver`) on a cocotb transport
(:class:`tb.cocotb_transport.CocotbTransport`: AXI4-Lite and the two AXI-Streams driven by cocotb), so what runs
here is what runs on the board.

Parameters (``$XNT_TB_PARAMS``, JSON):

``description``  path of the ``accelerator.json`` of the build;
``config``       path of the configuration TOML the build was generated from;
``data``         path of an ``.npz`` with ``x`` (uint8 images ``[n, C, H, W]``) and ``y`` (labels);
``steps``        training steps to run (batches are taken in order from ``data``);
``mode``         ``"forward"`` (layer-0 pre-activations only) or ``"train"`` (whole steps), or
                 ``"errors"`` (the command checks) or ``"restore"`` (checkpoint, train, restore, train), or
                 ``"infer"`` (train ``steps - 3`` steps, infer a full batch and a partial one of ``infer_n``
                 samples against ``HwModel.forward_eval``, check the state is untouched, train one more step;
                 ``infer_train_after`` 0: no step after the infers, ``steps - 2`` before them);
``report``       where to write the JSON report (cycles and first mismatch per step);
``lr``           learning rate of every step (default: the configuration's);
``lrs``          per-step learning rates (a list, one per step; overrides ``lr``), e.g. a decayed schedule;
``progress``     per-step training progress in [0, 1] (a list; the iir alpha decay follows it), default 0;
``state``        path of an ``.npz`` with a :meth:`sim.hw.model.HwModel.state_dict` to start from (restored
                 into the model and, through the driver, into the accelerator) instead of the power-on state;
``stress``       1: random idle/backpressure on the streams and random AXI-Lite delays.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, FallingEdge

from host.driver import Driver
from host.errors import AcceleratorError
from host.transports.base import Send
from rtl_gen.contract import AcceleratorDescription
from rtl_gen.top import SystemPlan
from tb.cocotb_transport import CocotbTransport
from tb.common import Bench, tb_params

PARAMS = tb_params()


# --- comparing state ------------------------------------------------------------------------------------


def first_mismatch(got: dict, want: dict, keys=None) -> dict | None:
    """First differing element of two state dicts: ``{layer, quantity, index, expected, got}``."""
    for key in keys or sorted(want):
        if key not in got:
            return {"quantity": key, "layer": None, "index": None, "expected": "present", "got": "missing"}
        a = np.asarray(got[key])
        b = np.asarray(want[key])
        if a.shape != b.shape:
            return {"quantity": key, "layer": None, "index": None, "expected": str(b.shape), "got": str(a.shape)}
        diff = np.argwhere(a.astype(object) != b.astype(object)) if a.ndim else ([()] if a != b else [])
        if len(diff):
            idx = tuple(int(v) for v in diff[0])
            name = key.rstrip("0123456789")
            layer = key[len(name):]
            return {"quantity": name, "layer": int(layer) if layer else None, "index": list(idx),
                    "expected": int(b[idx]), "got": int(a[idx]), "count": int(len(diff))}
    return None


def load_batches(path, cfg, batch, steps):
    from sim.hw.engine import prepare_inputs

    d = np.load(path)
    x, y = d["x"], d["y"]
    need = batch * steps
    if len(x) < need:
        raise ValueError(f"{path} has {len(x)} samples, {need} needed for {steps} steps of {batch}")
    xs = prepare_inputs(cfg, x[:need])
    return [(xs[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]) for i in range(steps)]


class TB(Bench):
    def __init__(self, dut):
        super().__init__(dut)
        from sim.config import load_config
        from sim.hw.model import HwModel

        self.desc = AcceleratorDescription.from_json(Path(PARAMS["description"]))
        self.cfg = load_config(PARAMS["config"])
        # ``model_config`` (tests of the checker itself): a model that computes something else than the RTL
        self.model = HwModel(load_config(PARAMS.get("model_config") or PARAMS["config"]))
        verbose = bool(PARAMS.get("verbose", 0))
        self.transport = CocotbTransport(self, stress=bool(PARAMS.get("stress", 0)),
                                         log=dut._log.info if verbose else None, regmap=self.desc.regmap)
        self.drv = Driver(self.desc, self.transport, poll_cycles=int(PARAMS.get("poll_cycles", 256)),
                          timeout_cycles=int(PARAMS.get("timeout_cycles", 20_000_000)),
                          timeout_s=float(PARAMS.get("timeout_s", 4 * 3600)))  # simulated clocks run slowly
        self.report = {"steps": [], "mode": PARAMS.get("mode", "train")}

    async def watch_phases(self):
        """Log every phase transition of the controller (internal signals ``training``/``ph``)."""
        try:
            ph, training = self.dut.ph, self.dut.training
        except AttributeError:
            return
        last = None
        while True:
            await FallingEdge(self.clk)
            now = (int(training.value), int(ph.value))
            if now != last:
                self.dut._log.info("cycle %d: training %d phase %d", self.cycle, *now)
                last = now

    def write_report(self):
        path = PARAMS.get("report")
        if path:
            Path(path).write_text(json.dumps(self.report, indent=1))



@cocotb.test()
async def test_system(dut):
    tb = TB(dut)
    await tb.reset()
    tb.report["identity"] = await tb.drv.connect()  # the RTL is the accelerator accelerator.json describes
    if PARAMS.get("verbose"):
        cocotb.start_soon(tb.watch_phases())
    mode = PARAMS.get("mode", "train")
    steps = int(PARAMS.get("steps", 1))
    if mode == "errors":
        await run_error_checks(tb)
    elif mode == "train":
        await run_training(tb, load_batches(PARAMS["data"], tb.cfg, tb.desc.batch, steps))
    elif mode == "restore":
        await run_restore(tb, load_batches(PARAMS["data"], tb.cfg, tb.desc.batch, steps))
    elif mode == "infer":
        await run_infer(tb, load_batches(PARAMS["data"], tb.cfg, tb.desc.batch, steps))
    else:
        raise ValueError(f"unknown mode {mode!r}")
    tb.write_report()


async def compare_state(tb: TB, step: int, trace=None, result=None) -> dict | None:
    """Read back everything and compare with the model; the first mismatch (or None)."""
    got = await tb.drv.state_dict()
    want = tb.model.state_dict()
    mm = first_mismatch(got, want)
    if mm is not None:  # every differing quantity, to tell one wrong unit from a wrong layer
        mm["all"] = [k for k in sorted(want) if first_mismatch(got, want, [k]) is not None]
    if mm is None and trace is not None:
        if result.correct != trace.correct:
            mm = {"quantity": "correct", "layer": None, "index": [], "expected": trace.correct, "got": result.correct}
        elif result.undone != trace.undone:
            mm = {"quantity": "undone", "layer": None, "index": [], "expected": trace.undone, "got": result.undone}
        elif result.loss_q != trace.loss_q:  # the loss unit's own integer loss (the switch_undo comparison)
            mm = {"quantity": "loss_q", "layer": None, "index": [], "expected": trace.loss_q, "got": result.loss_q}
        elif result.loss != trace.loss:
            mm = {"quantity": "loss", "layer": None, "index": [], "expected": trace.loss, "got": result.loss}
        elif not np.array_equal(result.logits, trace.logits_q):
            bad = np.argwhere(result.logits != trace.logits_q)[0]
            mm = {"quantity": "logits", "layer": len(tb.desc.layers) - 1, "index": [int(v) for v in bad],
                  "expected": int(trace.logits_q[tuple(bad)]), "got": int(result.logits[tuple(bad)])}
    return mm


def state_at_limits(model) -> int:
    """Per-weight optimiser state at the end of its range after a step: switch accumulators at the cut-off
    ``|acc| = C`` and sgd latents at ``-2^Fc`` or ``2^Fc - 1`` (both saturate there), bop ``|m| = 2^F``, iir
    ``|m| = 2^Fm`` or ``|G| = 2^FG`` (the ends of the EMAs' ranges)."""
    h = model.h
    limits = {"switch": {"acc": (-h.switch_cutoff, h.switch_cutoff)},
              "bop": {"m": (-(1 << h.bop_frac_bits), 1 << h.bop_frac_bits)},
              "iir": {"m": (-(1 << h.iir_m_frac_bits), 1 << h.iir_m_frac_bits),
                      "g": (-(1 << h.iir_g_frac_bits), 1 << h.iir_g_frac_bits)},
              "sgd": {"latent": (-(1 << (h.sgd_latent_bits - 1)), (1 << (h.sgd_latent_bits - 1)) - 1)}}[h.optimizer]
    return sum(int(np.count_nonzero((a == lo) | (a == hi)))
               for key, (lo, hi) in limits.items() for a in model.opt[key])


async def train_and_check(tb: TB, x, y, step: int, lr: float, progress: float = 0.0) -> dict:
    t0 = time.perf_counter()
    try:
        result = await tb.drv.train_step(x, y, lr=lr, progress=progress)
    except AcceleratorError as e:
        st = await tb.drv.status()
        entry = {"step": step, "cycles": None, "mismatch": {"quantity": "error", "layer": st["status"]["layer"],
                                                            "index": [], "expected": "done", "got": str(e)},
                 "status": st["status"]}
        tb.report["steps"].append(entry)
        tb.write_report()
        raise
    wall = time.perf_counter() - t0  # upload + step + result registers, in simulation
    trace = tb.model.train_step(x, y, lr=lr, progress=progress)
    mm = await compare_state(tb, step, trace, result)
    names = [f"{kind}{j}" for kind, j in SystemPlan(tb.cfg).phases()]
    # cycle count at each phase end (the step's phases first, then infer's)
    ends = [int(v) for v in np.asarray(await tb.drv.read("phase_cycles")).ravel()][: len(names)]
    entry = {"step": step, "cycles": int(result.cycles), "mismatch": mm, "loss": result.loss,
             "loss_q": int(result.loss_q), "lr": lr, "progress": progress, "flips": int(trace.flips),
             "at_limit": state_at_limits(tb.model),
             "correct": int(result.correct), "undone": bool(result.undone), "wall_s": round(wall, 3),
             "sim_cycles_per_s": round(int(result.cycles) / wall, 1),
             "phases": dict(zip(names, np.diff([0, *ends]).tolist(), strict=True))}
    tb.report["steps"].append(entry)
    tb.write_report()
    dut = tb.dut
    dut._log.info("step %d: %d cycles, loss %.4f, correct %d, mismatch %s", step, result.cycles, result.loss,
                  result.correct, mm)
    return entry


def schedule(tb: TB, steps: int) -> list[tuple[float, float]]:
    """``(lr, progress)`` of each step from the parameters ``lrs`` / ``lr`` and ``progress``."""
    lrs = PARAMS.get("lrs") or [float(PARAMS.get("lr", tb.cfg.lr))] * steps
    progress = PARAMS.get("progress") or [0.0] * steps
    if len(lrs) != steps or len(progress) != steps:
        raise ValueError(f"{steps} steps need {steps} learning rates and progress values, got {lrs} and {progress}")
    return [(float(a), float(b)) for a, b in zip(lrs, progress, strict=True)]


async def run_training(tb: TB, batches):
    if PARAMS.get("state"):  # a trained state instead of the power-on one
        with np.load(PARAMS["state"]) as d:
            tb.model.load_state_dict({k: d[k] for k in d.files})
    await tb.drv.load_state_dict(tb.model.state_dict())
    mm = await compare_state(tb, -1)
    tb.report["restore_check"] = mm
    assert mm is None, f"state read back after the initial restore differs: {mm}"
    for s, ((x, y), (lr, progress)) in enumerate(zip(batches, schedule(tb, len(batches)), strict=True)):
        entry = await train_and_check(tb, x, y, s, lr, progress)
        assert entry["mismatch"] is None, f"step {s}: first mismatch {entry['mismatch']}"


async def run_restore(tb: TB, batches):
    """Write a state, train, read back (A); restore the same state, train again, read back (B): A == B,
    and both equal the model."""
    sched = schedule(tb, len(batches))
    start = tb.model.state_dict()
    await tb.drv.load_state_dict(start)
    half = max(1, len(batches) // 2)
    for s, (x, y) in enumerate(batches[:half]):
        entry = await train_and_check(tb, x, y, s, *sched[s])
        assert entry["mismatch"] is None, f"step {s}: first mismatch {entry['mismatch']}"
    checkpoint = await tb.drv.state_dict()
    first = []
    for s, (x, y) in enumerate(batches[half:]):
        lr, progress = sched[half + s]
        r = await tb.drv.train_step(x, y, lr=lr, progress=progress)
        first.append((r.loss, r.correct, await tb.drv.state_dict()))
    await tb.drv.load_state_dict(checkpoint)
    tb.model.load_state_dict(checkpoint)
    for s, (x, y) in enumerate(batches[half:]):
        entry = await train_and_check(tb, x, y, half + s, *sched[half + s])
        assert entry["mismatch"] is None, f"step {half + s} after restore: first mismatch {entry['mismatch']}"
        loss, correct, state = first[s]
        again = await tb.drv.state_dict()
        mm = first_mismatch(again, state)
        assert mm is None and entry["loss"] == loss and entry["correct"] == correct, (
            f"step {half + s}: the run after the restore differs from the first run: {mm}")
    tb.report["restore_identical"] = True


async def run_error_checks(tb: TB):
    """Commands that make no sense are refused with the right error bit; nothing hangs."""
    drv, m = tb.drv, tb.desc.regmap
    checks = []

    async def expect(flag, cmd, **arg):
        try:
            await drv.transport.execute(drv._command(cmd, **arg))
        except AcceleratorError as e:
            checks.append((flag, list(e.flags)))
            assert e.flags == (flag,), f"{cmd} {arg}: flags {e.flags}, expected ({flag},)"
            return
        raise AssertionError(f"{cmd} {arg}: no error, expected {flag}")

    kinds = tb.desc.kinds
    await expect("no_batch", "train")
    await expect("no_batch", "infer")
    await expect("batch", "upload", batch=tb.desc.batch + 1)
    await expect("batch", "upload", batch=0)
    await expect("layer", "readback", layer=len(tb.desc.layers), quantity=0)
    ro = next(q for q in tb.desc.quantities if q.access == "ro")
    await expect("quantity", "restore", layer=ro.layer or 0, quantity=ro.kind)
    # two commands in one write
    await drv.transport.write(m.addr("cmd"), m.encode("cmd", train=1, readback=1))
    err = await drv.read_register("error")
    assert err["multiple"] == 1 and sum(err.values()) == 1, err
    await drv.transport.execute(drv._clear())
    # start an upload, then anything else while it waits for data: busy; abort ends it
    await drv.transport.execute(drv._command("upload", batch=tb.desc.batch))
    st = await drv.read_register("status")
    assert st["busy"] == 1, st
    await expect("busy", "train")
    await expect("busy", "readback", layer=0, quantity=kinds["w"])
    await drv.abort()
    st = await drv.read_register("status")
    assert st["busy"] == 0, st
    # an upload whose TLAST comes early: framing error, no batch loaded, the stream never stalls
    x, y = np.ones((tb.desc.batch, tb.desc.features), np.int8), np.zeros(tb.desc.batch, np.int64)
    words = drv.batch_words(x, y)
    await drv.transport.execute(drv._command("upload", batch=tb.desc.batch))
    await tb.transport.src.send(words[: len(words) // 2])
    await ClockCycles(tb.clk, 5)
    err = await drv.read_register("error")
    assert err["framing"] == 1, err
    st = await drv.read_register("status")
    assert st["busy"] == 0 and st["batch_loaded"] == 0, st
    await drv.transport.execute(drv._clear())
    # a stream longer than the batch: framing error, the extra beats are accepted and dropped
    await drv.transport.execute(drv._command("upload", batch=tb.desc.batch))
    await tb.transport.src.send(np.concatenate([words, words[:7]]))
    await ClockCycles(tb.clk, 5)
    err = await drv.read_register("error")
    assert err["framing"] == 1, err
    await drv.transport.execute(drv._clear())
    # a label out of range
    bad = words.copy()
    bad[-1] = tb.desc.classes
    await drv.transport.execute(drv._command("upload", batch=tb.desc.batch))
    await tb.transport.src.send(bad)
    await ClockCycles(tb.clk, 5)
    err = await drv.read_register("error")
    assert err["label"] == 1 and sum(err.values()) == 1, err
    await drv.transport.execute(drv._clear())
    # and a good upload afterwards works
    await drv.upload(x, y)
    st = await drv.read_register("status")
    assert st["batch_loaded"] == 1 and st["busy"] == 0, st
    checks.append(("recovered", []))
    # a partial batch (what infer takes) is refused by train
    await drv.transport.execute(drv._command("upload", batch=1))
    await drv.transport.execute(drv._stream(Send(drv.batch_words(x[:1], y[:1], partial=True)), "upload"))
    await drv.transport.execute(drv._wait_done("upload"))
    await expect("batch", "train")
    tb.report["checks"] = checks


async def infer_and_check(tb: TB, x, what: str) -> dict:
    """One ``Driver.infer`` with logits against :meth:`sim.hw.model.HwModel.forward_eval`; a report entry."""
    classes, logits = await tb.drv.infer(x, logits=True)
    want = tb.model.forward_eval(x)
    plan = SystemPlan(tb.cfg)
    ends = [int(v) for v in np.asarray(await tb.drv.read("phase_cycles")).ravel()][len(plan.phases()):]
    entry = {"infer": what, "samples": len(x), "cycles": tb.drv.last_infer_cycles, "mismatch": None,
             "phases": dict(zip([f"{k}{j}" for k, j in plan.infer_phases()], np.diff([0, *ends]).tolist(),
                                strict=True))}
    if not np.array_equal(logits, want):
        bad = np.argwhere(logits != want)[0]
        entry["mismatch"] = {"quantity": "eval logits", "index": [int(v) for v in bad],
                             "expected": int(want[tuple(bad)]), "got": int(logits[tuple(bad)])}
    elif not np.array_equal(classes, want.argmax(axis=1)):
        bad = int(np.argmax(classes != want.argmax(axis=1)))
        entry["mismatch"] = {"quantity": "classes", "index": [bad], "expected": int(want[bad].argmax()),
                             "got": int(classes[bad])}
    tb.report["steps"].append(entry)
    tb.write_report()
    tb.dut._log.info("infer %s: %d samples, %d cycles, mismatch %s", what, len(x), entry["cycles"], entry["mismatch"])
    return entry


async def run_infer(tb: TB, batches):
    """Train, infer a full and a partial batch (bit-exact eval logits and classes), check that the state is
    untouched (running statistics, weights, betas, generators), then train once more against the model."""
    after = int(PARAMS.get("infer_train_after", 1))
    if len(batches) < 3 + after:
        raise ValueError(f"mode infer needs at least {3 + after} batches (steps), got {len(batches)}")
    sched = schedule(tb, len(batches))
    await tb.drv.load_state_dict(tb.model.state_dict())
    k = len(batches) - 2 - after
    for s in range(k):
        entry = await train_and_check(tb, *batches[s], s, *sched[s])
        assert entry["mismatch"] is None, f"step {s}: first mismatch {entry['mismatch']}"
    n = int(PARAMS.get("infer_n", max(1, tb.desc.batch // 2 - 1)))
    for what, x in (("full", batches[k][0]), ("partial", batches[k + 1][0][:n])):
        entry = await infer_and_check(tb, x, what)
        assert entry["mismatch"] is None, f"infer {what}: first mismatch {entry['mismatch']}"
    mm = await compare_state(tb, k)
    tb.report["state_after_infer"] = mm
    assert mm is None, f"the state changed in infer: {mm}"
    if not after:
        return
    entry = await train_and_check(tb, *batches[k + 2], k, *sched[k + 2])
    assert entry["mismatch"] is None, f"step after infer: first mismatch {entry['mismatch']}"
