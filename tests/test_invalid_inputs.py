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
    # under each located message: the file's line, and a caret under its column
    source = path.read_text(encoding="utf-8").splitlines()
    out = result.stderr.splitlines()
    for i, line in enumerate(out):
        if not line.startswith(f"{path.name}:") or line[len(path.name) + 1].isspace():
            continue
        row, col = (int(x) for x in line[len(path.name) + 1:].split(":")[:2])
        assert out[i + 1] == "    " + source[row - 1].expandtabs(1), (line, out[i + 1])
        assert out[i + 2] == "    " + " " * (col - 1) + "^", (line, out[i + 2])


def test_corpus_is_not_empty():
    assert len(CASES) >= 20


def _plan(runner, tmp_path, *extra):
    from .conftest import CLUSTERS, NETWORKS

    out = tmp_path / f"plan{len(extra)}.yaml"
    r = invoke(runner, "plan", NETWORKS / "gpt2-small.yaml", CLUSTERS / "pcie-8gpu.yaml",
               "-p", "8", "-b", "16", *extra, "-o", out)
    assert r.exit_code == 0, r.stderr
    return out.read_text()


def _edited(text: str, name: str, key: str, value: str) -> tuple[str, int, int]:
    """The plan with layer ``name``'s ``key`` set to ``value`` (added after its name where
    it has none), and the 1-based line and column of the value."""
    lines = text.split("\n")
    at = lines.index(f"  name: {name}") if f"  name: {name}" in lines else \
        lines.index(f"- name: {name}")
    start = at if lines[at].startswith("- ") else at - 1
    for i in range(start, len(lines)):
        if i > start and lines[i].startswith("- "):
            break
        head = lines[i][:2]
        if lines[i][2:].startswith(f"{key}: "):
            lines[i] = f"{head}{key}: {value}"
            return "\n".join(lines), i + 1, len(head) + len(key) + 3
    lines.insert(at + 1, f"  {key}: {value}")
    return "\n".join(lines), at + 2, len(key) + 5


def test_a_following_layers_stage_is_checked(runner, tmp_path):
    """The stage of a layer that follows another's layout (on no grid's list) was not
    checked: `stage: banana`, 9 or -3 passed validate and launch, and so did `stage: 5`
    in a plan without a pipeline (found by an audit)."""
    piped, flat = _plan(runner, tmp_path, "--pipeline", "2"), _plan(runner, tmp_path)
    plan = tmp_path / "edited.yaml"
    for text, value, expect in ((piped, "banana", "a whole number 0 to 1, got 'banana'"),
                                (piped, "9", "a whole number 0 to 1, got 9"),
                                (piped, "-3", "a whole number 0 to 1, got -3"),
                                (flat, "5", "0 (the plan has no pipeline), got 5")):
        edited, line, col = _edited(text, "h.8.mlp.ln_2", "stage", value)
        plan.write_text(edited)
        for cmd in (["validate"], ["launch", "--emit", "env"]):
            r = invoke(runner, *cmd, plan)
            assert r.exit_code == 2, (cmd, value, r.stdout)
            assert f"{plan}:{line}:{col}: error: layer 'h.8.mlp.ln_2': expected its " \
                   f"pipeline stage, {expect} (at $.layers[" in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
    for text, value in ((piped, "1"), (flat, "0")):  # what the plan says, written out
        plan.write_text(_edited(text, "h.8.mlp.ln_2", "stage", value)[0])
        assert invoke(runner, "validate", plan).exit_code == 0


def test_a_layers_stage_and_placement_are_named_where_they_are_wrong(runner, tmp_path):
    """`stage: '1'` on a layer with weights was "is 1x4 rows, stage 1 here but 1x4 rows,
    stage 1 in $.placement.grids[2]", at its grid; `placement: diag` the same kind of
    comparison. Each is now said at the value: a stage is a whole number, a placement
    rows or cols."""
    piped = _plan(runner, tmp_path, "--pipeline", "2")
    plan = tmp_path / "edited.yaml"
    for key, value, expect in (("stage", "'1'", "expected its pipeline stage, a whole "
                                                "number 0 to 1, got '1'"),
                               ("placement", "diag", "unknown placement 'diag'; expected "
                                                     "rows or cols")):
        edited, line, col = _edited(piped, "h.8.mlp.c_fc", key, value)
        plan.write_text(edited)
        r = invoke(runner, "validate", plan)
        assert r.exit_code == 2
        assert r.stderr.startswith(f"{plan}:{line}:{col}: error: layer 'h.8.mlp.c_fc': "
                                   f"{expect} (at $.layers["), r.stderr
        assert "here but" not in r.stderr


