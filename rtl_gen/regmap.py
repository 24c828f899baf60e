"""Control and status registers: declared once, numbered by a builder, exported as JSON, implemented by
:class:`CSRBank`.

A block declares what it needs as :class:`Register` objects made of :class:`Field` objects; nobody
writes an address by hand. :class:`RegisterMap` checks the declarations, assigns 32-bit-aligned byte
addresses and is the one source for

- the gateware: :class:`CSRBank` turns the map into a component with one port per field;
- the host: :meth:`RegisterMap.to_json` writes the map the driver reads back with
  :meth:`RegisterMap.from_json`, and :meth:`RegisterMap.encode` / :meth:`RegisterMap.decode` turn field
  values into register words and back by name, so host code never holds a raw offset or bit position;
- simulation without RTL: :class:`RegisterFile` is a Python model of the same semantics.

Access types (per field; a register's ``access`` is the default for its fields):

``rw``
    Read/write. The value drives the datapath (an output of :class:`CSRBank`); a write updates the bits
    whose byte strobe is set.
``ro``
    Read-only. The datapath drives the value (an input of :class:`CSRBank`); writes leave it alone. The
    field's ``reset`` is what the input holds when nothing drives it, which makes ``ro`` fields with a
    reset value usable as build-time constants (version, geometry).
``w1c``
    Sticky status, write 1 to clear. The datapath sets bits with a one-cycle ``<field>_set`` input; a
    write clears the bits written as 1. A set in the same cycle as a clear wins (no event is lost).
``pulse``
    Write-only strobe. A write emits the written bits on the output for exactly one cycle (zero
    otherwise); reads return 0. Use it for commands ("start", "soft reset").

A write to a register none of whose fields is writable, and any access to an address no register
occupies, is an error on the bus (AXI ``SLVERR``, see :mod:`rtl_gen.axil`).

Bits are numbered LSB first; fields without an explicit ``offset`` are packed upwards from the end of
the previous field. Registers without an explicit ``addr`` take the next free word after the previous
register. The map is ``DATA_WIDTH`` = 32 bits wide.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path

from amaranth import Cat, Const, Module, Mux, Shape, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "ACCESS",
    "DATA_WIDTH",
    "MAP_FORMAT",
    "CSRBank",
    "CSRBusSignature",
    "Field",
    "Register",
    "RegisterFile",
    "RegisterMap",
    "RegisterMapError",
    "regs_signature",
]

DATA_WIDTH = 32
"""Width of every register and of the register bus, in bits."""

ACCESS = ("ro", "rw", "w1c", "pulse")
"""Field access types (see the module docstring)."""

WRITABLE = frozenset({"rw", "w1c", "pulse"})

MAP_FORMAT = "xnortrain-regmap"
MAP_VERSION = 1

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


class RegisterMapError(ValueError):
    """A register declaration or map is invalid, or a host-side encode/decode was asked something wrong."""


def _check_name(kind: str, name: object) -> None:
    if (
        not isinstance(name, str)
        or not _NAME.match(name)
        or "__" in name
        or name.endswith("_")
        or keyword.iskeyword(name)
    ):
        raise RegisterMapError(
            f"{kind} name {name!r} must be lower_snake_case: a-z first, then a-z 0-9 and single '_' "
            "(no '__', no trailing '_'; Verilog port names are built from it)"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- Declarations ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One field of a register.

    Parameters (all after ``name`` and ``width`` keyword-only):
        name: lower_snake_case, unique in its register.
        width: bits, 1..32.
        access: ``"ro"``, ``"rw"``, ``"w1c"`` or ``"pulse"``; ``None`` takes the register's access.
        reset: value after reset (for ``ro``: the value read while the input is undriven); must fit
            ``width`` (signed range when ``signed``); 0 for ``pulse``.
        offset: LSB position in the register; ``None`` packs it after the previous field.
        signed: two's complement field (``rw`` and ``ro`` only); :meth:`decode` sign-extends.
        desc: one line for the generated documentation.
    """

    name: str
    width: int
    _: KW_ONLY
    access: str | None = None
    reset: int = 0
    offset: int | None = None
    signed: bool = False
    desc: str = ""

    def __post_init__(self):
        _check_name("field", self.name)
        where = f"field {self.name!r}"
        if not _is_int(self.width) or not 1 <= self.width <= DATA_WIDTH:
            raise RegisterMapError(f"{where}: width must be an integer in 1..{DATA_WIDTH}, not {self.width!r}")
        if self.access is not None and self.access not in ACCESS:
            raise RegisterMapError(f"{where}: access must be one of {ACCESS}, not {self.access!r}")
        if self.offset is not None and (not _is_int(self.offset) or not 0 <= self.offset < DATA_WIDTH):
            raise RegisterMapError(f"{where}: offset must be an integer in 0..{DATA_WIDTH - 1}, not {self.offset!r}")
        if not isinstance(self.signed, bool):
            raise RegisterMapError(f"{where}: signed must be True or False, not {self.signed!r}")
        if not _is_int(self.reset):
            raise RegisterMapError(f"{where}: reset must be an integer, not {self.reset!r}")
        lo, hi = self.value_range
        if not lo <= self.reset <= hi:
            raise RegisterMapError(f"{where}: reset {self.reset} does not fit {self.width} bits (range {lo}..{hi})")
        if not isinstance(self.desc, str):
            raise RegisterMapError(f"{where}: desc must be a string, not {self.desc!r}")

    @property
    def value_range(self) -> tuple[int, int]:
        """Smallest and largest value the field holds."""
        if self.signed:
            return -(1 << (self.width - 1)), (1 << (self.width - 1)) - 1
        return 0, (1 << self.width) - 1

    @property
    def shape(self) -> Shape:
        return signed(self.width) if self.signed else unsigned(self.width)

    @property
    def mask(self) -> int:
        """The field's bits in the register word (needs a resolved offset)."""
        return ((1 << self.width) - 1) << self._offset()

    @property
    def writable(self) -> bool:
        return self.access in WRITABLE

    def encode(self, value: int) -> int:
        """``value`` placed at the field's bits; raises if it does not fit."""
        lo, hi = self.value_range
        if not _is_int(value) or not lo <= value <= hi:
            raise RegisterMapError(f"field {self.name!r}: value {value!r} does not fit {self.width} bits ({lo}..{hi})")
        return (value & ((1 << self.width) - 1)) << self._offset()

    def decode(self, word: int) -> int:
        """The field's value in a register word (sign-extended for signed fields)."""
        raw = (word >> self._offset()) & ((1 << self.width) - 1)
        if self.signed and raw >> (self.width - 1):
            raw -= 1 << self.width
        return raw

    def _offset(self) -> int:
        if self.offset is None:
            raise RegisterMapError(f"field {self.name!r} has no offset yet; use the field of a RegisterMap")
        return self.offset

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "offset": self.offset,
            "width": self.width,
            "access": self.access,
            "reset": self.reset,
            "signed": self.signed,
            "desc": self.desc,
        }


