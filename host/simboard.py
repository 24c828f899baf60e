"""The simulated board: the generated accelerator in Verilator, driven without cocotb.

A PYNQ board in software. The accelerator's Verilog is compiled by Verilator together with a small C++
bus harness (``host/simboard.cpp``: the clock loop, an AXI4-Lite master, the two 32-bit AXI-Streams
with TLAST, a cycle counter) into a shared library that Python loads with :mod:`ctypes`. The host side is
the real :class:`host.driver.Driver` on :class:`SimTransport`, a :class:`host.transports.base.BlockingTransport`; no
Python runs per clock cycle, so a training step runs at the speed of the Verilated model itself::

    from host.driver import Driver
    from host.simboard import SimBoard

    with SimBoard.build(cfg, log=print) as board:   # elaborate, build or reuse the cached simulator
        drv = Driver(board.description, board.transport)
        result = drv.train_step(x, labels, lr=cfg.lr)
        print(board.cycles)                          # clock cycles simulated so far

The simulator is cached under ``build_root()/simboard/<top>-<key>``, keyed on the Verilog text, the
harness source, the build flags (:data:`rtl_gen.toolchain.MODEL_OPT`, :data:`VERILATOR_ARGS`), the Verilator
version and the compiler; two processes that want the same build wait for each other (a file lock).

``SimBoard.build(cfg, coverage=True)`` builds a second, slower simulator of the same Verilog with Verilator's
toggle coverage (:data:`COVERAGE_ARGS`, plus :data:`COVERAGE_HARNESS` for zeroing and writing the counters;
its own cache folder, the normal build's key is unchanged): :meth:`SimBoard.coverage_zero` and
:meth:`SimBoard.coverage_write` bracket the cycles to measure (:mod:`host.energy_estimate` turns the counts into
switching activity).

Every bus wait is bounded in cycles: an AXI4-Lite access that gets no response within ``bus_cycles``
raises :class:`host.errors.AcceleratorTimeout`; a stream transfer that makes no progress for ``max_idle``
cycles raises :class:`host.errors.TransferTimeout` naming the transfer (the driver then aborts the
command), as :class:`host.transports.pynq.PynqTransport` does on the board. A stream the accelerator ends early
(TLAST before the last word) raises :class:`host.errors.AcceleratorError`, as the DMA would report it.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from host.errors import AcceleratorError
from host.transports.simboard import BUS_CYCLES, MAX_IDLE, SimTransport
from rtl_gen.contract import AcceleratorDescription, hardware_config

__all__ = ["COVERAGE_ARGS", "COVERAGE_HARNESS", "COVERAGE_MAKE_VARS", "HARNESS", "VERILATOR_ARGS", "SimBoard",
           "SimBoardBuildError", "SimTransport", "build_library"]

HARNESS = Path(__file__).resolve().with_name("simboard.cpp")
"""The C++ bus harness compiled with the Verilated accelerator."""

COVERAGE_HARNESS = Path(__file__).resolve().with_name("simboard_cov.cpp")
"""Counter access (zero, write) compiled only into coverage builds."""

LIBRARY = "libsimboard.so"
_PREFIX = "Vsimboard"  # the Verilated class the harness includes
_ABI_VERSION = 1  # sb_abi_version() of the harness this module speaks to

#: Verilator arguments of the simulator (besides the sources, the top module and the prefix). No VPI and
#: no public signals: the harness touches only the top-level ports, so Verilator may optimise every
#: internal net (see docs/results.md, "Simulation speed").
VERILATOR_ARGS = ("-Wno-fatal",)

#: Added for a coverage build: two counters per bit of every signal (its 0->1 and 1->0 changes). The width limit
#: (Verilator's default 256 bits; wider signals get no counters) is raised to 4,096: every signal of the paper's
#: MLP is covered (the widest, the weight memories' gradient payloads, have 2,049 bits), while memories of more
#: than 4,096 bits (89 % of its 5.2 M signal and memory bits: weight banks, YDX, X buffers) are left out; they are
#: not nets (host/energy_estimate.py leaves every memory out of the rates), and counting them made the build
#: several times longer.
COVERAGE_ARGS = ("--coverage-toggle", "--coverage-max-width", "4096")

#: g++ optimisation of a coverage build, every group at -O0: the counters make the paper's MLP about 70 MB of C++,
#: which at the normal build's -O2 took most of an hour to compile on 2 busy cores; a coverage build runs only the
#: few steps it measures, so compile time matters more than speed.
COVERAGE_MAKE_VARS = {"OPT_FAST": "-O0", "OPT_SLOW": "-O0", "OPT_GLOBAL": "-O0"}



class SimBoardBuildError(RuntimeError):
    """The simulator could not be built (a tool missing, or Verilator or the compiler failed)."""


# --- build ----------------------------------------------------------------------------------------------


def _tool_check() -> None:
    for tool in ("g++", "make"):
        if shutil.which(tool) is None:
            raise SimBoardBuildError(f"the simulated board needs `{tool}` to compile its simulator and it is not on "
                                     "PATH (Debian/Ubuntu: apt-get install build-essential)")


def _compiler_id() -> str:
    out = subprocess.run(["g++", "--version"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0] if out else "g++"


def _host_cpu() -> str:
    """A short digest of this machine's processor (model and instruction-set flags)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        text = "\n".join(dict.fromkeys(lines))
    except OSError:
        import platform

        text = f"{platform.machine()} {platform.processor()}"
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _make_vars() -> dict[str, str]:
    """The make variables of the Verilated model's build: optimisation levels from
    :data:`rtl_gen.toolchain.MODEL_OPT` (they key the cache, so they are not taken from MAKEFLAGS). Code built
    for this processor (``-march=native``) also names it in a define, so that neither this cache nor a ccache
    shared with another kind of machine hands the objects to a processor that lacks their instructions."""
    from rtl_gen.toolchain import MODEL_OPT

    out = {"OPT_FAST": MODEL_OPT["fast"], "OPT_SLOW": MODEL_OPT["slow"], "OPT_GLOBAL": MODEL_OPT["global"]}
    for k, v in out.items():
        if "-march=native" in v.split():
            out[k] = f"{v} -DXNT_HOST_CPU={_host_cpu()}"
    return out


