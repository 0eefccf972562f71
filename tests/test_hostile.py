"""Hostile inputs: every case of the corpus (``tests/data/hostile``, see
:mod:`tests.hostile_cases`) ends with its exact message and exit code (2, or 1 for a valid
question without an answer, 0 where a plan exists), never a traceback, within 2 s of CPU
time; the heavy ones also as a real ``python -m planner`` process within 200 MB, and the
whole corpus in one process within 200 MB."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .hostile_cases import (
    MEMORY_LIMIT_BYTES,
    ROOT,
    Case,
    all_cases,
    expected_lines,
    file_cases,
    located_lines,
    prepared,
    run_in_process,
    run_process,
    unreadable_for_us,
    within_cpu_limit,
)

CASES = all_cases()
HEAVY = [c for c in CASES if c.subprocess]


def test_corpus_is_large_and_every_case_says_what_it_expects():
    assert len(file_cases()) >= 40
    assert len(CASES) >= 80
    assert len({c.name for c in CASES}) == len(CASES)
    for case in CASES:
        assert case.exit in (0, 1, 2), case.name
        if case.exit != 0:
            assert case.stderr_file or case.stderr_lines, f"{case.name}: no expected message"
    # the kinds of attack the corpus is meant to cover are all there
    names = " ".join(c.name for c in CASES)
    for word in ("syntax", "type_", "missing", "unknown", "number_zero", "negative", "nan",
                 "infinite", "1e300", "1e9", "shape", "kernel_larger", "groups", "prime",
                 "more_than_batch", "billion_laughs", "nesting-10000", "100-MB", "binary",
                 "utf8", "empty", "python_object", "python_name", "directory", "unreadable",
                 "unknown_device", "bad_units", "weightless", "duplicate_names",
                 "repeat_100000"):
        assert word in names, word
    assert len(HEAVY) >= 10


def _check_plan_output(args: list[str], stdout: str) -> None:
    """A plan printed on success has finite, non-negative times and a memory verdict."""
    if "--format" not in args:
        return
    fmt = args[args.index("--format") + 1]
    doc = json.loads(stdout) if fmt == "json" else yaml.safe_load(stdout)
    values = list(doc["iteration"].values())
    for layer in doc["layers"]:
        comm = layer["comm"]
        values += [layer["compute_s"], comm["forward_s"], comm["backward_data_s"],
                   comm["weight_grad_s"], comm["redistribute_s"]]
        values += [t["seconds"] for t in comm["terms"]]
    assert all(isinstance(v, float | int) and math.isfinite(v) and v >= 0 for v in values)
    assert doc["iteration"]["time_s"] > 0
    assert doc["memory"]["fits"] is True


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with prepared(case, tmp_path) as (args, cwd, values):
        if case.make == "unreadable":
            target = cwd / values["{file}"]
            if not unreadable_for_us(target):
                # running as root: chmod 000 does not stop reading, so the operating
                # system's refusal is simulated for that one file (never skipped)
                original = Path.open

                def denied(self: Path, *a: object, **k: object):  # type: ignore[no-untyped-def]
                    if self.resolve() == target.resolve():
                        raise PermissionError(13, "Permission denied")
                    return original(self, *a, **k)  # type: ignore[arg-type]

                monkeypatch.setattr(Path, "open", denied)
        code, stdout, stderr, cpu = run_in_process(args, cwd)
    assert "Traceback" not in stderr
    assert code == case.exit, stderr
    located, lines = expected_lines(case, values)
    if case.path is not None:
        # corpus files: exactly the expected FILE:LINE:COL problems, in the CLI's order
        assert located_lines(stderr, values["{file}"]) == located
    got = stderr.splitlines()
    for line in lines:
        assert line in got, f"missing on stderr: {line!r}\n--- stderr:\n{stderr}"
    ok, limit = within_cpu_limit(cpu)
    assert ok, f"{case.name}: {cpu:.2f} s of CPU (limit {limit:.2f} s on this machine)"
    if code == 0:
        _check_plan_output(args, stdout)


@pytest.mark.parametrize("case", HEAVY, ids=[c.name for c in HEAVY])
def test_real_process(case: Case, tmp_path: Path) -> None:
    """The heavy cases as a user runs them: the real exit status, no traceback, the time
    (start-up included) and the peak memory of the process."""
    with prepared(case, tmp_path) as (args, cwd, _):
        code, stderr, cpu, peak = run_process(args, cwd)
    assert code == case.exit, stderr
    assert "Traceback" not in stderr
    if case.exit != 0:
        assert stderr.strip(), "a refusal must say why"
    ok, limit = within_cpu_limit(cpu)
    assert ok, f"{cpu:.2f} s of CPU (limit {limit:.2f} s on this machine)"
    assert peak < MEMORY_LIMIT_BYTES, f"{peak / 2**20:.0f} MiB"


def test_whole_corpus_in_one_process_stays_under_200_mb():
    """Every case, one after another in one process: its peak memory bounds each case's."""
    proc = subprocess.run([sys.executable, "-m", "tests.hostile_cases"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=True)
    report = json.loads(proc.stdout)
    expected = {c.name: c.exit for c in CASES}
    ran = report["cases"]
    assert set(ran) >= set(expected) - {"unreadable-file"}
    wrong = {name: r["exit"] for name, r in ran.items() if r["exit"] != expected[name]}
    assert not wrong, wrong  # (the time of each case is held to its bound in test_case)
    assert report["peak_rss_bytes"] < MEMORY_LIMIT_BYTES, report["peak_rss_bytes"] / 2**20
