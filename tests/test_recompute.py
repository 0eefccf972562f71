"""Activation recomputation (``--recompute blocks``; Chen, Xu, Zhang & Guestrin,
"Training deep nets with sublinear memory cost", 2016): every residual block keeps only
its input between the passes and runs its forward again, compute and collectives, just
before its backward; the activations it rebuilds are live one block at a time."""

from __future__ import annotations

import json

import pytest

from planner.errors import NoFeasiblePlan
from planner.evaluate import Options, evaluate, make_context
from planner.inputs import load_network_text
from planner.layout import make_layout
from planner.search import Space, Weights, search, solve

from .conftest import CLUSTERS, EXAMPLES, NETWORKS, invoke
from .helpers import FixedEstimator, cluster
from .test_search import _transformer_text

BLOCKS = """kind: network
name: blocks
input: [64]
dtype: float32
layers:
  - {name: fc0, type: linear, out_features: 64}
""" + "".join(f"""  - type: residual
    name: {b}
    body:
      - {{name: fc1, type: linear, out_features: 256}}
      - {{name: relu, type: relu}}
      - {{name: fc2, type: linear, out_features: 64}}
""" for b in ("b1", "b2")) + """  - {name: head, type: linear, out_features: 10}
"""

def _evaluate(recompute, layouts=None, zero=0, p=2, b=4, text=BLOCKS, microbatches=1):
    net = load_network_text(text)
    opts = Options(gpus=p, batch=b, overlap="none", optimizer="adam", zero=zero,
                   recompute=recompute, microbatches=microbatches)
    ctx = make_context(net, cluster(per_node=8, algorithm="ring"), opts, FixedEstimator(1e-5))
    layouts = layouts or {}
    assignment = {x.index: layouts.get(x.name, make_layout("data", 1, p))
                  for x in net.layers if x.has_weights}
    return evaluate(ctx, opts, assignment)


def test_memory_by_hand():
    """Data parallel on 2 devices, batch 4: 2 samples a device, 4 bytes an element, so a
    tensor of n elements a sample keeps 8n bytes. Kept without recomputation: the input
    (64), fc0's output (64, block 1's input), each block's ReLU output (256, fc2's input
    too), block 1's output (64, block 2's input), block 2's output (64, the head's input)
    and the logits (10, for the loss): 8 · (64 + 64 + 256 + 64 + 256 + 64 + 10) = 6,224.

    Recomputing both blocks, 8 · (64 + 64 + 64 + 64 + 10) = 2,128 stay kept; each block
    rebuilds 8 · 256 = 2,048 in the backward pass. By the time block 2 is rebuilt the
    logits and the head's input are freed: 2,128 − 8 · 74 + 2,048 = 3,584; by block 1's,
    block 2's input too: 3,584 − 512 − 0 = 3,072. The peak is 3,584 (the sum of what
    stays and the largest working set, 4,176, overstated it).

    Recomputing only block 1 (``--recompute 1``): 8 · (64 + 64 + 64 + 256 + 64 + 10) =
    4,176 stay kept; by block 1's rebuild everything after it is freed (8 · 394), so
    4,176 − 3,152 + 2,048 = 3,072 then, and the peak is 4,176."""
    plain, rec, first = _evaluate("none"), _evaluate("blocks"), _evaluate("1")
    assert plain.memory.activations == 6224
    assert rec.memory.activations == 3584
    assert first.memory.activations == 4176
    assert rec.memory.rebuilt == first.memory.rebuilt * 2 == (2048, 2048)
    assert rec.memory.to_data()["recompute"] == {"kept_bytes": 2128,
                                                 "largest_rebuild_bytes": 2048, "blocks": 2}
    assert "recompute" not in plain.memory.to_data()
    by = {r.layer.name: r.activation_bytes for r in rec.layers}
    assert by["b1.relu"] == by["b2.relu"] == 0  # rebuilt, not kept
    assert by["fc0"] == by["b1.add"] == by["b2.add"] == 512  # the blocks' inputs, the head's
    by = {r.layer.name: r.activation_bytes for r in first.layers}
    assert by["b1.relu"] == 0 and by["b2.relu"] == 2048
    # a network that opens with a block keeps its input as it is: without fc0,
    # 8 · (64 + 256 + 64 + 256 + 64 + 10) = 5,712; recomputing, 8 · (64 + 64 + 64 + 10)
    # = 1,616 stay, and block 2's rebuild peaks at 1,616 − 592 + 2,048 = 3,072
    text = BLOCKS.replace("  - {name: fc0, type: linear, out_features: 64}\n", "")
    assert _evaluate("none", text=text).memory.activations == 5712
    assert _evaluate("blocks", text=text).memory.activations == 3072


