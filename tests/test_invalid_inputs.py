"""Table-driven: every file in data/invalid/ gives exactly its '# expect:' messages and
exit code 2 (the style of black's data cases)."""

from __future__ import annotations

import pytest

from .conftest import DATA, invoke

CASES = sorted((DATA / "invalid").glob("*.yaml"))


def expected(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line[len("# expect: "):] for line in lines if line.startswith("# expect: ")]


@pytest.mark.parametrize("path", CASES, ids=[p.name for p in CASES])
def test_invalid_file(runner, path, monkeypatch):
    monkeypatch.chdir(path.parent)
    result = invoke(runner, "validate", path.name)
    assert result.exit_code == 2
    assert result.stdout == ""
    # "FILE:LINE:COL: error: ..." or, about the file itself, "FILE: error: ..."
    got = [line[len(path.name) + 1:].lstrip() for line in result.stderr.splitlines()
           if line.startswith(f"{path.name}:")]
    assert got == sorted(expected(path), key=lambda s: (0, 0) if s.startswith("error:")
                         else tuple(int(x) for x in s.split(":")[:2]))
    assert "Traceback" not in result.stderr


def test_corpus_is_not_empty():
    assert len(CASES) >= 20