WRAPPER = "simboard_top"
"""The simulator's top module: :func:`wrap_top`'s wrapper around the accelerator."""

_PORT = re.compile(r"^\s*(input|output)\s+(?:wire\s+|reg\s+)?(\[[^\]]+\]\s*)?(\w+)\s*;", re.M)


def wrap_top(verilog: str, top: str) -> str:
    """Verilog of :data:`WRAPPER`: module ``top`` of ``verilog`` with the same ports, except that the reset
    input ``rst`` reaches it through one register.

    The accelerator resets synchronously, so the next-state logic of almost every register reads ``rst``.
    Straight from a top-level input, Verilator evaluates all that logic in its input-combinational region,
    which runs at every ``eval()`` (twice per cycle), and again after the clock edge; registered, it runs
    once per cycle. The reset arrives one cycle later, nothing else changes (docs/results.md, "Simulation
    speed")."""
    m = re.search(rf"^module {re.escape(top)}\((.*?)\);\n(.*?)^endmodule", verilog, re.S | re.M)
    if m is None:
        raise SimBoardBuildError(f"the Verilog has no module {top!r}")
    ports = _PORT.findall(m.group(2))
    names = [name for _d, _w, name in ports]
    missing = [p for p in ("clk", "rst") if p not in names]
    if missing:
        raise SimBoardBuildError(f"module {top}: no port {missing[0]!r} (the simulated board drives clk and rst)")
    lines = [f"module {WRAPPER}({', '.join(names)});"]
    lines += [f"  {d} {w.strip() + ' ' if w else ''}{name};" for d, w, name in ports]
    lines += ["  reg rst_q = 1'b1;", "  always @(posedge clk) rst_q <= rst;"]
    conn = ", ".join(f".{n}({'rst_q' if n == 'rst' else n})" for n in names)
    lines += [f"  {top} dut({conn});", "endmodule"]
    return "\n".join(lines) + "\n"