def _layered(text: str) -> str:
    """``text`` with its residual blocks in one copy of a repeat group (a layer)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("  - type: residual") and not inside:
            out += ["  - repeat: 1", "    name: layer", "    layers:"]
            inside = True
        if inside and line.startswith("  - {name: head"):
            inside = False
        out.append("    " + line if inside else line)
    return "\n".join(out) + "\n"


def test_layer_unit_by_hand():
    """``--recompute-unit layers``: the two blocks of one copy of a repeat group (a
    transformer layer) are rebuilt as one from one kept input, as Megatron-LM's full
    recomputation and a checkpoint wrapper around each transformer block keep. The
    network of :func:`test_memory_by_hand` with both blocks in one copy: block 1's output
    is no longer kept (block 2's input, rebuilt), so 8 · (64 + 64 + 64 + 10) = 1,616
    stay kept (the input, fc0's output, block 2's output and the logits); the unit's
    working set is both ReLU outputs and block 1's output, 8 · (256 + 64 + 256) =
    4,608. When the backward pass reaches it the logits and the head's input are freed:
    1,616 − 592 + 4,608 = 5,632, the peak (larger than block by block here, where the
    saved checkpoint is small beside a second working set: with many layers it is the
    other way round). The time is the same: the same layers' forward runs again."""
    text = _layered(BLOCKS)
    net = load_network_text(text)
    assert [b.name for b in net.blocks] == ["layer.0.b1", "layer.0.b2"]
    assert [u.name for u in net.recompute_units] == ["layer.0.b1", "layer.0.b2"]
    net = net.by_layers("recompute_unit")
    assert [u.name for u in net.recompute_units] == ["layer.0"]
    assert net.unit_of == {"layer.0.b1": "layer.0", "layer.0.b2": "layer.0"}
    opts = Options(gpus=2, batch=4, overlap="none", optimizer="adam", recompute="blocks")
    ctx = make_context(net, cluster(per_node=8, algorithm="ring"), opts, FixedEstimator(1e-5))
    ev = evaluate(ctx, opts, {x.index: make_layout("data", 1, 2)
                              for x in net.layers if x.has_weights})
    assert ev.memory.to_data()["recompute"] == {"kept_bytes": 1616,
                                                "largest_rebuild_bytes": 4608, "blocks": 1}
    assert ev.memory.activations == 5632
    by = {r.layer.name: r.activation_bytes for r in ev.layers}
    assert by["layer.0.b1.add"] == by["layer.0.b1.relu"] == 0 and by["fc0"] == 512
    blocks = _evaluate("blocks", text=text)
    assert ev.recompute_s == blocks.recompute_s and ev.time_s == blocks.time_s
    # a network whose copies hold one block each recomputes as by blocks
    one = load_network_text(_transformer_like_resnet())
    assert [u.name for u in one.by_layers("recompute_unit").recompute_units] == \
        [b.name for b in one.blocks]
    # without a repeat group there is no layer to recompute
    assert load_network_text(BLOCKS).by_layers("recompute_unit") is None
    # a transformer layer outside the repeat groups (DeepSeek-MoE's dense first layer) is
    # one unit too: 28 layers, as Megatron-LM's --num-layers counts them (found by an
    # audit: its two blocks were two units, and --recompute 2 one layer, not two)
    from planner.inputs import load_network

    deepseek = load_network(NETWORKS / "deepseek-moe-16b.yaml")
    units = deepseek.by_layers("recompute_unit").recompute_units
    assert len(deepseek.blocks) == 56 and len(units) == 28
    assert [u.name for u in units[:2]] == ["dense", "moe_layers.0"]


def _transformer_like_resnet() -> str:
    """A repeat group of single residual blocks (a ResNet stage's bottlenecks)."""
    return """kind: network
name: stage
input: [64]
layers:
  - repeat: 3
    name: s
    layers:
      - {type: residual, name: b, body: [{type: linear, out_features: 64}, {type: relu}]}
  - {name: head, type: linear, out_features: 10}
"""


def test_time_by_hand():
    """Every kernel takes 10 µs. Each block's four layers (fc1, relu, fc2, add) run their
    forward again in the backward pass: 2 blocks × 4 kernels = 80 µs more backward, the
    forward unchanged."""
    plain, rec = _evaluate("none"), _evaluate("blocks")
    assert rec.recompute_s == pytest.approx(8e-5, rel=1e-12)
    assert plain.recompute_s == 0
    assert rec.forward_s == plain.forward_s
    assert rec.backward_s == pytest.approx(plain.backward_s + 8e-5, rel=1e-12)
    assert rec.time_s == pytest.approx(plain.time_s + 8e-5, rel=1e-12)
    # 3 microbatches re-run them 3 times a step (recompute_s read one microbatch's)
    rec3, plain3 = _evaluate("blocks", microbatches=3), _evaluate("none", microbatches=3)
    assert rec3.recompute_s == pytest.approx(3 * 8e-5, rel=1e-12)
    assert rec3.time_s == pytest.approx(plain3.time_s + 3 * 8e-5, rel=1e-12)


def test_forward_collectives_run_again():
    """fc1 of block 1 model-parallel on 2x1 (it all-gathers its input's batch from the
    data-parallel fc0 and its output features): recomputed, both all-gathers run again
    in the backward, the same bytes and seconds; the input gradient's move, the weight
    gradient and ZeRO stage 3's parameter gathers are not repeated (the backward's own
    gather serves the re-run)."""
    lay = {"b1.fc1": make_layout("model", 2, 1), "b2.fc1": make_layout("data", 1, 2)}
    for zero in (0, 3):
        plain = {r.layer.name: r for r in _evaluate("none", lay, zero).layers}
        rec = {r.layer.name: r for r in _evaluate("blocks", lay, zero).layers}
        for name in ("b1.fc1", "b2.fc1", "head"):
            before, after = plain[name].cost.terms, rec[name].cost.terms
            forward = [t for t in before if t.when == "forward" and t.phase != "parameters"]
            again = [t for t in after if t.phase == "recompute"]
            assert [t for t in after if t.phase != "recompute"] == before
            assert [(t.collective, t.group, t.bytes, t.seconds) for t in again] == \
                ([(t.collective, t.group, t.bytes, t.seconds) for t in forward]
                 if name != "head" else [])
            assert all(t.when == "backward" for t in again)
        assert [t.note for t in rec["b1.fc1"].cost.terms if t.phase == "recompute"] == \
            ["input (recompute)", "(recompute)"]
    ev = _evaluate("blocks", lay)
    again = sum(t.seconds for r in ev.layers for t in r.cost.terms if t.phase == "recompute")
    assert ev.recompute_s == pytest.approx(
        sum(r.cost.forward_s for r in ev.layers if r.layer.block) + again, rel=1e-12)


@pytest.mark.parametrize("zero", [0, 3])
@pytest.mark.parametrize(("p", "batch"), [(4, 32), (16, 128)])
def test_dynamic_program_equals_the_evaluation(zero, p, batch):
    """The dynamic program prices the re-run forward as the evaluation does (transformer
    blocks, learned kernel models, no overlap), alone and with ZeRO stage 3."""
    net = load_network_text(_transformer_text(2))
    cl = cluster(per_node=8, intra=(1e-6, 1e11), inter=(5e-6, 1e10))
    opts = Options(gpus=p, batch=batch, overlap="none", optimizer="adam", zero=zero,
                   recompute="blocks")
    ctx = make_context(net, cl, opts)
    space = Space(ctx, opts, {})
    space.prepare_transitions()
    value, assignment = solve(space, Weights())
    ev = evaluate(ctx, opts, assignment)
    assert value == pytest.approx(ev.time_s, rel=1e-12)
    assert ev.recompute_s > 0


def test_recomputation_lets_gpt2_fit():
    """GPT-2 small at batch 768 on 8 H100s in fp32 with Adam: nothing fits keeping every
    activation (with sequence parallelism, batch 512 does); recomputing each block, a
    plan does."""
    from planner.cli_plan import make_estimator
    from planner.inputs import load_cluster, load_network

    net = load_network(NETWORKS / "gpt2-small.yaml")
    cl = load_cluster(CLUSTERS / "dgx-h100.yaml")
    got = {}
    for rc in ("none", "blocks"):
        opts = Options(gpus=8, batch=768, optimizer="adam", recompute=rc)
        ctx = make_context(net, cl, opts, make_estimator("auto", None, cl.device))
        try:
            got[rc] = search(ctx, opts).best.evaluation
        except NoFeasiblePlan:
            got[rc] = None
    assert got["none"] is None
    assert got["blocks"] is not None and got["blocks"].memory.fits


def test_command_line_plan_and_configuration(runner, tmp_path):
    net, cl = str(NETWORKS / "gpt2-small.yaml"), str(CLUSTERS / "dgx-h100.yaml")
    base = [net, cl, "-p", "8", "-b", "64", "--optimizer", "adam", "--format", "json"]
    plain = json.loads(invoke(runner, "cost", *base).stdout)
    res = invoke(runner, "cost", *base, "--recompute", "blocks")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (plain["problem"]["recompute"], doc["problem"]["recompute"]) == ("none", "blocks")
    assert plain["iteration"]["recompute_s"] == 0 < doc["iteration"]["recompute_s"]
    assert doc["memory"]["breakdown"]["activations"] < \
        plain["memory"]["breakdown"]["activations"] / 3
    assert doc["iteration"]["forward_s"] == plain["iteration"]["forward_s"]
    assert "recomputing blocks" in invoke(runner, "cost", *base[:-2], "--recompute",
                                          "blocks").output
    # a count names the same choice as the word: 0 is none, all 24 blocks is blocks
    for count, name in (("0", "none"), ("24", "blocks"), ("03", "3")):
        out = invoke(runner, "cost", *base, "--recompute", count).output
        assert json.loads(out)["problem"]["recompute"] == name
    for bad, message in ((["--recompute", "some"], "'some': use none, blocks, a number of "
                                                   "residual blocks (the first ones) or auto"),
                         (["--recompute", "25"], "cannot recompute 25 residual blocks: the "
                                                 "network has 24"),
                         (["--recompute", "blocks", "--cost-model", "gholami2018"],
                          "--recompute needs --cost-model exact"),
                         (["--recompute", "auto", "--cost-model", "gholami2018"],
                          "--recompute needs --cost-model exact")):
        out = invoke(runner, "plan", *base, *bad)
        assert out.exit_code == 2 and message in out.output and "Traceback" not in out.output
    # a plan made before recomputation was modelled reads as "none"
    plan = tmp_path / "plan.json"
    assert invoke(runner, "plan", *base, "-o", str(plan)).exit_code == 0
    old = json.loads(plan.read_text())
    del old["problem"]["recompute"]
    plan.write_text(json.dumps(old))
    for extra, stale in (("", False), ("recompute: 0\n", False), ("recompute: '0'\n", False),
                         ("recompute: blocks\n", True)):
        path = tmp_path / "train.yaml"
        path.write_text(f"kind: training\nnetwork: {net}\ncluster: {cl}\ngpus: 8\nbatch: 64\n"
                        f"optimizer: adam\nstrategy:\n  plan: {plan}\n{extra}")
        out = invoke(runner, "check", str(path), "--format", "json").output
        assert ("the plan is for recompute=none, the configuration says blocks" in out) \
            == stale, out
    path.write_text(f"kind: training\nnetwork: {net}\ncluster: {cl}\ngpus: 8\nbatch: 64\n"
                    "strategy:\n  grid: 1x8\nrecompute: all\n")
    out = invoke(runner, "check", str(path))
    assert out.exit_code == 2 and "train.yaml:8:12" in out.output, out.output
    assert "expected none, blocks, a number of blocks or auto, got 'all'" in out.output
    path.write_text(f"kind: training\nnetwork: {net}\ncluster: {cl}\ngpus: 8\nbatch: 64\n"
                    "strategy:\n  grid: 1x8\nrecompute: 30\n")
    out = invoke(runner, "check", str(path))
    assert out.exit_code == 2 and "train.yaml:8:12" in out.output, out.output
    assert "the network has 24 residual blocks" in out.output


def test_layer_unit_on_the_command_line(runner, tmp_path):
    """GPT-2 small (12 layers, 24 blocks) on 8 H100s at batch 64: recomputing by layers
    keeps 12 checkpoints fewer, each a layer's middle (8 sequences a device × 1,024 × 768
    × 4 bytes: 301,989,888 bytes in all) and takes the same time; the plan says so. A
    count is of layers (12 at most; 12 reads as all), a network without a repeat group
    has none (exit 2), and a configuration that asks for another unit than its plan's
    finds the plan stale."""
    net, cl = str(NETWORKS / "gpt2-small.yaml"), str(CLUSTERS / "dgx-h100.yaml")
    base = ["cost", net, cl, "-p", "8", "-b", "64", "--optimizer", "adam", "--format", "json"]
    blocks = json.loads(invoke(runner, *base, "--recompute", "blocks").stdout)
    layers = json.loads(invoke(runner, *base, "--recompute", "blocks", "--recompute-unit",
                               "layers").stdout)
    assert "recompute_unit" not in blocks["problem"]
    assert layers["problem"]["recompute_unit"] == "layers"
    assert (blocks["memory"]["recompute"]["blocks"], layers["memory"]["recompute"]["blocks"]) \
        == (24, 12)
    assert blocks["memory"]["recompute"]["kept_bytes"] - \
        layers["memory"]["recompute"]["kept_bytes"] == 12 * 8 * 1024 * 768 * 4
    assert layers["iteration"]["time_s"] == blocks["iteration"]["time_s"]
    twelve = json.loads(invoke(runner, *base, "--recompute", "12", "--recompute-unit",
                               "layers").stdout)
    assert twelve["problem"]["recompute"] == "blocks"
    out = invoke(runner, *base, "--recompute", "13", "--recompute-unit", "layers")
    assert out.exit_code == 2 and "cannot recompute 13 layers: the network has 12 layers" \
        in out.stderr
    flat = tmp_path / "flat.yaml"
    flat.write_text(BLOCKS)
    out = invoke(runner, "cost", flat, cl, "-p", "2", "-b", "4", "--recompute", "blocks",
                 "--recompute-unit", "layers")
    assert out.exit_code == 2 and "has no repeat group; use --recompute-unit blocks" \
        in out.stderr and "Traceback" not in out.output
    plan = tmp_path / "plan.json"
    assert invoke(runner, "plan", *base[1:-2], "--recompute", "blocks", "-o",
                  str(plan)).exit_code == 0
    train = tmp_path / "train.yaml"
    for unit, stale in (("blocks", False), ("layers", True)):
        train.write_text(f"kind: training\nnetwork: {net}\ncluster: {cl}\ngpus: 8\n"
                         f"batch: 64\noptimizer: adam\nrecompute: blocks\n"
                         f"recompute_unit: {unit}\nstrategy:\n  plan: {plan}\n")
        out = invoke(runner, "check", train, "--format", "json").output
        assert ("the plan is for recompute_unit=blocks, the configuration says layers"
                in out) == stale, out
    # with nothing recomputed the unit is no question (found by an audit: a plan made
    # with --recompute-unit layers alone was stale for a configuration that says none)
    bare = tmp_path / "bare.json"
    assert invoke(runner, "plan", *base[1:-2], "--recompute-unit", "layers", "-o",
                  str(bare)).exit_code == 0
    assert "recompute_unit" not in json.loads(bare.read_text())["problem"]
    train.write_text(f"kind: training\nnetwork: {net}\ncluster: {cl}\ngpus: 8\nbatch: 64\n"
                     f"optimizer: adam\nstrategy:\n  plan: {bare}\n")
    out = invoke(runner, "check", train)
    assert out.exit_code == 0, out.output
    # the table and the search's note count layers
    auto = invoke(runner, "plan", net, cl, "-p", "8", "-b", "512", "--optimizer", "adam",
                  "--recompute", "auto", "--recompute-unit", "layers")
    assert "recomputing 7 layers" in auto.stdout and "7 layers: " in auto.stdout
    doc = json.loads(invoke(runner, "plan", net, cl, "-p", "8", "-b", "512", "--optimizer",
                            "adam", "--recompute", "auto", "--recompute-unit", "layers",
                            "--format", "json").stdout)
    assert "--recompute auto chose 7 of 12 layers" in doc["search"]["notes"]
    train.write_text(f"kind: training\nnetwork: {flat}\ncluster: {cl}\ngpus: 2\nbatch: 4\n"
                     "recompute: blocks\nrecompute_unit: layers\nstrategy:\n  grid: 1x2\n")
    out = invoke(runner, "check", train)
    assert out.exit_code == 2 and "train.yaml:7:17" in out.output, out.output


def test_recompute_auto_takes_the_fewest_blocks_that_fit(runner):
    """GPT-2 small (24 blocks) at batch 768 on 8 H100s, fp32 Adam: nothing fits without
    recomputation (at 384, sequence parallelism makes it fit). The bisection brackets
    the least count whose optimum fits (the count below it does not: no plan, or one
    that fits only trading time for memory); every plan it found is listed and the
    fastest is chosen, which may be a traded one at fewer blocks; the largest count with
    no plan fails alone. Searched one by one, the counts agree; cost prices one layout
    the same way (by bisection on the evaluation), and sweep adds a column."""
    base = [NETWORKS / "gpt2-small.yaml", CLUSTERS / "dgx-h100.yaml", "-p", "8", "-b", "768",
            "--optimizer", "adam", "--format", "json"]
    res = invoke(runner, "plan", *base, "--recompute", "auto")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    k = int(doc["problem"]["recompute"])
    assert 0 < k < 24
    trials = {t["blocks"]: t for t in doc["recompute_auto"]}
    assert trials[0]["outcome"] == "no plan" and trials[24]["outcome"] == "plan"
    least = min(n for n, t in trials.items() if t["outcome"] == "plan")
    assert trials[least - 1]["outcome"] != "plan" and k <= least
    times = [t["time_s"] for t in trials.values() if t["time_s"] is not None]
    assert doc["iteration"]["time_s"] == trials[k]["time_s"] == min(times)
    none = max(n for n, t in trials.items() if t["outcome"] == "no plan")
    short = invoke(runner, "plan", *base, "--recompute", str(none))
    assert short.exit_code == 1
    assert "recomputing residual blocks (--recompute auto: as few of the 24 as memory " \
        "needs)" in short.stderr
    fixed = json.loads(invoke(runner, "plan", *base, "--recompute", str(k)).stdout)
    assert fixed["iteration"]["time_s"] == doc["iteration"]["time_s"]
    assert fixed["problem"]["recompute"] == str(k)
    table = invoke(runner, "plan", *base[:-2], "--recompute", "auto").output
    assert f"recomputing {k} blocks" in table and f"{none} blocks: no plan" in table
    # cost: data parallel, the least count that fits
    res = invoke(runner, "cost", *base, "--recompute", "auto")
    assert res.exit_code == 0, res.output
    count = int(json.loads(res.stdout)["problem"]["recompute"])
    assert 0 < count < 24
    assert invoke(runner, "cost", *base, "--recompute", str(count)).exit_code == 0
    assert invoke(runner, "cost", *base, "--recompute", str(count - 1)).exit_code == 1
    rows = json.loads(invoke(runner, "sweep", *base[:2], "-p", "8", "-b", "64,768",
                             "--optimizer", "adam", "--recompute", "auto",
                             "--format", "json").stdout)["results"]
    assert [r["recompute"] for r in rows] == ["none", str(k)]


def test_a_network_without_blocks_has_nothing_to_recompute(runner, tmp_path):
    """blocks or a count on a network without residual blocks is refused (it used to
    print "recomputing blocks (0 s a step)"); none, 0 and auto stay valid."""
    net, cl = tmp_path / "mlp.yaml", str(CLUSTERS / "dgx-h100.yaml")
    net.write_text("kind: network\nname: mlp\ninput: [64]\nlayers:\n"
                   "  - {type: linear, out_features: 64}\n  - {type: linear, out_features: 8}\n")
    for value in ("blocks", "2"):
        res = invoke(runner, "cost", str(net), cl, "-p", "2", "-b", "8", "--recompute", value)
        assert res.exit_code == 2, res.output
        assert "the network has no residual blocks" in res.output
    for value in ("none", "0", "auto"):
        res = invoke(runner, "cost", str(net), cl, "-p", "2", "-b", "8", "--recompute", value)
        assert res.exit_code == 0, res.output
    config = tmp_path / "train.yaml"
    config.write_text(f"kind: training\nnetwork: {net}\ncluster: {cl}\ngpus: 2\nbatch: 8\n"
                      "recompute: blocks\nstrategy: {grid: 1x2}\n")
    res = invoke(runner, "check", str(config))
    assert res.exit_code == 2 and "train.yaml:6:12" in res.output, res.output


def test_unimodal_least_by_hand():
    """Ternary search over integers: the least of a cost that falls then rises, the
    lower count on a tie, each count asked at most once when memoised."""
    from planner.search import unimodal_least

    for best in range(0, 25):
        asked: list[int] = []

        def cost(n, best=best, asked=asked):
            asked.append(n)
            return abs(n - best) + 0.5 * (n > best)

        assert unimodal_least(0, 24, cost) == best
        assert len(set(asked)) <= 2 * 9  # about 2·log_1.5(24) = 15.7 points
    assert unimodal_least(0, 6, lambda n: 1.0) == 0  # flat: the lower
    assert unimodal_least(5, 5, lambda n: 1.0) == 5


def test_recompute_auto_searches_between_when_every_count_trades():
    """When no count's optimum fits (each trades time for memory), the fastest count may
    lie between none and all: a fake search whose step is 1 + (n − 3)²/100 s for n of 8
    blocks recomputed, always traded, is answered with 3 (before: 0 or 8, the two ends
    tried, 0 kept)."""
    from types import SimpleNamespace

    from planner.search import search_recompute

    net = load_network_text(_transformer_text(4))
    blocks = len(net.blocks)
    assert blocks == 8
    opts = Options(gpus=2, batch=4)
    ctx = make_context(net, cluster(per_node=2), opts, FixedEstimator(1e-5))
    searched: list[int] = []

    def inner(c, o, count, no_plan):
        n = {"none": 0, "blocks": blocks}.get(o.recompute)
        n = int(o.recompute) if n is None else n
        assert n == count and no_plan == {}
        searched.append(n)
        t = 1 + (n - 3) ** 2 / 100
        best = SimpleNamespace(score=lambda objective, t=t: t,
                               evaluation=SimpleNamespace(time_s=t,
                                                          memory=SimpleNamespace(peak=1.0)))
        return SimpleNamespace(best=best, constrained=True, objective="time", notes=[],
                               recompute_trials=[]), c, o

    res, _, o = search_recompute(ctx, opts, inner)
    assert o.recompute == "3" and res.best.score("time") == 1.0
    assert searched[:2] == [0, 8] and len(searched) == len(set(searched)) <= 8
    assert [t.blocks for t in res.recompute_trials] == sorted(searched)
    assert all(t.outcome == "traded" for t in res.recompute_trials)


def _check_json(runner, path):
    out = invoke(runner, "check", str(path), "--format", "json")
    return out.exit_code, {c["check"]: c for c in json.loads(out.stdout)["configs"][0]["checks"]}


def test_a_configuration_may_say_auto(runner, tmp_path):
    """``recompute: auto`` in a training configuration prices the strategy as ``cost
    --recompute auto`` does (the fewest blocks with which it fits) and the optimum as
    ``plan --recompute auto`` searches it. GPT-2 small on 8 H100s, fp32 Adam, batch 384
    (nothing fits without recomputation): a grid's time is cost's; a plan made with
    --recompute auto matches (it recorded its count, 9, and the trials), and its time is
    the optimum's. With two pipeline stages at batch 1536 in 4 microbatches each chunk
    chooses (11 and 4 blocks), the plan records auto, and a configuration saying auto
    matches it where any count would not."""
    net = EXAMPLES / "networks" / "gpt2-small.yaml"
    cl = EXAMPLES / "clusters" / "dgx-h100.yaml"
    base = [net, cl, "-p", "8", "-b", "384", "--optimizer", "adam", "--recompute", "auto",
            "--format", "json"]
    cost = json.loads(invoke(runner, "cost", *base, "--grid", "1x8").stdout)
    head = f"kind: training\nnetwork: {net}\ncluster: {cl}\ngpus: 8\noptimizer: adam\n"
    path = tmp_path / "train.yaml"
    path.write_text(head + "batch: 384\nrecompute: auto\nstrategy: {grid: 1x8}\n")
    code, found = _check_json(runner, path)
    assert code == 0 and found["memory"]["ok"], found
    assert found["speed"]["time_s"] == pytest.approx(cost["iteration"]["time_s"], rel=1e-3)
    plan = tmp_path / "plan.json"
    assert invoke(runner, "plan", *base, "-o", plan).exit_code == 0
    doc = json.loads(plan.read_text())
    assert doc["problem"]["recompute"] == "9"
    for setting, stale in (("auto", False), ("9", False), ("none", True)):
        path.write_text(head + f"batch: 384\nrecompute: {setting}\nstrategy: {{plan: {plan}}}\n")
        code, found = _check_json(runner, path)
        assert (found["plan"]["ok"] is False) == stale, found
        if setting == "auto":
            assert code == 0
            assert found["speed"]["time_s"] == pytest.approx(doc["iteration"]["time_s"],
                                                             rel=1e-3)
            assert found["speed"]["optimum_s"] == pytest.approx(doc["iteration"]["time_s"],
                                                                rel=1e-3)
    piped = tmp_path / "piped.json"
    assert invoke(runner, "plan", *base[:5], "1536", *base[6:], "--pipeline", "2",
                  "--microbatches", "4", "-o", piped).exit_code == 0
    pdoc = json.loads(piped.read_text())
    assert pdoc["problem"]["recompute"] == "auto"
    assert [st["recompute"] for st in pdoc["pipeline"]["stage_plans"]] == ["11", "4"]
    for setting, stale in (("auto", False), ("11", True)):
        path.write_text(head + f"batch: 1536\nmicrobatches: 4\npipeline: 2\n"
                        f"recompute: {setting}\nstrategy: {{plan: {piped}}}\n")
        code, found = _check_json(runner, path)
        assert (found["plan"]["ok"] is False) == stale, found
        if setting == "auto":
            assert code == 0, found
            assert found["speed"]["time_s"] == pytest.approx(pdoc["iteration"]["time_s"],
                                                             rel=1e-3)
            assert found["speed"]["optimum_s"] == pytest.approx(
                pdoc["iteration"]["time_s"], rel=1e-3)
