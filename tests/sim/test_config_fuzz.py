"""A seeded fuzzer of the configuration loader.

Random mutations of the preset files (configs/*.toml) and random ``--set`` overrides of the loaded presets:
keys deleted, values of the wrong type, tables set to scalars and scalars to tables or lists, numbers far out of
range, strings with newlines, quotes, control characters and non-ASCII text, unknown keys. Every outcome must be
either the project's own :class:`ConfigError` with a one-line message that names a mutated field, or a
configuration whose ``to_toml()`` reloads to an equal configuration. Anything else (another exception, a
multi-line message, a configuration that does not reload to itself) is a failure.

``XNT_CONFIG_FUZZ_CASES`` sets the number of cases per test (default 400: about two seconds); run it once with
thousands after changing the loader.
"""

from __future__ import annotations

import copy
import os
import random
import tomllib

import pytest

from sim.config import CONFIG_DIR, PRESETS, ConfigError, apply_overrides, config_from_dict, load_config

CASES = int(os.environ.get("XNT_CONFIG_FUZZ_CASES", "400"))

STRINGS = ["", "x", "a\nb", "tab\there", 'quote " and \\ backslash', "\x00\x1f\x7f", "ünïcödé ✓", "é\r\n",
           "line1\nname = 'evil'", "[hw]", "#", "mlp"]
NUMBERS = [0, -1, 1, 2, 3, 7, 48, 2**31, 2**63 - 1, -(2**63), 2**70, 0.0, -0.0, 0.5, 1.5, -2.5, 1e-300, 1e300,
           3.0, 1e-9]
SCALARS = NUMBERS + STRINGS + [True, False]


def _random_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth < 2 and r < 0.12:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 2 and r < 0.22:
        return {rng.choice(["a", "type", "units", "x y", "b\nc"]): _random_value(rng, depth + 1)
                for _ in range(rng.randint(0, 2))}
    return rng.choice(SCALARS)


def _paths(node, prefix=()):
    """Every (path, value) below ``node`` (dict keys and list indices)."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for k, v in items:
        yield prefix + (k,), v
        if isinstance(v, dict | list):
            yield from _paths(v, prefix + (k,))


def _parent(data, path):
    node = data
    for k in path[:-1]:
        node = node[k]
    return node


def _mutate(rng: random.Random, data: dict) -> tuple:
    """Apply one random mutation in place; returns the mutated path."""
    paths = list(_paths(data))
    path, value = rng.choice(paths)
    parent = _parent(data, path)
    op = rng.random()
    if op < 0.15:  # delete a key / a list element
        del parent[path[-1]]
    elif op < 0.25:  # add an unknown key next to it
        if isinstance(parent, dict):
            key = rng.choice(["nonsense", "Units", "lr ", "a\nb", "ü"])
            parent[key] = _random_value(rng)
            path = path[:-1] + (key,)
        else:
            parent.append(_random_value(rng))
    elif op < 0.45 and isinstance(value, int | float) and not isinstance(value, bool):  # out of range
        parent[path[-1]] = rng.choice([value * 1e6, -value - 1, value + 1, value * 2**40, 0, value / 3, 1e300,
                                       1e-300, -1])
    elif op < 0.55 and isinstance(value, str):
        parent[path[-1]] = value + rng.choice(STRINGS)
    elif op < 0.65 and isinstance(value, dict | list):  # a table or list set to a scalar
        parent[path[-1]] = rng.choice(SCALARS)
    elif op < 0.75 and not isinstance(value, dict | list):  # a scalar set to a table or list
        parent[path[-1]] = rng.choice([{}, {"a": 1}, [], [value], [1, 2]])
    else:  # anything
        parent[path[-1]] = _random_value(rng)
    return path


def _raw_presets() -> dict[str, dict]:
    out = {}
    for name, file in PRESETS.items():
        with open(CONFIG_DIR / file, "rb") as fh:
            out[name] = tomllib.load(fh)
    return out


def _check_outcome(build, words: list[str], what: str) -> bool:
    """Run ``build()``: a ConfigError naming one of ``words`` in one line, or a configuration that reloads to
    itself. Returns whether it was accepted."""
    try:
        cfg = build()
    except ConfigError as e:
        msg = str(e)
        assert msg and "\n" not in msg and "\r" not in msg, f"{what}: a message of several lines: {msg!r}"
        assert any(w in msg for w in words), f"{what}: the message names none of {words}: {msg!r}"
        return False
    text = cfg.to_toml()
    again = config_from_dict(tomllib.loads(text))
    assert again.to_dict() == cfg.to_dict(), f"{what}: does not reload to itself:\n{text}"
    assert again.to_toml() == text, f"{what}: the TOML changes on a second round trip"
    return True


def _words(path: tuple) -> list[str]:
    """What an error about ``path`` may name: any of its keys (a cross-field check names a neighbour) or the
    section."""
    keys = [k for k in path if isinstance(k, str)]
    words = [k if k.isidentifier() else repr(k) for k in keys]
    if path and path[0] == "model":
        words.append("model.")  # topology errors name model.layers[i] or model.num_classes
    if path and path[0] in ("train", "model"):
        words.append("hw.")  # the hardware widths depend on the batch and the topology
    if path and path[0] == "preset":
        words.append("preset")
    return words


@pytest.mark.parametrize("seed", [0, 1])
def test_mutated_preset_files_load_or_fail_with_one_line(seed):
    rng = random.Random(seed)
    raw = _raw_presets()
    accepted = 0
    for case in range(CASES):
        name = rng.choice(sorted(raw))
        data = copy.deepcopy(raw[name])
        paths = [_mutate(rng, data) for _ in range(rng.choice([1, 1, 2, 3]))]
        words = [w for p in paths for w in _words(p)]
        accepted += _check_outcome(lambda d=data: config_from_dict(d), words, f"case {case} ({name}, {paths})")
    # both outcomes must occur, or the mutations test nothing
    assert 0 < accepted < CASES


def _leaf_keys(cfg) -> list[str]:
    d = cfg.to_dict()
    d.pop("preset")
    return [".".join(map(str, p)) for p, v in _paths(d) if all(isinstance(k, str) for k in p)]


OVERRIDE_TEXTS = ["0", "-1", "3", "1e300", "1e-300", "-1e300", "2.5", "true", "nan", "inf", "x", '"a\\nb"',
                  '"ü"', "{a=1}", "{}", "[]", "[1, 2]", '[{type="dense", units=10}]', '"\\u0000"', "'lit'", "9" * 30,
                  "[[1]]", "=", "1 2"]


@pytest.mark.parametrize("seed", [0])
def test_random_overrides_load_or_fail_with_one_line(seed):
    rng = random.Random(seed)
    presets = {name: load_config(name) for name in PRESETS}
    keys = {name: _leaf_keys(cfg) for name, cfg in presets.items()}
    accepted = 0
    for case in range(CASES):
        name = rng.choice(sorted(presets))
        key = rng.choice(keys[name] + ["nonsense", "train.nonsense", "train.lr.initial.x"])
        value = rng.choice(OVERRIDE_TEXTS)
        words = key.split(".") + ["hw.", "model."]
        accepted += _check_outcome(lambda k=key, v=value, n=name: apply_overrides(presets[n], [f"{k}={v}"]),
                                   words, f"case {case} ({name}: --set {key}={value})")
    assert 0 < accepted < CASES