def _generator_digest() -> str:
    """Hash of every Python source the generated Verilog can depend on (the generator in ``rtl_gen/``, the
    configuration and the widths in ``sim/``, ``boards/``) and of the Amaranth version."""
    import amaranth

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(str(getattr(amaranth, "__version__", "")).encode())
    for folder in ("rtl_gen", "sim", "boards"):
        for f in sorted((root / folder).rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def verilog_cache_path(cfg, top: str) -> Path:
    """Where the accelerator's Verilog for ``cfg`` is kept: elaborating the paper's MLP takes most of a minute,
    so :meth:`SimBoard.build` reuses the text while the configuration's hardware fields
    (:func:`rtl_gen.contract.hardware_config`: a new seed, number of epochs, data limit or learning rate keeps the
    text) and the generator's sources are unchanged."""
    from rtl_gen.toolchain import build_root

    hw = json.dumps(hardware_config(cfg.to_toml()), sort_keys=True)
    key = hashlib.sha256((hw + "\n" + _generator_digest()).encode()).hexdigest()[:16]
    return build_root() / "verilog" / f"{top}-{key}.v"


def library_key(verilog: str, top: str, *, coverage: bool = False) -> dict:
    """What the simulator library is made of (hashed into its folder's name). A coverage build adds its
    arguments and counter-access source; a normal build's key has no such entry (unchanged by the option)."""
    from rtl_gen.toolchain import verilator_version

    key = {
        "top": top,
        "verilog": hashlib.sha256(verilog.encode()).hexdigest(),
        "harness": hashlib.sha256(HARNESS.read_bytes()).hexdigest(),
        "wrapper": hashlib.sha256(inspect.getsource(wrap_top).encode()).hexdigest(),
        "verilator": verilator_version(),
        "verilator_args": list(VERILATOR_ARGS),
        "make": dict(COVERAGE_MAKE_VARS) if coverage else _make_vars(),
        "compiler": _compiler_id(),
        "abi": _ABI_VERSION,
    }
    if coverage:
        key["coverage"] = {"args": list(COVERAGE_ARGS),
                           "harness": hashlib.sha256(COVERAGE_HARNESS.read_bytes()).hexdigest()}
    return key


def build_library(verilog: str, top: str, *, log: Callable[[str], object] | None = None,
                  jobs: int | None = None, coverage: bool = False) -> tuple[Path, bool]:
    """Build (or reuse) the simulator of the Verilog module ``top``; returns ``(library path, built)``.

    The folder ``build_root()/simboard/<top>-<key>`` holds the library once built (``build.json`` records
    the key and the build time); a build that fails leaves no library behind, so the next call tries again.
    """
    from rtl_gen.toolchain import build_root, setup_environment, verilator_path

    log = log or (lambda _msg: None)
    _tool_check()
    setup_environment()
    key = library_key(verilog, top, coverage=coverage)
    key_text = json.dumps(key, sort_keys=True, indent=1)
    folder = build_root() / "simboard" / f"{top}-{hashlib.sha256(key_text.encode()).hexdigest()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / LIBRARY
    stamp = folder / "build.json"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building the same key: wait for it, then reuse
        if lib.is_file() and stamp.is_file():
            log(f"simulated board: reusing {folder}")
            return lib, False
        (folder / "key.json").write_text(key_text)
        src = folder / f"{top}.v"
        src.write_text(verilog)
        wrapper = folder / f"{WRAPPER}.v"
        wrapper.write_text(wrap_top(verilog, top))
        obj = folder / "obj"
        shutil.rmtree(obj, ignore_errors=True)
        jobs = jobs or os.cpu_count() or 1
        make_vars = dict(COVERAGE_MAKE_VARS) if coverage else _make_vars()
        what = f"{top} with toggle coverage" if coverage else top
        log(f"simulated board: building {what} in {folder} ({len(verilog) / 1e6:.1f} MB of Verilog; "
            f"{' '.join(f'{k}={v}' for k, v in make_vars.items())}, {jobs} jobs) ...")
        env = dict(os.environ)
        # the optimisation levels are ours (they key the folder): drop any in MAKEFLAGS, keep the toolchain's
        words = [w for w in env.get("MAKEFLAGS", "").split() if w.split("=", 1)[0] not in make_vars]
        env["MAKEFLAGS"] = " ".join(words)
        t0 = time.monotonic()
        verilate = [str(verilator_path()), "--cc", "--exe", "-Mdir", str(obj), "--top-module", WRAPPER,
                    "--prefix", _PREFIX, *VERILATOR_ARGS, *(COVERAGE_ARGS if coverage else ()),
                    "-CFLAGS", "-fPIC", "-LDFLAGS", "-shared", "-o", LIBRARY, str(src), str(wrapper), str(HARNESS),
                    *((str(COVERAGE_HARNESS),) if coverage else ())]
        _run(verilate, env, folder, "verilator")
        t1 = time.monotonic()
        make = ["make", "-j", str(jobs), "-C", str(obj), "-f", f"{_PREFIX}.mk",
                *(f"{k}={v}" for k, v in make_vars.items())]
        _run(make, env, folder, "the C++ build")
        t2 = time.monotonic()
        os.replace(obj / LIBRARY, lib)
        shutil.rmtree(obj, ignore_errors=True)  # ~150 MB of objects for the paper's MLP; ccache keeps what matters
        stamp.write_text(json.dumps({"key": key, "verilate_s": round(t1 - t0, 1), "compile_s": round(t2 - t1, 1)},
                                    indent=1))
        log(f"simulated board: built in {t2 - t0:.0f} s (Verilator {t1 - t0:.0f} s, C++ {t2 - t1:.0f} s)")
        return lib, True


def _run(cmd: list[str], env: dict, folder: Path, what: str) -> None:
    logfile = folder / ("verilate.log" if what == "verilator" else "make.log")
    with open(logfile, "w") as out:
        proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-20:])
        raise SimBoardBuildError(f"{what} failed (exit {proc.returncode}) building the simulated board in {folder}; "
                                 f"log {logfile}:\n{tail}")


