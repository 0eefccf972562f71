"""Unit strings → SI values (planner.units)."""

from __future__ import annotations

import math

import pytest

from planner.units import UnitError, format_bytes, format_si, parse_bucket_size, parse_quantity


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ("2 us", "time", 2e-6),
        ("2 µs", "time", 2e-6),
        ("1.5ms", "time", 1.5e-3),
        ("800 ns", "time", 800e-9),
        ("6 GB/s", "bandwidth", 6e9),
        ("400 Gbit/s", "bandwidth", 50e9),
        ("400 Gbps", "bandwidth", 50e9),
        ("900 GiB/s", "bandwidth", 900 * 2**30),
        ("80 GiB", "bytes", 80 * 2**30),
        ("80 GB", "bytes", 80e9),
        ("512 KiB", "bytes", 512 * 1024),
        ("1 EiB", "bytes", 2**60),
        ("2 EB", "bytes", 2e18),
        ("989 TFLOPS", "flop_rate", 989e12),
        ("67 TFLOP/s", "flop_rate", 67e12),
        ("1980 MHz", "frequency", 1.98e9),
        ("1e9 B/s", "bandwidth", 1e9),
        (6e9, "bandwidth", 6e9),
        (2, "time", 2.0),
    ],
)
def test_parse(text, kind, expected):
    assert parse_quantity(text, kind) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("value", "kind", "fragment"),
    [
        ("6 GB", "bandwidth", "unknown unit 'GB' for a bandwidth"),
        # a bandwidth's size unit without '/s': the '/s' spelling the docs use, not
        # 'GBps' (the closest spelling, which the 2026-12-07 audit got)
        ("351.3 GB", "bandwidth", "did you mean 'GB/s'?"),
        ("400 Gbit", "bandwidth", "did you mean 'Gbit/s'?"),
        ("fast", "bandwidth", "expected a bandwidth like '6 GB/s' or '400 Gbit/s', got 'fast'"),
        ("450 GB/h", "bandwidth", "did you mean 'GB/s'?"),
        (True, "time", "expected a time like '2 us', got true"),
        (None, "bytes", "got null"),
        (-1, "bytes", "expected a positive value"),
        (0, "time", "expected a positive value"),
        (math.nan, "time", "expected a finite value"),
        (math.inf, "bandwidth", "expected a finite value"),
        ("1e999 GB/s", "bandwidth", "expected a finite value"),
        ([1], "time", "got list"),
    ],
)
def test_parse_errors(value, kind, fragment):
    with pytest.raises(UnitError) as exc:
        parse_quantity(value, kind)
    assert fragment in str(exc.value)


def test_zero_allowed_when_not_positive():
    assert parse_quantity("0 us", "time", positive=False) == 0.0
    with pytest.raises(UnitError):
        parse_quantity("-1 us", "time", positive=False)


def test_format():
    assert format_si(6e9, "B/s") == "6 GB/s"
    assert format_si(2e-6, "s") == "2 µs"
    assert format_bytes(80 * 2**30) == "80 GiB"
    assert format_bytes(3 * 2**60) == "3 EiB" and format_bytes(2**59) == "512 PiB"
    assert format_bytes(12) == "12 B"


@pytest.mark.parametrize(("value", "expected"), [
    ("0", 0.0), (0, 0.0), ("0 B", 0.0), ("25 MiB", 26214400.0), ("1.5 B", 2.0),
    ("0.6 B", 1.0), ("0.1 MiB", 104858.0),  # 104,857.6 bytes, rounded to the nearest
    ("1000 B", 1000.0), (0.0, 0.0), ("1 PiB", 2.0**50),
])
def test_bucket_sizes_are_whole_bytes(value, expected):
    assert parse_bucket_size(value) == expected


@pytest.mark.parametrize(("value", "said"), [
    ("0.4 B", "less than one byte; use 0 for one bucket per layer"),
    # a bare number in a training file: bytes in the other unit fields, but the CLI
    # refuses `--bucket-size 25` and PyTorch's bucket_cap_mb counts MiB
    (25, r"expected a size with its unit, such as '25 MiB', got 25 \(a unit is needed"),
    (0.25, "a unit is needed"),
    ("-1 B", "non-negative"),
    # no unit and a minus sign: the sign is what is wrong (2026-12-07 audit: it said a
    # unit is needed, and '-5 MiB' then said non-negative)
    ("-5", r"expected a non-negative value for a size in bytes like '80 GiB', got '-5'$"),
    ("25 MB/s", "unknown unit"),
    # 1 PiB, 2**50 bytes, is taken; a byte more is a slip of the unit
    ("1e30 TiB", r"'1e30 TiB' is more than 1 PiB \(a unit too large\?\)"),
    ("1.001 PiB", "more than 1 PiB"),
])
def test_bucket_sizes_refused(value, said):
    with pytest.raises(UnitError, match=said):
        parse_bucket_size(value)


def test_count_pluralises_and_separates_thousands():
    from planner.units import count

    assert [count(n, "device") for n in (0, 1, 2, 16384)] == [
        "0 devices", "1 device", "2 devices", "16,384 devices"]
    assert count(2, "more row") == "2 more rows"
    assert count(3, "child", "children") == "3 children"


def test_long_times_stay_in_seconds_and_rates_group_thousands():
    """From 1,000 s a time is written in seconds: '109.9 Ms' for 1.099e8 s read as
    milliseconds (2026-12-07 audit). Rates are whole and grouped from 100 up."""
    from planner.units import format_rate, format_time

    assert format_time(0.0024437) == "2.444 ms"
    assert format_time(999.94) == "999.9 s"
    assert format_time(1234.4) == "1234 s"
    assert format_time(1.0994e8) == "1.099e+08 s"
    assert format_time(float("inf")) == "inf s"
    assert [format_rate(x) for x in (419003.4, 100.0, 99.94, 12.54, 0.01234)] == [
        "419,003", "100", "99.9", "12.5", "0.0123"]


def test_edges_no_other_test_pinned_down():
    """An audit of the tests found these could change unnoticed (only the README's
    golden quickstart output caught the rounding): plans round to 4 significant digits,
    byte counts to whole bytes; a peak equal to the capacity fits; the fewest
    microbatches that fit round up (activations of 8 over 3 units of room at 1
    microbatch need 8/3, so 3, the next divisor of the batch of 6; flooring gave 2,
    which does not fit)."""
    from planner.costs.memory import MemoryReport
    from planner.output import round_sig, rounded
    from planner.search import _microbatches_that_fit

    assert round_sig(123456.0) == 123500.0 and round_sig(1.23456e-3) == 1.235e-3
    assert rounded({"x_s": 1.23456e-3, "peak_bytes": 26214400.4, "n": 3}) == {
        "x_s": 1.235e-3, "peak_bytes": 26214400, "n": 3}
    assert MemoryReport(1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 4.0).fits
    assert not MemoryReport(1.0, 1.0, 1.0, 1.0, 0.0, 1e-9, 4.0).fits
    # weights 4, activations 8: peak 12 of 7; room for activations 7 − 4 = 3
    mem = MemoryReport(4.0, 0.0, 0.0, 8.0, 0.0, 0.0, 7.0)
    assert _microbatches_that_fit(6, 1, mem) == 3
