"""``xnortrain explore``: the command around the design-space search of :mod:`rtl_gen.explore`."""

from __future__ import annotations

import json
import sys

from boards.devices import get_device
from rtl_gen.explore import explore, format_text, limits_of, plot, write_best

__all__ = ["explore_main"]


def explore_main(args) -> int:
    """``xnortrain explore``."""
    from host.common import EXIT_DOES_NOT_FIT, EXIT_OK, build_config
    from rtl_gen.resource_model import load_model

    cfg = build_config(args)
    try:
        device = get_device(args.device)
    except ValueError as e:
        raise ValueError(f"--device: {e}") from None  # host.cli reports it as a usage error (exit 2)
    limits_of(device)  # a clear error before the search
    for opt, path in (("--write", args.write), ("--png", args.png)):
        if path:
            from pathlib import Path

            if Path(path).is_dir():
                raise ValueError(f"{opt} {path}: is a folder; give a file name")
    model = load_model()
    result = explore(cfg, device, model=model, log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        text = json.dumps(result.to_dict(), indent=1)
        if args.json == "-":
            print(text)
        else:
            from pathlib import Path

            Path(args.json).write_text(text + "\n")
    if args.json != "-":
        print(format_text(result))
    if args.png and result.fronts:
        plot(result, args.png)
        print(f"plot: {args.png}", file=sys.stderr)
    if result.best is None:
        print("xnortrain: no design of the grid fits " + device.name + (
            " (" + "; ".join(result.limiting) + ")" if result.limiting else ""), file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    if args.write:
        write_best(cfg, result.best, args.write)
        print(f"wrote {args.write}: {result.best.cycles:,.0f} cycles/image predicted; confirm with "
              f"`xnortrain generate --config {args.write} --out DIR --synth-by-unit`", file=sys.stderr)
    return EXIT_OK
