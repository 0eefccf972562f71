"""Quantities with units, parsed at the edge; inside the planner everything is SI.

Accepted forms, for each kind of quantity (a plain YAML number is taken as SI already):

=============  ===========================================================  ==========
kind           examples                                                     SI unit
=============  ===========================================================  ==========
time           ``"2 us"``, ``"2 µs"``, ``"1.5 ms"``, ``"800 ns"``, ``"1 s"``  seconds
bytes          ``"80 GiB"``, ``"80 GB"``, ``"40 MiB"``, ``"512 KiB"``        bytes
bandwidth      ``"6 GB/s"``, ``"400 Gbit/s"``, ``"400 Gbps"``, ``"900 GiB/s"``  bytes/s
flop_rate      ``"989 TFLOPS"``, ``"67 TFLOP/s"``, ``"19.5 TF/s"``           FLOP/s
frequency      ``"1980 MHz"``, ``"1.4 GHz"``                                 Hz
power          ``"700 W"``, ``"0.7 kW"``                                     W
=============  ===========================================================  ==========

Decimal prefixes (k, M, G, T, P, E) are powers of 1000 and binary ones (Ki, Mi, Gi, Ti,
Pi, Ei) powers of 1024. A lowercase ``b`` or ``bit`` means bits, an uppercase ``B`` bytes.
"""

from __future__ import annotations

import math
import re
from typing import Literal

#: the most devices and the largest batch any command or file takes (far above any
#: machine: they keep arithmetic on them exact and bounded)
MAX_GPUS, MAX_BATCH = 2**30, 2**40
#: the largest gradient bucket taken (1 PiB)
MAX_BUCKET_BYTES = 2**50

Kind = Literal["time", "bytes", "bandwidth", "flop_rate", "frequency", "power", "number"]

_DEC = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}

_EXAMPLE = {
    "time": "'2 us'",
    "bytes": "'80 GiB'",
    "bandwidth": "'6 GB/s' or '400 Gbit/s'",
    "flop_rate": "'989 TFLOPS'",
    "frequency": "'1980 MHz'",
    "power": "'700 W'",
    "number": "42",
}

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_QUANTITY = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-zµμ/]*)\s*$")


def _build_units() -> dict[Kind, dict[str, float]]:
    units: dict[Kind, dict[str, float]] = {
        "time": {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9},
        "bytes": {},
        "bandwidth": {},
        "flop_rate": {},
        "frequency": {},
        "power": {},
        "number": {"": 1.0},
    }
    for p, f in _DEC.items():
        units["bytes"][f"{p}B"] = f
        units["bandwidth"][f"{p}B/s"] = f
        units["bandwidth"][f"{p}Bps"] = f
        units["bandwidth"][f"{p}bit/s"] = f / 8
        units["bandwidth"][f"{p}b/s"] = f / 8
        units["bandwidth"][f"{p}bps"] = f / 8
        for spelling in ("FLOPS", "FLOP/s", "flops", "flop/s", "F/s"):
            units["flop_rate"][f"{p}{spelling}"] = f
        units["frequency"][f"{p}Hz"] = f
        units["power"][f"{p}W"] = f
    for p, f in _BIN.items():
        units["bytes"][f"{p}B"] = f
        units["bandwidth"][f"{p}B/s"] = f
        units["bandwidth"][f"{p}bit/s"] = f / 8
    # "kB" and "KB" both mean 1000 bytes here; say KiB for 1024.
    return units


_UNITS = _build_units()


class UnitError(ValueError):
    """A quantity that could not be parsed; the message says what was expected."""


def describe(kind: Kind) -> str:
    """A short human description of a kind of quantity with an example."""
    names = {
        "time": "a time",
        "bytes": "a size in bytes",
        "bandwidth": "a bandwidth",
        "flop_rate": "a FLOP rate",
        "frequency": "a frequency",
        "power": "a power",
        "number": "a number",
    }
    return f"{names[kind]} like {_EXAMPLE[kind]}"


def parse_quantity(value: object, kind: Kind, *, positive: bool = True) -> float:
    """Parse a number or a unit string into SI units.

    Raises :class:`UnitError` with a message naming the expected form. Booleans,
    NaN, infinities and (with ``positive``) zero or negative values are rejected.
    """
    if isinstance(value, bool) or value is None:  # spelled as YAML does
        raise UnitError(f"expected {describe(kind)}, got "
                        f"{ {True: 'true', False: 'false', None: 'null'}[value]}")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        m = _QUANTITY.match(value)
        if m is None:
            raise UnitError(f"expected {describe(kind)}, got {value!r}")
        unit = m.group(2)
        table = _UNITS[kind]
        if not unit and (float(m.group(1)) < 0 or (positive and float(m.group(1)) == 0)):
            # the sign is wrong whatever the unit: say that, not that one is missing
            raise UnitError(f"expected a {'positive' if positive else 'non-negative'} "
                            f"value for {describe(kind)}, got {value!r}")
        if unit not in table:
            known = _closest_unit(unit, kind)
            extra = f"; did you mean '{known}'?" if known else ""
            raise UnitError(
                f"unknown unit {unit!r} for {describe(kind)}{extra}"
                if unit
                else f"expected {describe(kind)}, got {value!r} (a unit is needed)"
            )
        number = float(m.group(1)) * table[unit]
    else:
        raise UnitError(f"expected {describe(kind)}, got {type(value).__name__}")
    if not math.isfinite(number):
        raise UnitError(f"expected a finite value for {describe(kind)}, got {value!r}")
    if positive and number <= 0:
        raise UnitError(f"expected a positive value for {describe(kind)}, got {value!r}")
    if not positive and number < 0:
        raise UnitError(f"expected a non-negative value for {describe(kind)}, got {value!r}")
    return number


