"""Wall time of ``generate --synth-by-unit`` run serially, with ``--jobs N`` and on a local Dask cluster of N
worker processes, each in an empty synthesis cache, and whether the three reports agree.

Every mode calls :func:`host.generate.generate` (what ``xnortrain generate`` runs) with its own
``XNORTRAIN_BUILD_DIR`` under ``--work`` (default: a new temporary folder), so every part really runs Yosys; the
cluster is a ``distributed.LocalCluster`` started here (``n_workers=N``, one thread each, processes). The
reports are compared field by field without the fields that describe the run (``synth.elapsed_s``,
``synth.wall_s``, ``synth.jobs``, ``synth.cluster``). Output: one JSON object (``--out`` also writes it).

Command used for docs/results.md (the small MLP of tests/rtl_gen/test_system.py)::

    .venv/bin/python benchmarks/synth_parallel.py --small --out results/synth_parallel_small.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from host.generate import generate  # noqa: E402
from sim.config import apply_overrides, load_config  # noqa: E402

# tests/rtl_gen/test_system.py's SMALL (read from there so the two never differ)
sys.path.insert(0, str(ROOT / "tests" / "rtl_gen"))

_RUN_FIELDS = ("elapsed_s", "wall_s", "jobs", "cluster")


def _comparable(report: dict) -> dict:
    out = dict(report)
    out["synth"] = {k: v for k, v in report["synth"].items() if k not in _RUN_FIELDS}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="mlp", help="configuration name or TOML file (default: mlp)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="configuration override")
    ap.add_argument("--small", action="store_true", help="the small MLP of tests/rtl_gen/test_system.py")
    ap.add_argument("--device", default=None, help="generate --device (default xc7z020)")
    ap.add_argument("--workers", type=int, default=2, help="--jobs N and the cluster's worker count (default 2)")
    ap.add_argument("--modes", default="serial,jobs,cluster", help="which runs, in order (default all three)")
    ap.add_argument("--work", type=Path, help="folder for the runs' caches and outputs (default: a new temp folder)")
    ap.add_argument("--out", type=Path, help="write the JSON here too")
    args = ap.parse_args(argv)

    overrides = list(args.set)
    if args.small:
        from test_system import SMALL

        overrides = [*SMALL, *overrides]
    cfg = apply_overrides(load_config(args.config), overrides)
    work = args.work or Path(tempfile.mkdtemp(prefix="synth-parallel-"))
    result = {"config": cfg.name, "overrides": overrides, "device": args.device or "xc7z020",
              "workers": args.workers, "cpus": os.cpu_count(), "runs": {}}
    reports = {}
    for mode in args.modes.split(","):
        build = work / mode / "build"
        os.environ["XNORTRAIN_BUILD_DIR"] = str(build)  # before the cluster starts: its workers inherit it
        kwargs = {"jobs": args.workers} if mode == "jobs" else {}
        load = os.getloadavg()[0]
        cluster = None
        if mode == "cluster":
            from distributed import LocalCluster

            cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
            kwargs = {"cluster": cluster.scheduler_address}
        try:
            start = time.perf_counter()
            rep = generate(cfg, work / mode / "out", by_unit=True, device=args.device, log=lambda *_: None,
                           **kwargs)
            wall = time.perf_counter() - start
        finally:
            if cluster is not None:
                cluster.close()
        reports[mode] = rep
        result["runs"][mode] = {"wall_s": round(wall, 1), "synth_wall_s": rep["synth"]["wall_s"],
                                "yosys_s_sum": rep["synth"]["elapsed_s"], "loadavg_1min_at_start": load,
                                "resources": rep["resources"], "fits": rep["fits"]}
        print(json.dumps({mode: result["runs"][mode]}), flush=True)
    first = next(iter(reports))
    result["identical_to_" + first] = {m: _comparable(r) == _comparable(reports[first]) for m, r in reports.items()}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if all(result["identical_to_" + first].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