@pytest.mark.parametrize("command, kind", [("validate", "network"), ("check", "training")])
def test_a_file_of_null_is_not_called_empty(runner, tmp_path, command, kind):
    """A file (a network's, a training configuration's) holding only `~` was reported as
    "the file is empty"; it holds null, and the message says so. One of comments alone
    is still empty."""
    path = tmp_path / "null.yaml"
    path.write_text("~\n")
    r = invoke(runner, command, path)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{path}:1:1: error: the file holds null (~), not a "
                               f"mapping: expected a YAML mapping with 'kind: {kind}'")
    if command == "check":
        path.write_text("# nothing yet\n")
        r = invoke(runner, command, path)
        assert r.exit_code == 2 and f"{path}: error: the file is empty: expected" in r.stderr


def test_a_grids_companions_beside_a_plan_say_what_they_go_with(runner, tmp_path):
    """Found by an audit: 'mode' beside a plan was "unknown key 'mode' in the strategy;
    expected one of: grid, pins, plan", which names the key it goes with as if 'mode'
    were misspelt; and 'network: [1, 2]' in a cluster told of two missing tiers before
    saying the network is a list."""
    from .conftest import CLUSTERS, NETWORKS

    plan = tmp_path / "p.yaml"
    assert invoke(runner, "plan", NETWORKS / "alexnet.yaml", CLUSTERS / "dgx-h100.yaml",
                  "-p", "8", "-b", "256", "-o", plan).exit_code == 0
    for key, value, with_ in (("mode", "model", "'grid' (the layout of every layer)"),
                              ("placement", "cols", "'grid' or 'pins'")):
        cfg = tmp_path / f"t-{key}.yaml"
        cfg.write_text(f"kind: training\nnetwork: {NETWORKS / 'alexnet.yaml'}\n"
                       f"cluster: {CLUSTERS / 'dgx-h100.yaml'}\ngpus: 8\nbatch: 256\n"
                       f"strategy: {{plan: p.yaml, {key}: {value}}}\n")
        r = invoke(runner, "check", cfg)
        assert r.exit_code == 2
        column = cfg.read_text().splitlines()[5].index(value) + 1
        assert r.stderr.startswith(f"{cfg}:6:{column}: error: '{key}' goes with {with_}; "
                                   f"a plan carries its own: drop '{key}'"), r.stderr
        assert "unknown key" not in r.stderr
    cluster = tmp_path / "c.yaml"
    cluster.write_text("kind: cluster\nname: x\nnodes: 1\ndevices_per_node: 8\n"
                       "device: H100-SXM\nnetwork: [1, 2]\n")
    r = invoke(runner, "validate", cluster)
    assert r.exit_code == 2
    assert r.stderr.count("error:") == 1 and "missing required key" not in r.stderr
    assert f"{cluster}:6:10: error: expected the network as a mapping of keys, got a " \
        "list" in r.stderr


def test_the_caret_sits_under_the_column_even_on_a_long_line():
    """Found by an audit of the tests: nothing checked the snippet and caret under a
    located error (moving the caret a column, or the long line's window, passed every
    test). A line over 160 characters shows 160 of them from 80 before the column,
    the caret at 79; a tab is one column, as YAML's marks count it."""
    from planner.errors import Located

    short = Located("f.yaml", 3, 4, "bad", "$.a", "a: bad\n").render().splitlines()
    assert short == ["f.yaml:3:4: error: bad (at $.a)", "    a: bad", "    " + "   ^"]
    long_line = "".join(chr(ord("a") + i % 26) for i in range(300))
    rendered = Located("f.yaml", 1, 200, "bad", "$", long_line).render().splitlines()
    assert rendered[1] == "    " + long_line[120:280]
    assert rendered[2] == "    " + " " * 79 + "^"
    assert rendered[1][4 + 79] == long_line[199]  # the character at column 200
    tabbed = Located("f.yaml", 1, 3, "bad", "$", "\tx: y").render().splitlines()
    assert tabbed[1:] == ["     x: y", "      ^"]