# --- the library ----------------------------------------------------------------------------------------


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    vp, u32, u64, i64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64
    pu32, pi64 = ctypes.POINTER(u32), ctypes.POINTER(i64)
    sigs = {
        "sb_abi_version": (ctypes.c_int, []),
        "sb_open": (vp, []),
        "sb_close": (None, [vp]),
        "sb_cycles": (u64, [vp]),
        "sb_reset": (None, [vp, u64]),
        "sb_run": (None, [vp, u64]),
        "sb_write": (ctypes.c_int, [vp, u32, u32, u32, u64, pu32]),
        "sb_read": (ctypes.c_int, [vp, u32, u64, pu32, pu32]),
        "sb_send": (i64, [vp, pu32, u64, ctypes.c_int, u64]),
        "sb_receive": (i64, [vp, pu32, u64, u64, pi64]),
    }
    if hasattr(lib, "sb_cov_enabled"):  # a coverage build (COVERAGE_HARNESS)
        sigs.update({"sb_cov_enabled": (ctypes.c_int, []), "sb_cov_zero": (None, []),
                     "sb_cov_write": (None, [ctypes.c_char_p])})
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    if lib.sb_abi_version() != _ABI_VERSION:
        raise SimBoardBuildError(f"{path}: harness interface {lib.sb_abi_version()}, this module needs {_ABI_VERSION}")
    return lib


