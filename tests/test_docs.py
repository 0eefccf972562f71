"""The README stays true: its commands exist, its test command is what CI runs, its sample
output is what the planner prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from planner.cli import cli

from .conftest import ROOT, invoke

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _current() -> str:
    """The README as it is on disk now (another golden may have rewritten it since this
    module read it)."""
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _block(marker: str) -> str:
    after = README.split(f"<!-- {marker} -->", 1)[1]
    m = re.search(r"```[a-z]*\n(.*?)```", after, re.S)
    assert m is not None
    return m.group(1)


def test_every_command_is_documented():
    for name, cmd in cli.commands.items():
        assert f"planner {name}" in README, name
        for sub in getattr(cmd, "commands", {}):
            assert sub in README, f"{name} {sub}"


def test_every_option_is_documented():
    """Each long option of every command appears in the README at least once (an audit
    found eleven that did not, `kernels predict --conv` among them)."""
    import click

    def leaves(cmd: click.Command, path: str):
        yield path, cmd  # a group's own options too (--version, --debug)
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from leaves(sub, f"{path} {name}".strip())

    missing = [(path, p.opts) for path, cmd in leaves(cli, "") for p in cmd.params
               if isinstance(p, click.Option)
               and not any(o in README for o in (*p.opts, *p.secondary_opts)
                           if o.startswith("--"))]
    assert not missing, missing


def test_output_option_commands_are_the_ones_named():
    """The README names the commands that take `-o FILE`: exactly those (it said "any
    command's output", which `check`, `validate` and `kernels predict` do not take: found
    by an audit)."""
    import click

    def leaves(cmd: click.Command, path: str):
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from leaves(sub, f"{path} {name}".strip())
        if not getattr(cmd, "commands", None):
            yield path, cmd

    with_o = {path for path, cmd in leaves(cli, "")
              if any("--output" in p.opts for p in cmd.params if isinstance(p, click.Option))}
    m = re.search(r"`-o FILE` \(`--output FILE`\) writes the output of (.*?) to a file",
                  README, re.S)
    assert m is not None
    named = set(re.findall(r"`([a-z ]+)`", m.group(1)))
    # and the two whose -o is required, and not standard output's stand-in
    rest = README[m.end():].split("require\nit", 1)[0]
    required = set(re.findall(r"`(kernels [a-z]+) -o", rest))
    assert required == {"kernels fit", "kernels profile"}
    assert named | required == with_o and not named & required
    for path, cmd in leaves(cli, ""):
        if path in required:
            assert next(p for p in cmd.params if "--output" in p.opts).required, path


def test_ci_runs_the_readme_test_command():
    script = (ROOT / ".ci" / "run").read_text()
    assert "quickstart:test" in script
    awk = re.search(r"cmd=\$\(awk '(.*?)' README.md\)", script).group(1)
    got = subprocess.run(["awk", awk, "README.md"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert got.strip() == _block("quickstart:test").strip()
    assert "pytest" in got


def test_quickstart_output_is_real(runner, monkeypatch, update_golden):
    cmd = _block("quickstart:run").strip().split("&& ", 1)[1].split()
    assert cmd[0] == "planner"
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "120")
    result = invoke(runner, *cmd[1:])
    assert result.exit_code == 0, result.stderr
    real = [line.rstrip() for line in result.stdout.splitlines()]
    while real and not real[-1]:
        real.pop()
    shown = [line.rstrip() for line in _block("quickstart:output").splitlines()]
    if update_golden and shown != real:
        old = "\n".join(shown)
        text = _current().replace(f"<!-- quickstart:output -->\n```\n{old}\n```",
                              "<!-- quickstart:output -->\n```\n" + "\n".join(real) + "\n```")
        (ROOT / "README.md").write_text(text, encoding="utf-8")
        shown = real
    assert shown == real


def _shell_samples() -> list[tuple[str, str]]:
    """Every ``sh`` block of the README that shows ``$ planner ...`` and its output."""
    found = []
    for m in re.finditer(r"```sh\n(\$ planner [^\n]*)\n(.*?)```", README, re.S):
        found.append((m.group(1), m.group(2)))
    return found


def test_shell_samples_are_real(update_golden):
    """A ``$ planner ...`` sample in the README prints what the planner prints today (run
    through the shell, so globs expand as they would for the reader)."""
    samples = _shell_samples()
    assert samples, "the README shows no command with its output"
    text = _current()
    for prompt, shown in samples:
        cmd = prompt[2:].replace("planner", f"{sys.executable} -m planner", 1)
        run = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, "COLUMNS": "120"})
        assert run.returncode in (0, 1, 2), (prompt, run.stderr)
        real = run.stdout
        if update_golden and shown != real:
            text = text.replace(f"{prompt}\n{shown}```", f"{prompt}\n{real}```")
            shown = real
        assert shown == real, prompt
    if text != _current():
        (ROOT / "README.md").write_text(text, encoding="utf-8")


def test_quickstart_prose_names_the_layouts_shown():
    """The paragraph under the Quickstart's output explains layouts that the output shows
    (it once explained `column 16x4` and `row 16x4` after the plan had become 4x16)."""
    shown = _block("quickstart:output")
    prose = _current().split("<!-- quickstart:output -->", 1)[1].split("```", 2)[2]
    prose = prose.split("\n## ", 1)[0]
    named = re.findall(r"`((?:data|model|domain|row|column)[a-z-]* \d+x\d+)`", prose)
    assert len(named) >= 4, named
    for layout in named:
        assert layout in shown, layout


def test_predict_bands_quoted_are_current(runner):
    """The three 4096³ GEMM bands *Error bands* quotes are what `kernels predict` prints."""
    text = " ".join(_current().split())
    for device, dtype in (("H100-PCIe", "float32"), ("H100-SXM", "float32"),
                          ("H100-SXM", "bf16")):
        r = invoke(runner, "kernels", "predict", "--device", device, "--gemm",
                   "4096,4096,4096", "--dtype", dtype)
        assert r.exit_code == 0, r.stderr
        band = re.search(r"([\d,.]+–[\d,.]+ [mµ]s \(\d+ rows[^)]*\))", r.stdout)
        assert band is not None and band.group(1) in text, (device, dtype, r.stdout)


def test_accuracy_table_matches_the_manifest():
    """The measured-accuracy rows the shipped manifest records exactly (it is checked
    against a fresh `kernels eval` in test_kernels) say in the README what it says: bmm
    on the five NeuSight GPUs and DeepBench's two backward passes on its eight."""
    import yaml

    manifest = yaml.safe_load((ROOT / "models" / "manifest.yaml").read_text())
    mape = {(r["op"], r["device"]): r["mape"] for r in manifest["accuracy"]["results"]}
    deepbench = ["GTX-1080-Ti", "M40", "P100-PCIe", "T4", "TITAN-X-Maxwell",
                 "TITAN-X-Pascal", "TITAN-Xp", "V100-SXM2"]
    rows = [("| bmm MAPE, held-out shapes: A100 / P100 / P4 / T4 / V100 |", "bmm",
             ["A100-PCIe-40GB", "P100-PCIe", "P4", "T4", "V100-PCIe"]),
            ("| DeepBench conv backward-data MAPE, held-out shapes, fp32, same order |",
             "conv_bwd_data", deepbench),
            ("| DeepBench conv backward-filter MAPE, held-out shapes, fp32, same order |",
             "conv_bwd_filter", deepbench)]
    for head, op, devices in rows:
        line = next(x for x in README.splitlines() if x.startswith(head))
        measured = line[len(head):].split("|")[1]  # after the target's cell
        quoted = re.findall(r"\d+\.\d", measured.split("%")[0])
        assert quoted == [f"{mape[op, d]:.1f}" for d in devices], (op, quoted)