@dataclass(frozen=True)
class Register:
    """One 32-bit register.

    Parameters (all after ``name`` and ``access`` keyword-only):
        name: lower_snake_case, unique in the map.
        access: default access of the fields (``"ro"``, ``"rw"``, ``"w1c"``, ``"pulse"``).
        fields: the fields; omitted means one field ``value`` of ``width`` bits (default 32) with
            ``reset``.
        width, reset, signed: only for the single-field form.
        addr: byte address (a multiple of 4); ``None`` lets the map assign it.
        strobe: also give the register one-cycle ``w_stb`` / ``r_stb`` outputs, pulsed on every
            successful write / read of it (e.g. to pop a FIFO on read).
        desc: one line for the generated documentation.
    """

    name: str
    access: str = "rw"
    _: KW_ONLY
    fields: tuple[Field, ...] = ()
    width: int | None = field(default=None, compare=False, repr=False)
    reset: int | None = field(default=None, compare=False, repr=False)
    signed: bool | None = field(default=None, compare=False, repr=False)
    addr: int | None = None
    strobe: bool = False
    desc: str = ""

    def __post_init__(self):
        _check_name("register", self.name)
        where = f"register {self.name!r}"
        if self.access not in ACCESS:
            raise RegisterMapError(f"{where}: access must be one of {ACCESS}, not {self.access!r}")
        fields = tuple(self.fields) if isinstance(self.fields, Iterable) else self.fields
        if not isinstance(fields, tuple) or not all(isinstance(f, Field) for f in fields):
            raise RegisterMapError(f"{where}: fields must be a sequence of Field, not {self.fields!r}")
        single = (self.width, self.reset, self.signed)
        if fields and any(v is not None for v in single):
            raise RegisterMapError(f"{where}: width/reset/signed are for the single-field form; put them on the fields")
        if not fields:
            fields = (
                Field(
                    "value",
                    DATA_WIDTH if self.width is None else self.width,
                    reset=self.reset or 0,
                    signed=bool(self.signed),
                ),
            )
        if self.addr is not None and (not _is_int(self.addr) or self.addr < 0 or self.addr % 4):
            raise RegisterMapError(f"{where}: addr must be a non-negative multiple of 4, not {self.addr!r}")
        if not isinstance(self.strobe, bool):
            raise RegisterMapError(f"{where}: strobe must be True or False, not {self.strobe!r}")
        object.__setattr__(self, "fields", self._resolve(fields))
        object.__setattr__(self, "width", None)
        object.__setattr__(self, "reset", None)
        object.__setattr__(self, "signed", None)

    def _resolve(self, fields: tuple[Field, ...]) -> tuple[Field, ...]:
        where = f"register {self.name!r}"
        names = [f.name for f in fields]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RegisterMapError(f"{where}: duplicate field name(s) {dupes}")
        resolved, owner, cursor = [], {}, 0
        for f in fields:
            access = f.access or self.access
            offset = cursor if f.offset is None else f.offset
            top = offset + f.width - 1
            if top >= DATA_WIDTH:
                raise RegisterMapError(
                    f"{where}: field {f.name!r} (bits {offset}..{top}) does not fit in {DATA_WIDTH} bits"
                )
            for bit in range(offset, top + 1):
                if bit in owner:
                    raise RegisterMapError(
                        f"{where}: field {f.name!r} (bits {offset}..{top}) overlaps field {owner[bit]!r} at bit {bit}"
                    )
                owner[bit] = f.name
            if f.signed and access not in ("rw", "ro"):
                raise RegisterMapError(f"{where}: field {f.name!r} is {access}; only rw and ro fields can be signed")
            if access == "pulse" and f.reset:
                raise RegisterMapError(f"{where}: pulse field {f.name!r} must have reset 0, not {f.reset}")
            resolved.append(replace(f, access=access, offset=offset))
            cursor = top + 1
        ports = [name for f in resolved for name in _field_ports(f)]
        if self.strobe:
            ports += ["w_stb", "r_stb"]
        clash = sorted({p for p in ports if ports.count(p) > 1})
        if clash:
            raise RegisterMapError(f"{where}: generated port name(s) {clash} collide (w1c fields add '<name>_set')")
        return tuple(resolved)

    # --- host-side helpers ---

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise RegisterMapError(
            f"register {self.name!r} has no field {name!r} (fields: {[f.name for f in self.fields]})"
        )

    @property
    def writable(self) -> bool:
        """Whether any field can be written (writes to other registers are bus errors)."""
        return any(f.writable for f in self.fields)

    @property
    def reset_word(self) -> int:
        """The word a read returns right after reset (ro fields at their undriven value)."""
        return sum(f.encode(f.reset) for f in self.fields if f.access != "pulse")

    def encode(self, base: int = 0, **values: int) -> int:
        """The word to write to set ``values`` by field name, other bits taken from ``base``.

        ``base`` is typically a word read back for read-modify-write: its ``w1c`` and ``pulse`` bits are
        dropped so that rewriting it clears no status and fires no command by accident. Naming a ``ro``
        field is an error.
        """
        word = base & ~sum(f.mask for f in self.fields if f.access in ("w1c", "pulse"))
        word &= (1 << DATA_WIDTH) - 1
        for name, value in values.items():
            f = self.field(name)
            if not f.writable:
                raise RegisterMapError(f"register {self.name!r}: field {name!r} is read-only")
            word = (word & ~f.mask) | f.encode(value)
        return word

    def decode(self, word: int) -> dict[str, int]:
        """Every field's value in ``word``, by name."""
        return {f.name: f.decode(word) for f in self.fields}

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "addr": self.addr,
            "access": self.access,
            "strobe": self.strobe,
            "reset": self.reset_word,
            "desc": self.desc,
            "fields": [f.to_dict() for f in self.fields],
        }