def parse_bucket_size(value: object) -> float:
    """A gradient bucket size in whole bytes (rounded to the nearest; plans record whole
    bytes), or 0 for one bucket per layer. A size of less than one byte is refused: it
    would mean one bucket per collective, and read back as 0 or 1."""
    if isinstance(value, str) and value.strip() == "0":  # no unit needed for nothing
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value == 0:
            return 0.0
        # a training file's `bucket_size: 25` would be 25 bytes where the CLI refuses
        # `--bucket-size 25`; PyTorch's bucket_cap_mb counts MiB: say which
        raise UnitError(f"expected a size with its unit, such as '{value:g} MiB', got "
                        f"{value:g} (a unit is needed; 0 for one bucket per layer)")
    number = parse_quantity(value, "bytes", positive=False)
    if 0 < number < 0.5:
        raise UnitError(f"{value!r} is less than one byte; use 0 for one bucket per layer, "
                        "or a size such as '25 MiB'")
    if number > MAX_BUCKET_BYTES:
        # any bucket over the gradients is one bucket for all of them; past 1 PiB the
        # number is a slip (a unit too big), and would be written into the plan as is
        raise UnitError(f"{value!r} is more than 1 PiB (a unit too large?): give a size "
                        "such as '25 MiB', PyTorch DDP's default; any size over the "
                        "gradients puts them all in one bucket")
    return float(round(number))


def _closest_unit(unit: str, kind: Kind) -> str | None:
    """The unit meant: one spelled the same but for case first ('gbps' is 'Gbps', not
    'bps'; where the case means bits or bytes, the bits one, as 'gbps' reads), else the
    closest spelling."""
    import difflib

    if kind == "bandwidth" and unit + "/s" in _UNITS[kind]:
        return unit + "/s"  # 'GB' for a bandwidth is 'GB/s', the docs' spelling
    same = [u for u in _UNITS[kind] if u.lower() == unit.lower()]
    if same:
        bits = [u for u in same if "b" in u and "B" not in u]
        return (bits or same)[0]
    match = difflib.get_close_matches(unit, list(_UNITS[kind]), n=1, cutoff=0.6)
    return match[0] if match else None


def format_si(value: float, unit: str, digits: int = 4) -> str:
    """Format a SI value with a decimal prefix, e.g. ``format_si(6e9, 'B/s') == '6 GB/s'``."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g} {unit}"
    prefixes = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
    small = [(1e-3, "m"), (1e-6, "µ"), (1e-9, "n"), (1e-12, "p")]
    mag = abs(value)
    for scale, p in prefixes:
        if mag >= scale:
            return f"{value / scale:.{digits}g} {p}{unit}"
    for scale, p in small:
        if mag >= scale:
            return f"{value / scale:.{digits}g} {p}{unit}"
    return f"{value:.{digits}g} {unit}"


def format_bytes(value: float, digits: int = 4) -> str:
    """Format a byte count with binary prefixes, e.g. ``'80 GiB'``."""
    mag = abs(value)
    for scale, p in ((2.0**60, "EiB"), (2.0**50, "PiB"), (2.0**40, "TiB"), (2.0**30, "GiB"),
                     (2.0**20, "MiB"), (2.0**10, "KiB")):
        if mag >= scale:
            return f"{value / scale:.{digits}g} {p}"
    return f"{value:.{digits}g} B"


def format_time(seconds: float, digits: int = 4) -> str:
    """Format a time in s, ms, µs or ns. From 1,000 s up it stays in seconds (``1.1e+08
    s``): a kilo- or megasecond prefix ("109.9 Ms") reads as milliseconds."""
    if math.isfinite(seconds) and abs(seconds) >= 1000:
        return f"{seconds:.{digits}g} s"
    return format_si(seconds, "s", digits)


def format_rate(x: float) -> str:
    """A rate (samples/s): whole numbers with thousands separated from 100 up, three
    significant digits below (``419,003``, ``12.5``)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun, plural unless ``n`` is 1: ``1 device``, ``8 devices``,
    ``16,384 devices`` (thousands separated, as the README and the tables write them)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
