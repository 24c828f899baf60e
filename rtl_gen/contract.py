"""The contract between the generator and the host: what ``xnortrain generate`` writes and the driver reads.

One accelerator is described by an :class:`AcceleratorDescription` (``accelerator.json``): the register map
(:class:`rtl_gen.regmap.RegisterMap`, with the identification registers :data:`IDENTITY_REGISTERS`), the batch
and label formats, and the layout of every quantity that can be read back or restored (:class:`QuantityLayout`),
the beat width of the streams (:data:`BEAT_BITS`) and the word packing (:func:`pack_words`,
:func:`unpack_words`). :func:`description_hash` is built into the ``id_hash`` register by the generator and
compared with the description by the driver, so a bitstream and a description from different hardware are
refused (:meth:`host.driver.Driver.connect`).

The generator (:mod:`rtl_gen.host_interface`, :mod:`rtl_gen.controller`, :mod:`rtl_gen.top`) and the host
(:mod:`host.driver` and the transports) both import this module; it imports nothing from either side but the
register map, and runs on a board (Python 3.10, numpy 1.x, no ``tools`` extra).

Stream format of a quantity (:class:`QuantityLayout`): the model's array (``shape``) is padded with
zeros to ``pad``, reshaped to ``reshape``, transposed by ``transpose`` and flattened: that is the order
in which the hardware's memories hold the elements. ``elems_per_word`` consecutive elements of
``elem_bits`` bits each (element ``e`` at bits ``e * elem_bits``, two's complement if ``signed``,
weights as 1 = +1 / 0 = -1 if ``encoding == "sign"``) make one memory word, and a memory word travels as
``ceil(elems_per_word * elem_bits / 32)`` stream beats, least significant beat first. The last beat of
a transfer carries TLAST.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (PYNQ board images): the same parser, published as tomli (a dependency there)
    import tomli as tomllib

__all__ = [
    "BEAT_BITS",
    "DESCRIPTION_FORMAT",
    "DESCRIPTION_VERSION",
    "HASH_REGISTER",
    "HOST_ONLY_CONFIG",
    "HOST_ONLY_SCHEDULE",
    "IDENTITY_REGISTERS",
    "AcceleratorDescription",
    "QuantityLayout",
    "description_hash",
    "hardware_config",
    "pack_words",
    "unpack_words",
]

DESCRIPTION_FORMAT = "xnortrain-accelerator"
DESCRIPTION_VERSION = 1
BEAT_BITS = 32
#: The read-only register (``rtl_gen.controller.build_regmap``) holding :func:`description_hash` of the description.
HASH_REGISTER = "id_hash"
#: Registers that identify the accelerator (build-time constants) and are checked by :meth:`host.driver.Driver.connect`.
IDENTITY_REGISTERS = ("id", "info", "info_batch", HASH_REGISTER)


def _bits_of(values: np.ndarray, bits: int) -> np.ndarray:
    """``[n, bits]`` uint8 bit matrix of the low ``bits`` bits of int64 ``values`` (LSB first)."""
    v = np.ascontiguousarray(values.astype(np.int64).astype(np.uint64).reshape(-1))
    by = v.view(np.uint8).reshape(-1, 8)  # little-endian bytes on every supported host
    return np.unpackbits(by, axis=1, bitorder="little")[:, :bits]


def pack_words(values: np.ndarray, *, elem_bits: int, elems_per_word: int) -> np.ndarray:
    """uint32 beats of ``values`` (a flat int array whose length is a multiple of ``elems_per_word``):
    ``elems_per_word`` elements of ``elem_bits`` bits per memory word, each word as
    ``ceil(word bits / 32)`` beats, least significant first. Values are masked to ``elem_bits``."""
    values = np.asarray(values).reshape(-1)
    if len(values) % elems_per_word:
        raise ValueError(f"{len(values)} elements are not whole words of {elems_per_word}")
    n_words = len(values) // elems_per_word
    beats = math.ceil(elem_bits * elems_per_word / BEAT_BITS)
    bits = _bits_of(values, elem_bits).reshape(n_words, elems_per_word * elem_bits)
    padded = np.zeros((n_words, beats * BEAT_BITS), np.uint8)
    padded[:, : bits.shape[1]] = bits
    return np.packbits(padded, axis=1, bitorder="little").view("<u4").reshape(-1).astype(np.uint32)


def unpack_words(words: np.ndarray, *, elem_bits: int, elems_per_word: int, signed: bool = False) -> np.ndarray:
    """Inverse of :func:`pack_words`: int64 elements (sign-extended when ``signed``)."""
    words = np.asarray(words, dtype=np.uint32).reshape(-1)
    beats = math.ceil(elem_bits * elems_per_word / BEAT_BITS)
    if len(words) % beats:
        raise ValueError(f"{len(words)} beats are not whole memory words of {beats} beats")
    n_words = len(words) // beats
    bits = np.unpackbits(words.astype("<u4").view(np.uint8).reshape(n_words, beats * 4), axis=1, bitorder="little")
    bits = bits[:, : elems_per_word * elem_bits].reshape(n_words * elems_per_word, elem_bits)
    weights = np.left_shift(np.uint64(1), np.arange(elem_bits, dtype=np.uint64))
    raw = (bits.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    out = raw.astype(np.int64) if elem_bits < 64 else raw.view(np.int64)
    if signed and elem_bits < 64:
        out = np.where(out >> (elem_bits - 1) & 1, out - (1 << elem_bits), out)
    return out


@dataclass(frozen=True)
class QuantityLayout:
    """Where one array of the accelerator's state travels on the streams (see the module docstring).

    ``name`` and ``layer`` give the :meth:`host.driver.Driver.state_dict` key (``f"{name}{layer}"``; ``layer`` is
    ``None`` for whole-accelerator quantities); ``kind`` is the code the ``arg.quantity`` register
    field selects it with; ``access``: ``"rw"`` (read back and restore), ``"ro"`` (read back only).
    """

    name: str
    layer: int | None
    kind: int
    shape: tuple[int, ...]
    elem_bits: int
    elems_per_word: int
    pad: tuple[int, ...]
    reshape: tuple[int, ...]
    transpose: tuple[int, ...]
    signed: bool = False
    encoding: str = "int"  # "int" or "sign" (+1 -> 1, -1 -> 0)
    access: str = "rw"
    skip_pad_words: bool = False  # words whose first element is padding are not stored (sweep order)

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(v) for v in self.shape))
        object.__setattr__(self, "pad", tuple(int(v) for v in self.pad))
        object.__setattr__(self, "reshape", tuple(int(v) for v in self.reshape))
        object.__setattr__(self, "transpose", tuple(int(v) for v in self.transpose))
        if len(self.pad) != len(self.shape) or any(p < s for p, s in zip(self.pad, self.shape, strict=True)):
            raise ValueError(f"{self.key}: pad {self.pad} does not cover shape {self.shape}")
        if math.prod(self.reshape) != math.prod(self.pad) or sorted(self.transpose) != list(range(len(self.reshape))):
            raise ValueError(
                f"{self.key}: reshape {self.reshape} / transpose {self.transpose} do not fit pad {self.pad}")
        if math.prod(self.pad) % self.elems_per_word:
            raise ValueError(f"{self.key}: {math.prod(self.pad)} elements are not whole words of {self.elems_per_word}")
        if not 1 <= self.elem_bits <= 63:
            raise ValueError(f"{self.key}: elem_bits {self.elem_bits} out of 1..63")
        if self.encoding not in ("int", "sign") or self.access not in ("rw", "ro", "wo"):
            raise ValueError(f"{self.key}: bad encoding {self.encoding!r} or access {self.access!r}")

    @property
    def key(self) -> str:
        return self.name if self.layer is None else f"{self.name}{self.layer}"

    @property
    def words(self) -> int:
        """Memory words of the quantity."""
        return len(self._index()) // self.elems_per_word

    @property
    def beats_per_word(self) -> int:
        return math.ceil(self.elem_bits * self.elems_per_word / BEAT_BITS)

    @property
    def beats(self) -> int:
        """Stream beats of one transfer."""
        return self.words * self.beats_per_word

    def _index(self) -> np.ndarray:
        """Flat index into the padded array of every stream element, in stream order."""
        cached = self.__dict__.get("_idx")
        if cached is not None:
            return cached
        idx = np.arange(math.prod(self.pad)).reshape(self.reshape).transpose(self.transpose).reshape(-1)
        if self.skip_pad_words:
            first = idx.reshape(-1, self.elems_per_word)[:, 0]
            coords = np.unravel_index(first, self.pad)
            keep = np.ones(len(first), bool)
            for c, s in zip(coords, self.shape, strict=True):
                keep &= c < s
            idx = idx.reshape(-1, self.elems_per_word)[keep].reshape(-1)
        self.__dict__["_idx"] = idx
        return idx

    def encode(self, array) -> np.ndarray:
        """The beats that restore ``array`` (shape ``shape``)."""
        a = np.asarray(array)
        if a.shape != self.shape:
            raise ValueError(f"{self.key}: expected an array of shape {self.shape}, got {a.shape}")
        a = a.astype(np.int64)
        if self.encoding == "sign":
            if not np.isin(a, (-1, 1)).all():
                raise ValueError(f"{self.key}: weights must be +-1")
            a = (a > 0).astype(np.int64)
        lo, hi = (-(1 << (self.elem_bits - 1)), (1 << (self.elem_bits - 1)) - 1) if self.signed else (
            0, (1 << self.elem_bits) - 1)
        if a.size and (a.min() < lo or a.max() > hi):
            raise ValueError(f"{self.key}: values {a.min()}..{a.max()} do not fit {self.elem_bits} bits ({lo}..{hi})")
        padded = np.zeros(self.pad, np.int64)
        padded[tuple(slice(0, s) for s in self.shape)] = a
        return pack_words(padded.reshape(-1)[self._index()], elem_bits=self.elem_bits,
                          elems_per_word=self.elems_per_word)

    def decode(self, words: np.ndarray) -> np.ndarray:
        """The array (shape ``shape``, int64; int8 for sign-encoded weights) carried by ``words``."""
        if len(words) != self.beats:
            raise ValueError(f"{self.key}: expected {self.beats} beats, got {len(words)}")
        flat = unpack_words(words, elem_bits=self.elem_bits, elems_per_word=self.elems_per_word, signed=self.signed)
        padded = np.zeros(math.prod(self.pad), np.int64)
        padded[self._index()] = flat[: len(self._index())]
        a = padded.reshape(self.pad)[tuple(slice(0, s) for s in self.shape)]
        if self.encoding == "sign":
            return np.where(a > 0, 1, -1).astype(np.int8)
        return a.copy()

    def to_dict(self) -> dict:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        for k in ("shape", "pad", "reshape", "transpose"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> QuantityLayout:
        return cls(**dict(d))


@dataclass
class AcceleratorDescription:
    """What the host needs to know about one generated accelerator (``accelerator.json``).

    ``regmap``: the :class:`rtl_gen.regmap.RegisterMap`; ``batch``: samples per step; ``classes``;
    ``input``: ``"binary"`` or ``"int8"``; ``features``: inputs per sample; ``layers``: ``[n_in, n_out]``
    per weight layer; ``batch_layout`` and ``label_layout``: how one batch is uploaded (a
    :class:`QuantityLayout` each, with ``kind`` unused); ``quantities``: the readable/restorable arrays;
    ``kinds``: quantity name -> ``arg.quantity`` code; ``schedule``: the per-step constants of the
    optimiser (``{"optimizer": .., ...}``, see :meth:`host.driver.Driver.schedule_words`); ``config``: the resolved
    configuration (TOML text) the accelerator was generated from; ``clock_mhz``.
    """

    name: str
    regmap: Any
    batch: int
    classes: int
    input: str
    features: int
    layers: list[tuple[int, int]]
    batch_layout: QuantityLayout
    label_layout: QuantityLayout
    quantities: list[QuantityLayout]
    kinds: dict[str, int]
    schedule: dict = field(default_factory=dict)
    config: str = ""
    clock_mhz: float = 100.0

    def quantity(self, name: str, layer: int | None = None) -> QuantityLayout:
        for q in self.quantities:
            if q.name == name and q.layer == layer:
                return q
        raise KeyError(f"the accelerator has no quantity {name!r} for layer {layer!r}")

    def to_dict(self) -> dict:
        return {
            "format": DESCRIPTION_FORMAT,
            "version": DESCRIPTION_VERSION,
            "name": self.name,
            "regmap": self.regmap.to_dict(),
            "batch": self.batch,
            "classes": self.classes,
            "input": self.input,
            "features": self.features,
            "layers": [list(x) for x in self.layers],
            "batch_layout": self.batch_layout.to_dict(),
            "label_layout": self.label_layout.to_dict(),
            "quantities": [q.to_dict() for q in self.quantities],
            "kinds": dict(self.kinds),
            "schedule": dict(self.schedule),
            "config": self.config,
            "clock_mhz": self.clock_mhz,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def write_json(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def from_dict(cls, d: Mapping) -> AcceleratorDescription:
        from .regmap import RegisterMap

        if d.get("format") != DESCRIPTION_FORMAT or d.get("version") != DESCRIPTION_VERSION:
            raise ValueError(f"not an accelerator description (format {DESCRIPTION_FORMAT!r} v{DESCRIPTION_VERSION})")
        return cls(
            name=d["name"],
            regmap=RegisterMap.from_dict(d["regmap"]),
            batch=int(d["batch"]),
            classes=int(d["classes"]),
            input=d["input"],
            features=int(d["features"]),
            layers=[tuple(x) for x in d["layers"]],
            batch_layout=QuantityLayout.from_dict(d["batch_layout"]),
            label_layout=QuantityLayout.from_dict(d["label_layout"]),
            quantities=[QuantityLayout.from_dict(q) for q in d["quantities"]],
            kinds=dict(d["kinds"]),
            schedule=dict(d.get("schedule", {})),
            config=d.get("config", ""),
            clock_mhz=float(d.get("clock_mhz", 100.0)),
        )

    @classmethod
    def from_json(cls, text_or_path) -> AcceleratorDescription:
        if isinstance(text_or_path, Path) or not str(text_or_path).lstrip().startswith("{"):
            text_or_path = Path(text_or_path).read_text()
        return cls.from_dict(json.loads(text_or_path))


#: Configuration fields that only the host uses (the training run, the data, the float reference and its optimiser):
#: accelerator.json keeps them in ``config`` for the host, and :func:`description_hash` leaves them out, so changing
#: one leaves the Verilog (and the simulated board built from it) as it is. A section name covers the whole section.
#: Everything else (``model``, ``approx``, ``hw``, ``train.batch_size``, ``train.loss``, and any field added later)
#: counts as hardware. ``tests/rtl_gen/test_description_hash.py`` elaborates a configuration with every one of them
#: changed and compares the Verilog.
HOST_ONLY_CONFIG = ("name", "preset", "data", "optimizer", "e2train", "train.epochs", "train.max_steps",
                    "train.seed", "train.eval_batch_size", "train.lr")
#: Schedule entries the generator copies from host-only fields (the learning rate the switch threshold anneals
#: against, iir's alpha decay over the epochs): the driver computes the per-step constants from them.
HOST_ONLY_SCHEDULE = ("lr0", "epochs", "alpha_decay", "decay_factor", "decay_every")


def hardware_config(config: str | Mapping) -> dict:
    """The part of a configuration that the hardware is built from: the configuration (TOML text, as in
    accelerator.json's ``config``, or a dict) without :data:`HOST_ONLY_CONFIG`, as JSON types."""
    if isinstance(config, str):
        try:
            d = tomllib.loads(config)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"accelerator.json: its config is not TOML ({e})") from None
    else:
        d = json.loads(json.dumps(config))
    for key in HOST_ONLY_CONFIG:
        *path, last = key.split(".")
        node = d
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return d