def _field_ports(f: Field) -> list[str]:
    return [f.name, f"{f.name}_set"] if f.access == "w1c" else [f.name]


# --- The map --------------------------------------------------------------------------------------------


class RegisterMap:
    """Registers with assigned addresses: the one description the gateware and the host share.

    Parameters:
        registers: the declarations, in address order for those without an explicit ``addr``.
        name: a label carried into the JSON (e.g. the accelerator's name).
        addr_width: byte-address bits of the bus (12 = a 4 KiB window, the smallest the Zynq AXI
            interconnect hands out); every register must lie below ``2**addr_width``.

    Raises :class:`RegisterMapError` on duplicate names or addresses, misaligned or out-of-range
    addresses, and (through :class:`Register`) overlapping or oversized fields.
    """

    def __init__(self, registers: Sequence[Register], *, name: str = "csr", addr_width: int = 12):
        _check_name("map", name)
        if not _is_int(addr_width) or not 2 < addr_width <= 32:
            raise RegisterMapError(f"addr_width must be an integer in 3..32, not {addr_width!r}")
        registers = list(registers)
        if not registers or not all(isinstance(r, Register) for r in registers):
            raise RegisterMapError(f"registers must be a non-empty sequence of Register, not {registers!r}")
        names = [r.name for r in registers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RegisterMapError(f"duplicate register name(s) {dupes}")

        explicit: dict[int, str] = {}
        for r in registers:
            if r.addr is not None:
                if r.addr in explicit:
                    raise RegisterMapError(
                        f"register {r.name!r}: addr {r.addr:#x} is already taken by register {explicit[r.addr]!r}"
                    )
                explicit[r.addr] = r.name
        placed, cursor, taken = [], 0, set(explicit)
        for r in registers:
            if r.addr is None:
                while cursor in taken:
                    cursor += 4
                r = replace(r, addr=cursor)
                taken.add(cursor)
            cursor = r.addr + 4
            if r.addr + 4 > 1 << addr_width:
                raise RegisterMapError(
                    f"register {r.name!r}: addr {r.addr:#x} lies outside the {addr_width}-bit address space "
                    f"(limit {(1 << addr_width) - 4:#x}); raise addr_width"
                )
            placed.append(r)
        self._registers = tuple(sorted(placed, key=lambda r: r.addr))
        self._by_name = {r.name: r for r in self._registers}
        self._by_addr = {r.addr: r for r in self._registers}
        self._name = name
        self._addr_width = addr_width

    @property
    def name(self) -> str:
        return self._name

    @property
    def addr_width(self) -> int:
        return self._addr_width

    @property
    def registers(self) -> tuple[Register, ...]:
        """The registers, sorted by address, with addresses and field offsets resolved."""
        return self._registers

    def __iter__(self) -> Iterator[Register]:
        return iter(self._registers)

    def __len__(self) -> int:
        return len(self._registers)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Register:
        try:
            return self._by_name[name]
        except KeyError:
            raise RegisterMapError(f"map {self._name!r} has no register {name!r}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RegisterMap) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"RegisterMap({self._name!r}, {len(self)} registers, addr_width={self._addr_width})"

    # --- host-side access by name ---

    def addr(self, name: str) -> int:
        """Byte address of register ``name``."""
        return self[name].addr

    def at(self, addr: int) -> Register | None:
        """The register holding byte address ``addr`` (low two bits ignored), or ``None``."""
        return self._by_addr.get(addr & ~3 & ((1 << self._addr_width) - 1))

    def encode(self, name: str, base: int = 0, **values: int) -> int:
        """Word for register ``name`` with ``values`` by field name (see :meth:`Register.encode`)."""
        return self[name].encode(base, **values)

    def decode(self, name: str, word: int) -> dict[str, int]:
        """Field values of register ``name`` in ``word``, by field name."""
        return self[name].decode(word)

    # --- export / import ---

    def to_dict(self) -> dict:
        return {
            "format": MAP_FORMAT,
            "version": MAP_VERSION,
            "name": self._name,
            "data_width": DATA_WIDTH,
            "addr_width": self._addr_width,
            "registers": [r.to_dict() for r in self._registers],
        }

    def to_json(self, *, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def from_dict(cls, d: Mapping) -> RegisterMap:
        if not isinstance(d, Mapping) or d.get("format") != MAP_FORMAT:
            raise RegisterMapError(f"not a register map: format must be {MAP_FORMAT!r}")
        if d.get("version") != MAP_VERSION:
            raise RegisterMapError(f"register map version {d.get('version')!r} is not supported (want {MAP_VERSION})")
        if d.get("data_width") != DATA_WIDTH:
            raise RegisterMapError(f"register map data_width {d.get('data_width')!r} is not {DATA_WIDTH}")
        try:
            registers = [
                Register(
                    r["name"],
                    r["access"],
                    addr=r["addr"],
                    strobe=r.get("strobe", False),
                    desc=r.get("desc", ""),
                    fields=[
                        Field(
                            f["name"],
                            f["width"],
                            access=f["access"],
                            reset=f.get("reset", 0),
                            offset=f["offset"],
                            signed=f.get("signed", False),
                            desc=f.get("desc", ""),
                        )
                        for f in r["fields"]
                    ],
                )
                for r in d["registers"]
            ]
        except (KeyError, TypeError) as e:
            raise RegisterMapError(f"register map entry is missing or malformed: {e!r}") from None
        return cls(registers, name=d["name"], addr_width=d["addr_width"])

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> RegisterMap:
        """Read a map written by :meth:`to_json` (JSON text, or a path to a file holding it)."""
        if isinstance(text_or_path, Path) or not str(text_or_path).lstrip().startswith("{"):
            text_or_path = Path(text_or_path).read_text()
        return cls.from_dict(json.loads(text_or_path))

    def to_markdown(self) -> str:
        """A register table for documentation."""
        lines = [
            f"# Register map `{self._name}` ({DATA_WIDTH}-bit registers, {self._addr_width}-bit byte addresses)",
            "",
            "| addr | register | field | bits | access | reset | description |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in self._registers:
            lines.append(f"| {r.addr:#05x} | `{r.name}` | | | {r.access} | {r.reset_word:#x} | {r.desc} |")
            for f in r.fields:
                bits = f"{f.offset + f.width - 1}:{f.offset}" if f.width > 1 else f"{f.offset}"
                sign = " signed" if f.signed else ""
                lines.append(f"| | | `{f.name}` | {bits} | {f.access}{sign} | {f.reset} | {f.desc} |")
        return "\n".join(lines) + "\n"


# --- Behavioural model ----------------------------------------------------------------------------------


class RegisterFile:
    """Python model of a :class:`CSRBank` with the exact semantics of the gateware.

    For a simulated board (host code without RTL) and as the reference in register testbenches.
    ``inputs`` holds what the datapath drives into ``ro`` fields; ``outputs()`` what ``rw`` and ``w1c``
    fields drive out; ``pulses`` collects ``(register, field, value)`` for every nonzero pulse emitted.
    """

    def __init__(self, regmap: RegisterMap):
        self.regmap = regmap
        self.values = {(r.name, f.name): f.reset for r in regmap for f in r.fields if f.access != "pulse"}
        self.pulses: list[tuple[str, str, int]] = []
        self.strobes: list[tuple[str, str]] = []

    def _field(self, reg: str, name: str, access: str) -> Field:
        f = self.regmap[reg].field(name)
        if f.access != access:
            raise RegisterMapError(f"{reg}.{name} is {f.access}, not {access}")
        return f

    def set_input(self, reg: str, name: str, value: int) -> None:
        """The datapath drives ``value`` into ro field ``reg.name``."""
        f = self._field(reg, name, "ro")
        f.encode(value)  # range check
        self.values[reg, name] = value

    def set_status(self, reg: str, name: str, bits: int) -> None:
        """The datapath pulses ``<name>_set`` of w1c field ``reg.name`` with ``bits``."""
        f = self._field(reg, name, "w1c")
        self.values[reg, name] |= bits & ((1 << f.width) - 1)

    def output(self, reg: str, name: str) -> int:
        """Value an rw or w1c field drives towards the datapath."""
        f = self.regmap[reg].field(name)
        if f.access not in ("rw", "w1c"):
            raise RegisterMapError(f"{reg}.{name} is {f.access}; only rw and w1c fields hold a value")
        return self.values[reg, name]

    def read(self, addr: int) -> tuple[int, bool]:
        """``(word, ok)``; an unmapped address reads ``(0, False)``."""
        r = self.regmap.at(addr)
        if r is None:
            return 0, False
        if r.strobe:
            self.strobes.append((r.name, "r"))
        return sum(f.encode(self.values[r.name, f.name]) for f in r.fields if f.access != "pulse"), True

    def write(self, addr: int, data: int, strb: int = 0xF) -> bool:
        """Apply a bus write; returns ``ok`` (False: unmapped, or no writable field, nothing changes)."""
        r = self.regmap.at(addr)
        if r is None or not r.writable:
            return False
        enable = sum(0xFF << (8 * i) for i in range(DATA_WIDTH // 8) if strb >> i & 1)
        for f in r.fields:
            bits = (data & enable & f.mask) >> f.offset
            keep = (~enable & f.mask) >> f.offset
            if f.access == "rw":
                old = self.values[r.name, f.name] & ((1 << f.width) - 1)
                self.values[r.name, f.name] = f.decode(((old & keep) | bits) << f.offset)
            elif f.access == "w1c":
                self.values[r.name, f.name] &= ~bits
            elif f.access == "pulse" and bits:
                self.pulses.append((r.name, f.name, bits))
        if r.strobe:
            self.strobes.append((r.name, "w"))
        return True


# --- Gateware -------------------------------------------------------------------------------------------


class CSRBusSignature(wiring.Signature):
    """The register bus between a bus bridge (e.g. :class:`rtl_gen.axil.AXI4LiteCSRBridge`) and a
    :class:`CSRBank`, seen from the bridge.

    Members:
        addr: Out(addr_width) byte address; the low two bits are ignored.
        w_stb: Out(1) write ``w_data`` under byte enables ``w_strb`` this cycle.
        w_data: Out(32), w_strb: Out(4).
        r_stb: Out(1) a read of ``addr`` happens this cycle (for ``strobe`` registers).
        r_data: In(32) the word at ``addr``, combinational (0 if unmapped).
        r_ok: In(1) ``addr`` is mapped, combinational.
        w_ok: In(1) ``addr`` is mapped and has a writable field, combinational.
    """

    def __init__(self, *, addr_width: int):
        if not _is_int(addr_width) or not 2 < addr_width <= 32:
            raise ValueError(f"addr_width must be an integer in 3..32, not {addr_width!r}")
        self._addr_width = addr_width
        super().__init__(
            {
                "addr": Out(addr_width),
                "w_stb": Out(1),
                "w_data": Out(DATA_WIDTH),
                "w_strb": Out(DATA_WIDTH // 8),
                "r_stb": Out(1),
                "r_data": In(DATA_WIDTH),
                "r_ok": In(1),
                "w_ok": In(1),
            }
        )

    @property
    def addr_width(self) -> int:
        return self._addr_width

    def __eq__(self, other):
        return type(other) is type(self) and other.addr_width == self.addr_width

    def __repr__(self):
        return f"CSRBusSignature(addr_width={self._addr_width})"


def _register_signature(r: Register) -> wiring.Signature:
    members = {}
    for f in r.fields:
        if f.access == "rw":
            members[f.name] = Out(f.shape, init=f.reset)
        elif f.access == "ro":
            members[f.name] = In(f.shape, init=f.reset)
        elif f.access == "pulse":
            members[f.name] = Out(f.shape)
        else:  # w1c
            members[f.name] = Out(f.shape, init=f.reset)
            members[f"{f.name}_set"] = In(f.width)
    if r.strobe:
        members["w_stb"] = Out(1)
        members["r_stb"] = Out(1)
    return wiring.Signature(members)


def regs_signature(regmap: RegisterMap) -> wiring.Signature:
    """The datapath side of a :class:`CSRBank`: one member per register, one sub-member per field
    (``rw``/``pulse``/``w1c`` outputs, ``ro`` and ``<w1c>_set`` inputs, ``w_stb``/``r_stb`` outputs)."""
    return wiring.Signature({r.name: Out(_register_signature(r)) for r in regmap})


class CSRBank(wiring.Component):
    """The registers of a :class:`RegisterMap` as gateware.

    Ports:
        bus: ``In(CSRBusSignature(addr_width=regmap.addr_width))``, driven by a bus bridge.
        regs: ``Out(regs_signature(regmap))``; ``regs.<register>.<field>`` is an output for ``rw``,
            ``pulse`` and ``w1c`` fields, an input for ``ro`` fields; ``w1c`` fields also have the input
            ``regs.<register>.<field>_set``. In Verilog: ``regs__<register>__<field>``.

    Timing: writes take effect at the clock edge that ends the ``w_stb`` cycle; ``rw``/``w1c`` outputs
    show the new value, and ``pulse`` outputs and ``w_stb``/``r_stb`` strobes are high, during the next
    cycle. Reads are combinational (``r_data``, ``r_ok``, ``w_ok`` follow ``addr``).
    """

    def __init__(self, regmap: RegisterMap):
        if not isinstance(regmap, RegisterMap):
            raise TypeError(f"regmap must be a RegisterMap, not {regmap!r}")
        self._regmap = regmap
        super().__init__(
            {"bus": In(CSRBusSignature(addr_width=regmap.addr_width)), "regs": Out(regs_signature(regmap))}
        )

    @property
    def regmap(self) -> RegisterMap:
        return self._regmap

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        word = bus.addr[2:]
        byte_en = Cat(bus.w_strb[i // 8] for i in range(DATA_WIDTH))

        with m.Switch(word):
            for r in self._regmap:
                with m.Case(r.addr >> 2):
                    m.d.comb += [
                        bus.r_data.eq(self._read_value(r)),
                        bus.r_ok.eq(1),
                        bus.w_ok.eq(int(r.writable)),
                    ]

        for r in self._regmap:
            port = getattr(self.regs, r.name)
            selected = word == (r.addr >> 2)
            wr = bus.w_stb & selected if r.writable else Const(0)
            for f in r.fields:
                sig = getattr(port, f.name)
                data = bus.w_data[f.offset : f.offset + f.width]
                en = byte_en[f.offset : f.offset + f.width]
                written = Mux(wr, data & en, 0)
                if f.access == "rw":
                    with m.If(wr):
                        m.d.sync += sig.eq(Cat(Mux(en[i], data[i], sig[i]) for i in range(f.width)))
                elif f.access == "pulse":
                    m.d.sync += sig.eq(written)
                elif f.access == "w1c":
                    set_bits = getattr(port, f"{f.name}_set")
                    m.d.sync += sig.eq((sig & ~written) | set_bits)
            if r.strobe:
                m.d.sync += [port.w_stb.eq(wr), port.r_stb.eq(bus.r_stb & selected)]
        return m

    def _read_value(self, r: Register):
        port = getattr(self.regs, r.name)
        word = Const(0, DATA_WIDTH)
        for f in r.fields:
            if f.access != "pulse":
                word = word | (getattr(port, f.name).as_unsigned() << f.offset)
        return word[:DATA_WIDTH]
