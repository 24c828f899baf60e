"""Declarative, validated configuration sections (used by :mod:`sim.config`).

A section is a dataclass whose fields are declared with :func:`opt`, which
records the allowed values; :func:`build` turns a TOML table into the
dataclass and raises :class:`ConfigError` naming the field, the value and
the allowed range. A section may define ``_validate(self, path)`` for checks
that span fields.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import field

__all__ = ["ConfigError", "opt", "sub", "build", "key_name"]


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type, or out of range."""


# ---------------------------------------------------------------------------
# A tiny declarative validator: every field carries its own limits.


def opt(default, *, choices=None, lo=None, hi=None, lo_open=False, hi_open=False, kind=None, doc=""):
    """Declare a dataclass field with its allowed values (kept in the field metadata)."""
    meta = dict(choices=choices, lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open, kind=kind, doc=doc)
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return field(default=default, metadata=meta)


def _bound(v) -> str:
    """A bound as written in an error; an exact power of two far from 1 also as ``2**n`` (readable next to 1e-19)."""
    if isinstance(v, float) and v > 0:
        mant, exp = math.frexp(v)
        if mant == 0.5 and abs(exp - 1) >= 10:
            return f"{v!r} (2**{exp - 1})"
    return repr(v)


def _describe(meta) -> str:
    if meta["choices"] is not None:
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    parts = []
    if meta["lo"] is not None:
        parts.append(("> " if meta["lo_open"] else ">= ") + _bound(meta["lo"]))
    if meta["hi"] is not None:
        parts.append(("< " if meta["hi_open"] else "<= ") + _bound(meta["hi"]))
    return " and ".join(parts) if parts else "any value"


def _check_value(path: str, value, f: dataclasses.Field):
    meta = f.metadata
    kind = meta.get("kind")
    if kind is None:
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kind = type(default)
    if value is None and f.default is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{path} = {value!r}: expected true or false")
    if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, kind)):
        noun = "an integer" if kind is int else "a number"
        raise ConfigError(f"{path} = {value!r}: expected {noun}; allowed: {_describe(meta)}")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{path} = {value!r}: expected a string; allowed: {_describe(meta)}")
    if kind is str and not _is_utf8(value):
        raise ConfigError(f"{path} = {value!r}: not valid Unicode text (lone surrogates cannot be written to TOML)")
    if kind is list and not isinstance(value, list):
        raise ConfigError(f"{path} = {value!r}: expected a list")
    if meta["choices"] is not None and value not in meta["choices"]:
        raise ConfigError(f"{path} = {value!r} is not allowed; allowed: {_describe(meta)}")
    if kind in (int, float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{path} = {value!r}: must be a finite number")
        lo, hi = meta["lo"], meta["hi"]
        bad = (lo is not None and (value <= lo if meta["lo_open"] else value < lo)) or (
            hi is not None and (value >= hi if meta["hi_open"] else value > hi)
        )
        if bad:
            raise ConfigError(f"{path} = {value!r} is out of range; allowed: {_describe(meta)}")
    return value


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def key_name(key) -> str:
    """A key as written in a message: as it is when it is a plain word, else quoted (newlines, spaces, ...)."""
    return key if isinstance(key, str) and key.isprintable() and key and not any(c.isspace() for c in key) \
        else repr(key)


def build(cls, data: dict | None, path: str):
    """Build dataclass ``cls`` from ``data``, checking names, types and ranges."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a table, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(
            f"unknown field {where}{key_name(unknown[0])}; known fields of {path or 'the top level'}: "
            + ", ".join(sorted(fields))
        )
    kwargs = {}
    for name, f in fields.items():
        sub = f.metadata.get("kind")
        fpath = f"{path}.{name}" if path else name
        if dataclasses.is_dataclass(sub):
            kwargs[name] = build(sub, data.get(name), fpath)
        elif name in data:
            kwargs[name] = _check_value(fpath, data[name], f)
    obj = cls(**kwargs)
    check = getattr(obj, "_validate", None)
    if check is not None:
        check(path)
    return obj


def sub(cls):
    return field(default_factory=cls, metadata=dict(kind=cls, choices=None, lo=None, hi=None))


