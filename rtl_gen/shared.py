"""Helpers for units shared by several layers (one unit, the layer picked at run time by a ``layer`` input)."""

from __future__ import annotations

from amaranth.lib.wiring import In

__all__ = ["layer_port", "per_layer"]


def per_layer(one, many, kind: type, *, one_name: str = "geometry", many_name: str = "geometries",
              key=None, unit: str = "unit", agree: str = "") -> list:
    """The list of per-layer descriptions a unit was given: exactly one of ``one`` (a single ``kind``) and
    ``many`` (a list of them). With ``key``, all must give the same ``key(x)`` (what the unit cannot vary at
    run time, named by ``agree`` in the error)."""
    if (one is None) == (many is None):
        raise TypeError(f"give exactly one of {one_name} (one {kind.__name__}) and {many_name} (a list of them)")
    items = [one] if many is None else list(many)
    for x in items:
        if not isinstance(x, kind):
            raise TypeError(f"{one_name} must be a {kind.__name__}, not {x!r}")
    if key is not None and len({key(x) for x in items}) != 1:
        raise ValueError(f"the layers of one {unit} must have the same {agree}")
    return items


def layer_port(n: int) -> dict:
    """The ``layer`` input of a unit serving ``n`` layers (none for one layer)."""
    return {"layer": In(range(n))} if n > 1 else {}