def description_hash(desc: AcceleratorDescription | Mapping) -> int:
    """The 32-bit hash of an accelerator description (an :class:`AcceleratorDescription` or its ``to_dict()``,
    e.g. accelerator.json loaded): the generator builds it into the ``id_hash`` register, the driver compares
    the register with the hash of the description it was given (:meth:`host.driver.Driver.connect`).

    Covered: what the hardware is: everything ``to_dict()`` holds (geometry, every quantity layout, the batch and
    label formats, the optimiser schedule, the register map, the configuration) except the configuration's
    host-only fields (:data:`HOST_ONLY_CONFIG`, :func:`hardware_config`) and the schedule entries taken from them
    (:data:`HOST_ONLY_SCHEDULE`), the ``id_hash`` register's own value (set to 0 here: the map holding the hash must
    hash like the map built with 0) and ``clock_mhz`` (a setting of the bitstream build, not of the Verilog;
    :class:`host.transports.pynq.PynqTransport` compares it with the overlay's clock). So a new seed, number of
    epochs, data limit or learning rate gives the same hash, hence the same Verilog, and a description of other
    hardware another one. The dict goes through a JSON round trip first (the configuration as parsed, not as
    text), so a description and the same description read back from accelerator.json hash alike; then SHA-256
    of its canonical JSON text, first 4 bytes little-endian."""
    d = desc.to_dict() if isinstance(desc, AcceleratorDescription) else desc
    d = json.loads(json.dumps(d))  # a copy in JSON types (tuples -> lists, keys -> str)
    d.pop("clock_mhz", None)
    d["config"] = hardware_config(d.get("config") or "")
    for key in HOST_ONLY_SCHEDULE:
        d.get("schedule", {}).pop(key, None)
    for reg in d.get("regmap", {}).get("registers", []):
        if reg.get("name") == HASH_REGISTER:
            reg["reset"] = 0
            for f in reg.get("fields", []):
                f["reset"] = 0
    text = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