def test_shipped_model_size_is_current():
    """The README's size of the shipped model files is `du -cb` of them today, to 0.1 kB."""
    files = [*(ROOT / "models").glob("*.npz"), ROOT / "models" / "manifest.yaml"]
    size = sum(f.stat().st_size for f in files) / 1000
    assert f"| **{size:.1f} kB** | `du -cb models/*.npz models/manifest.yaml` |" in README


def test_readme_training_configuration_is_valid(runner, tmp_path):
    """The README's training configuration (every key it documents) loads and passes
    `check` where its relative paths point: in examples/ci/ (a copy), beside the committed
    plan."""
    import shutil

    from .conftest import EXAMPLES

    text = README.split("### Training configuration (for `planner check`)", 1)[1]
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    cfg = tmp_path / "examples" / "ci" / "readme.yaml"
    cfg.write_text(block, encoding="utf-8")
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.count(": ok: [") == 4  # plan, memory, efficiency, speed
    assert ": ok: [efficiency]" in result.stdout


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_contents_links_reach_headings():
    """Every in-page link (`](#anchor)`) names a heading of the README, and the contents
    line names every top-level section."""
    text = _current()
    headings = re.findall(r"^#{2,4} (.+)$", text, re.M)
    anchors = {_slug(h) for h in headings}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links and not sorted(set(links) - anchors)
    top = {_slug(h) for h in re.findall(r"^## (.+)$", text, re.M)}
    assert top <= set(links)