class SimBoard:
    """A simulated PYNQ board: the accelerator's Verilated model in a shared library (:func:`build_library`).

    ``description``: the accelerator's :class:`rtl_gen.contract.AcceleratorDescription`; ``transport``: a
    :class:`SimTransport` for :class:`host.driver.Driver`; ``cycles``: clock cycles simulated since the board
    was opened. The model comes out of reset when the board is opened; :meth:`close` (or the ``with`` block's
    end) frees it."""

    def __init__(self, library: str | os.PathLike, description: AcceleratorDescription, *,
                 bus_cycles: int = BUS_CYCLES, max_idle: int = MAX_IDLE):
        self.library = Path(library)
        self.description = description
        self._lib = _load(self.library)
        self._h = self._lib.sb_open()
        self._lib.sb_reset(self._h, 3)
        self.transport = SimTransport(self, bus_cycles=bus_cycles, max_idle=max_idle)
        self.verilog: str | None = None  # the accelerator's Verilog, when built by :meth:`build`

    @classmethod
    def build(cls, cfg, *, log: Callable[[str], object] | None = None, bus_cycles: int = BUS_CYCLES,
              max_idle: int = MAX_IDLE, coverage: bool = False) -> SimBoard:
        """Elaborate the accelerator for ``cfg`` (:class:`rtl_gen.top.Accelerator`), build its simulator or
        reuse the cached one, and open a board on it. ``log`` gets one line per stage. ``coverage``: the
        toggle-coverage simulator instead (:data:`COVERAGE_ARGS`; several times slower per cycle)."""
        from rtl_gen.top import Accelerator, SystemPlan

        log = log or (lambda _msg: None)
        plan = SystemPlan(cfg)
        path = verilog_cache_path(cfg, plan.name)
        if path.is_file():
            verilog = path.read_text()
            log(f"simulated board: {plan.name} for {cfg.name}: Verilog from {path}")
        else:
            t0 = time.monotonic()
            verilog = Accelerator(plan).verilog()
            log(f"simulated board: {plan.name} for {cfg.name} elaborated in {time.monotonic() - t0:.0f} s")
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(verilog)
            os.replace(tmp, path)  # atomic: another process may read or write the same key
        lib, _ = build_library(verilog, plan.name, log=log, coverage=coverage)
        board = cls(lib, plan.description(), bus_cycles=bus_cycles, max_idle=max_idle)
        board.verilog = verilog
        return board

    def _handle(self):
        if self._h is None:
            raise AcceleratorError("the simulated board is closed")
        return self._h

    @property
    def cycles(self) -> int:
        """Clock cycles simulated since the board was opened (reset included)."""
        return int(self._lib.sb_cycles(self._handle()))

    @property
    def coverage(self) -> bool:
        """Whether this board's simulator counts toggles (built with ``coverage=True``)."""
        return hasattr(self._lib, "sb_cov_enabled")

    def _cov(self):
        self._handle()
        if not self.coverage:
            raise AcceleratorError(f"{self.library}: not a coverage build (SimBoard.build(cfg, coverage=True))")
        return self._lib

    def coverage_zero(self) -> None:
        """Zero every toggle counter (this board must be the last one opened in this thread)."""
        self._cov().sb_cov_zero()

    def coverage_write(self, path: str | os.PathLike) -> Path:
        """Write every toggle counter to ``path`` (Verilator's coverage.dat format); returns the path."""
        path = Path(path)
        self._cov().sb_cov_write(str(path).encode())
        return path

    def run(self, cycles: int) -> None:
        """Let ``cycles`` clock cycles pass."""
        if cycles > 0:
            self._lib.sb_run(self._handle(), int(cycles))

    def close(self) -> None:
        if self._h is not None:
            self._lib.sb_close(self._h)
            self._h = None

    def __enter__(self) -> SimBoard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
