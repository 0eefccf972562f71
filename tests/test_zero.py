"""ZeRO (Rajbhandari et al., "ZeRO: memory optimizations toward training trillion
parameter models", SC'20): the ``R`` devices that hold the same parameters (a layer's
data-parallel replicas) each keep the optimizer state of ``1/R`` of them (stage 1), and
of the gradients (stage 2) and the weights (stage 3). The gradient is reduce-scattered
instead of all-reduced; stages 1-2 all-gather the updated parameters after the step,
stage 3 gathers them before each layer's forward and backward (§7.2: stages 1-2 move
what an all-reduce moves, stage 3 1.5 times that)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from planner.costs.layer import follower_terms, shards, weighted_terms
from planner.costs.memory import param_bytes, sharded
from planner.errors import NoFeasiblePlan
from planner.evaluate import Options, evaluate, make_context
from planner.inputs import load_network_text
from planner.layout import make_layout
from planner.search import search

from .conftest import CLUSTERS, NETWORKS, ROOT, invoke
from .helpers import FixedEstimator, cluster, mlp, program_and_evaluation
from .test_search import _transformer_text

E = 4  # fp32
ALPHA, BW = 2e-6, 100e9  # helpers.cluster's intra-node tier


def _ctx(net, p, zero, b=16, overlap="none", optimizer="adam", cl=None, **kw):
    opts = Options(gpus=p, batch=b, overlap=overlap, optimizer=optimizer, zero=zero, **kw)
    cl = cl or cluster(per_node=8, algorithm="ring")
    return make_context(net, cl, opts, FixedEstimator(1e-5)), opts


def _ring(p, nbytes, halves=1):
    """A ring all-gather or reduce-scatter inside a node, by hand (Thakur et al. 2005):
    (p − 1)α + (p − 1)/p · n/B; an all-reduce is two of them."""
    return halves * ((p - 1) * ALPHA + (p - 1) / p * nbytes / BW)


def test_terms_by_hand():
    """fc1 (64 → 128, 8,320 parameters) data parallel on 8 GPUs of one node."""
    net = mlp([64, 128, 32])
    fc1 = net.by_name("fc1")
    n = 8320 * E
    lay = make_layout("data", 1, 8)
    got = {}
    for zero in (0, 1, 2, 3):
        ctx, _ = _ctx(net, 8, zero)
        got[zero] = [(t.phase, t.collective, t.when, t.group.size, t.bytes, t.seconds)
                     for t in weighted_terms(fc1, lay, ctx)]
    assert got[0] == [("weight_grad", "all_reduce", "gradient", 8, n,
                       pytest.approx(_ring(8, n, 2), rel=1e-12))]
    stage12 = [("weight_grad", "reduce_scatter", "gradient", 8, n,
                pytest.approx(_ring(8, n), rel=1e-12)),
               ("parameters", "all_gather", "update", 8, n,
                pytest.approx(_ring(8, n), rel=1e-12))]
    assert got[1] == stage12 and got[2] == stage12
    gather = pytest.approx(_ring(8, n), rel=1e-12)
    assert got[3] == [("parameters", "all_gather", "forward", 8, n, gather),
                      ("parameters", "all_gather", "backward", 8, n, gather),
                      ("weight_grad", "reduce_scatter", "gradient", 8, n, gather)]


def test_replicas_are_the_devices_that_reduce_the_same_gradient():
    """Model 2x4: a shard is held by the 4 devices of its column group; data 1x8: by all
    8; a layer norm after a 2x4 layout: by the 4 batch blocks (its features are whole)."""
    net = mlp([64, 128, 32], extra="  - {name: ln, type: layernorm}\n")
    ctx, _ = _ctx(net, 8, 1)
    fc1 = net.by_name("fc1")
    assert shards(weighted_terms(fc1, make_layout("model", 2, 4), ctx)) == 4
    assert shards(weighted_terms(fc1, make_layout("data", 1, 8), ctx)) == 8
    assert shards(weighted_terms(fc1, make_layout("model", 8, 1), ctx)) == 1
    dist = make_layout("model", 2, 4).output_dist()
    terms, _, _ = follower_terms(net.by_name("ln"), dist, ctx)
    assert shards(terms) == 4


def test_sharded_bytes_per_parameter():
    """fp32 Adam: 4 + 4 + 8 bytes; bf16 Adam with fp32 master weights: 2 + 2 + 12
    (ZeRO §3.1: K = 12). Stage s divides the first s columns, from the right, by R."""
    pb = param_bytes("adam", 4)
    assert (pb.weights, pb.gradients, pb.optimizer) == (4, 4, 8)
    s = [sharded(pb, z, 4) for z in range(4)]
    assert [(x.weights, x.gradients, x.optimizer) for x in s] == [
        (4, 4, 8), (4, 4, 2), (4, 1, 2), (1, 1, 2)]
    half = param_bytes("adam", 2)
    # ZeRO's Figure 1 example: Ψ = 7.5 B parameters, N_d = 64, K = 12: 120 GB without,
    # 31.4 GB at stage 1 (P_os), 16.6 GB at stage 2, 1.9 GB at stage 3
    psi = 7.5e9
    per = [psi * sharded(half, z, 64).total / 1e9 for z in range(4)]
    assert per == pytest.approx([120.0, 31.40625, 16.640625, 1.875], rel=1e-12)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_memory_report_by_hand(zero):
    """Two linears on a 2x4 model grid and a layer norm (its 2·32 parameters held by the
    4 batch blocks): each device keeps 1/2 of each linear's parameters, and ZeRO divides
    the sharded columns by R = 4."""
    net = mlp([64, 128, 32], extra="  - {name: ln, type: layernorm}\n")
    ctx, opts = _ctx(net, 8, zero)
    lay = make_layout("model", 2, 4)
    assignment = {net.by_name(n).index: lay for n in ("fc1", "fc2")}
    mem = evaluate(ctx, opts, assignment).memory
    local = (64 * 128 + 128) / 2 + (128 * 32 + 32) / 2 + 2 * 32
    r = 4
    assert mem.weights == pytest.approx(local * 4 / (r if zero >= 3 else 1), rel=1e-12)
    assert mem.gradients == pytest.approx(local * 4 / (r if zero >= 2 else 1), rel=1e-12)
    assert mem.optimizer == pytest.approx(local * 8 / r, rel=1e-12)


def test_stages_one_and_two_move_what_an_all_reduce_moves():
    """With ring collectives and no overlap, a reduce-scatter plus an all-gather takes
    exactly the ring all-reduce's time (ZeRO §7.2.1), so stages 1-2 change the iteration
    only by the optimizer step (the same single kernel time here); stage 3 adds one
    all-gather per layer (1.5 times the volume, §7.2.2)."""
    net = mlp([64, 128, 256, 32])
    lay = make_layout("data", 1, 8)
    times = {}
    for zero in range(4):
        ctx, opts = _ctx(net, 8, zero)
        assignment = {lay_.index: lay for lay_ in net.layers if lay_.has_weights}
        times[zero] = evaluate(ctx, opts, assignment)
    gathers = sum(_ring(8, n * E) for n in (64 * 128 + 128, 128 * 256 + 256, 256 * 32 + 32))
    assert times[1].time_s == pytest.approx(times[0].time_s, rel=1e-12)
    assert times[2].time_s == pytest.approx(times[0].time_s, rel=1e-12)
    assert times[1].parameters_s == pytest.approx(gathers, rel=1e-12)
    assert times[1].weight_grad_s == pytest.approx(gathers, rel=1e-12)
    assert times[3].time_s == pytest.approx(times[0].time_s + gathers, rel=1e-12)
    assert times[3].parameters_s == pytest.approx(2 * gathers, rel=1e-12)
    assert times[1].activation_comm_s == pytest.approx(times[0].activation_comm_s, abs=1e-15)


def test_update_gathers_are_bucketed_like_the_gradients():
    """Under --overlap gradients all three layers' gradients fill one 25 MiB bucket over
    the same 8 devices, and so do their updated parameters after the step: one
    all-gather of their sum (not three, each paying the latency)."""
    net = mlp([64, 128, 256, 32])
    ctx, opts = _ctx(net, 8, 1, overlap="gradients")
    lay = make_layout("data", 1, 8)
    ev = evaluate(ctx, opts, {x.index: lay for x in net.layers if x.has_weights})
    total = (64 * 128 + 128 + 128 * 256 + 256 + 256 * 32 + 32) * E
    assert ev.parameters_s == pytest.approx(_ring(8, total), rel=1e-12)
    assert ev.weight_grad_s == pytest.approx(_ring(8, total), rel=1e-12)
    assert len(ev.buckets) == 1
    notes = [t.note for r in ev.layers for t in r.cost.terms if t.phase == "parameters"]
    assert notes == ["gather (update) bucketed"] * 3


@pytest.mark.parametrize("zero", [1, 2, 3])
@pytest.mark.parametrize(("p", "batch"), [(4, 32), (16, 128)])
def test_dynamic_program_equals_the_evaluation(zero, p, batch):
    """The search's dynamic program prices ZeRO's terms, memory and sharded optimizer step
    as the evaluation does (transformer blocks, learned kernel models, no overlap)."""
    net = load_network_text(_transformer_text(2))
    cl = cluster(per_node=8, intra=(1e-6, 1e11), inter=(5e-6, 1e10))
    opts = Options(gpus=p, batch=batch, overlap="none", optimizer="adam", zero=zero)
    value, ev = program_and_evaluation(net, cl, opts)
    assert value == pytest.approx(ev.time_s, rel=1e-12)


def _wide(width=40960, layers=4):
    return mlp([width] * (layers + 1), relu=False)


def test_zero_lets_data_parallelism_fit():
    """Four 40,960-wide linears (6.7 G parameters, 107 GB of fp32 Adam state) on 8 H100s
    (80 GB each): data parallel does not fit without ZeRO; at stage 1 each device keeps
    weights and gradients (8 bytes a parameter) and 1/8 of the optimizer state."""
    net = _wide()
    params = 4 * (40960 * 40960 + 40960)
    lay = make_layout("data", 1, 8)
    assignment = {x.index: lay for x in net.layers if x.has_weights}
    mem = {}
    for zero in (0, 1):
        ctx, opts = _ctx(net, 8, zero, b=8)
        mem[zero] = evaluate(ctx, opts, assignment).memory
    assert not mem[0].fits and mem[1].fits
    assert mem[1].optimizer == pytest.approx(params * 8 / 8, rel=1e-12)
    assert mem[1].weights + mem[1].gradients == pytest.approx(params * 8, rel=1e-12)


def test_no_plan_suggests_the_next_stage():
    """Six 16,384-wide linears (1.6 G parameters, 26 GB of fp32 Adam state) on two 8 GB
    P4s: nothing fits, and the message names the next ZeRO stage."""
    net = mlp([16384] * 7, relu=False)
    for zero, want in ((0, "--zero 1 (shards the optimizer state"),
                       (2, "--zero 3 (shards the weights too")):
        ctx, opts = _ctx(net, 2, zero, b=2, cl=cluster(per_node=2, device="P4"))
        with pytest.raises(NoFeasiblePlan) as err:
            search(ctx, opts)
        assert want in str(err.value)


def test_cli_and_plan_document(runner, tmp_path):
    net, cl = str(NETWORKS / "gpt2-small.yaml"), str(CLUSTERS / "dgx-h100.yaml")
    args = ["cost", net, cl, "-p", "16", "-b", "16", "--optimizer", "adam", "--format", "json"]
    plain = json.loads(invoke(runner, *args).stdout)
    res = invoke(runner, *args, "--zero", "2")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert plain["problem"]["zero"] == 0 and doc["problem"]["zero"] == 2
    b0, b2 = plain["memory"]["breakdown"], doc["memory"]["breakdown"]
    assert b2["weights"] == b0["weights"]
    assert b2["gradients"] == pytest.approx(b0["gradients"] / 16, rel=1e-3)
    assert b2["optimizer"] == pytest.approx(b0["optimizer"] / 16, rel=1e-3)
    assert doc["iteration"]["parameters_comm_s"] > 0 == plain["iteration"]["parameters_comm_s"]
    layer = next(x for x in doc["layers"] if x["comm"]["terms"])
    kinds = {t["collective"] for t in layer["comm"]["terms"]}
    assert "reduce_scatter" in kinds and "all_reduce" not in kinds
    bad = invoke(runner, *args, "--zero", "1", "--cost-model", "gholami2018")
    assert bad.exit_code == 2 and "--zero needs --cost-model exact" in bad.output
    assert "Traceback" not in bad.output
    assert invoke(runner, *args, "--zero", "4").exit_code == 2


def _config(tmp_path, extra):
    path = tmp_path / "train.yaml"
    path.write_text(f"kind: training\nnetwork: {NETWORKS / 'gpt2-small.yaml'}\n"
                    f"cluster: {CLUSTERS / 'dgx-h100.yaml'}\ngpus: 8\nbatch: 8\n"
                    f"optimizer: adam\nstrategy:\n  grid: 1x8\n{extra}")
    return path


def test_the_library_refuses_zero_under_the_paper_accounting():
    """make_context checks what the command line checks: the paper's Eq. 3-9 have no
    reduce-scatter to price a sharded gradient with."""
    from planner.errors import UsageError

    with pytest.raises(UsageError, match="--zero needs --cost-model exact"):
        _ctx(mlp([8, 8]), 2, 1, cost_model="gholami2018")
    with pytest.raises(UsageError, match="ZeRO stage 4 does not exist"):
        _ctx(mlp([8, 8]), 2, 4)


def test_training_configuration_takes_zero(runner, tmp_path):
    ok = invoke(runner, "check", str(_config(tmp_path, "zero: 2\n")), "--format", "json")
    assert ok.exit_code in (0, 1), ok.output
    assert "Traceback" not in ok.output
    bad = invoke(runner, "check", str(_config(tmp_path, "zero: 5\n")))
    assert bad.exit_code == 2
    assert "train.yaml:9:7" in bad.output and "zero" in bad.output
    paper = invoke(runner, "check", str(_config(tmp_path,
                                                 "zero: 1\ncost_model: gholami2018\n")))
    assert paper.exit_code == 2 and "ZeRO needs 'cost_model: exact'" in paper.output


def test_a_plan_made_before_zero_reads_as_stage_zero(runner, tmp_path):
    """Plans written before the ``zero`` field existed are not stale for a configuration
    without ZeRO, and are for one with it."""
    net, cl = str(NETWORKS / "gpt2-small.yaml"), str(CLUSTERS / "dgx-h100.yaml")
    plan = tmp_path / "plan.json"
    res = invoke(runner, "plan", net, cl, "-p", "8", "-b", "8", "--optimizer", "adam",
                          "--format", "json", "-o", str(plan))
    assert res.exit_code == 0, res.output
    doc = json.loads(plan.read_text())
    del doc["problem"]["zero"]
    plan.write_text(json.dumps(doc))
    for extra, stale in (("", False), ("zero: 1\n", True)):
        path = tmp_path / "train.yaml"
        path.write_text(f"kind: training\nnetwork: {net}\ncluster: {cl}\ngpus: 8\nbatch: 8\n"
                        f"optimizer: adam\nstrategy:\n  plan: {plan}\n{extra}")
        out = invoke(runner, "check", str(path), "--format", "json").output
        assert ("the plan is for zero=0, the configuration says 1" in out) == stale, out


def test_the_table_shows_the_parameter_gathers(runner):
    """A plan with ZeRO says so in its heading and gives the gathers a column, counted in
    each layer's total; a plan without ZeRO keeps its columns."""
    net, cl = str(NETWORKS / "gpt2-small.yaml"), str(CLUSTERS / "dgx-h100.yaml")
    args = ["cost", net, cl, "-p", "16", "-b", "16", "--optimizer", "adam"]
    runner.env = {"COLUMNS": "200"}
    plain = invoke(runner, *args).output
    assert "param gather" not in plain and "ZeRO" not in plain
    three = invoke(runner, *args, "--zero", "3").output
    assert "overlap gradients, ZeRO stage 3" in three
    assert any("param gather" in line for line in three.splitlines())
    row = next(line for line in three.splitlines() if line.split()[:1] == ["h.0.mlp.c_fc"])
    doc = json.loads(invoke(runner, *args, "--zero", "3", "--format", "json").stdout)
    rec = next(x for x in doc["layers"] if x["name"] == "h.0.mlp.c_fc")
    gathers = rec["comm"]["parameters_s"]
    assert gathers > 0
    assert f"{gathers * 1e6:.3g} µs" in row
    total = rec["compute_s"] + gathers + rec["comm"]["weight_grad_s"]
    assert f"{total * 1e6:.3g} µs" in row


# --zero auto ---------------------------------------------------------------------------

def _roofline_ctx(net, p, b, zero=0, device="P4", overlap="gradients"):
    from planner.costs.compute import Roofline

    opts = Options(gpus=p, batch=b, optimizer="adam", zero=zero, overlap=overlap)
    return make_context(net, cluster(per_node=8, device=device), opts, Roofline()), opts


def _explicit(net, p, b, pins=None, overlap="gradients"):
    """Every stage searched on its own: (time, constrained) or None where nothing fits."""
    out = {}
    for zero in (0, 1, 2, 3):
        ctx, opts = _roofline_ctx(net, p, b, zero, overlap=overlap)
        try:
            res = search(ctx, opts, "time", pins)
        except NoFeasiblePlan:
            out[zero] = None
            continue
        out[zero] = (res.best.evaluation.time_s, res.constrained)
    return out


@pytest.mark.parametrize("width, depth, batch, data, overlap, want", [
    # gathers on the critical path (no overlap): stage 3 only wins where it alone fits
    (8192, 6, 4096, False, "none", 1),    # a quarter of the Adam step beats the gathers
    (16384, 6, 1024, False, "none", 0),   # all model parallel: no replicas, a tie, stage 0
    (12288, 16, 4096, False, "none", 2),  # stage 1's optimum does not fit; stage 2's does
    (12288, 20, 4096, False, "none", 3),  # only stage 3's optimum fits unconstrained
    (12288, 6, 8, True, "none", 2),       # pinned data parallel: fits from stage 2 on
    # prefetched (overlap gradients): stage 3 hides its gathers behind the P4s' slow
    # compute and, unlike stages 1-2, gathers nothing after the step
    (8192, 6, 4096, False, "gradients", 3),
    (12288, 6, 8, True, "gradients", 3),
    # batch 8 on eight devices: each layer's compute is too short to hide its gather
    (8192, 6, 8, False, "gradients", 0),
])
def test_auto_is_the_fastest_stage(width, depth, batch, data, overlap, want):
    """``search_zero`` returns the fastest of the four stages searched one by one (the
    lower on a tie), on linear stacks on eight 8 GB P4s with roofline kernel times; a
    stage it does not search is never faster than the one it chose."""
    from planner.search import search_zero

    net = mlp([width] * (depth + 1), relu=False)
    pins = {x.index: [make_layout("data", 1, 8)] for x in net.layers if x.has_weights} \
        if data else None
    ctx, opts = _roofline_ctx(net, 8, batch, overlap=overlap)
    res, sctx, sopts = search_zero(ctx, opts, "time", pins)
    assert sopts.zero == sctx.zero == want
    explicit = _explicit(net, 8, batch, pins, overlap)
    times = {z: t[0] for z, t in explicit.items() if t is not None}
    assert res.best.evaluation.time_s == pytest.approx(min(times.values()), rel=1e-12)
    assert want == min(times, key=lambda z: (times[z], z))
    for trial in res.zero_trials:
        if trial.outcome == "plan":
            assert trial.time_s == pytest.approx(times[trial.stage], rel=1e-12)
        elif trial.outcome == "no plan":
            assert explicit[trial.stage] is None
        else:  # skipped: explicitly searched, it would not have won
            assert trial.outcome in ("same as 1", "not faster than 1", "not faster than 2")
            assert trial.stage != 3 or overlap == "none"  # prefetched: always searched
            got = explicit[trial.stage]
            assert got is not None and got[0] >= res.best.evaluation.time_s * (1 - 1e-12)
            if trial.outcome == "same as 1":
                assert got[0] == pytest.approx(times[1], rel=1e-12)
    assert res.notes[-1].startswith(f"--zero auto chose stage {want}")


def test_auto_with_nothing_fitting_gives_stage_three_error():
    """Twenty-eight 12,288-wide linears (4.2 G parameters) on eight 8 GB P4s: no stage
    fits, and the error is stage 3's (no ZeRO stage left to suggest)."""
    from planner.search import search_zero

    ctx, opts = _roofline_ctx(mlp([12288] * 29, relu=False), 8, 4096)
    with pytest.raises(NoFeasiblePlan) as err:
        search_zero(ctx, opts)
    assert "no plan fits in memory" in str(err.value) and "--zero" not in str(err.value)


def test_auto_on_the_command_line(runner, tmp_path):
    """``plan``, ``cost`` and ``sweep`` take ``--zero auto``: the plan is the chosen
    stage's (``problem.zero``), lists what each stage gave, and the table says it."""
    net, cl = str(NETWORKS / "gpt2-small.yaml"), str(CLUSTERS / "dgx-h100.yaml")
    base = [net, cl, "-p", "8", "-b", "8", "--optimizer", "adam"]
    res = invoke(runner, "plan", *base, "--zero", "auto", "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    stages = doc["zero_auto"]
    assert [t["stage"] for t in stages] == [0, 1, 2, 3]
    chosen = doc["problem"]["zero"]
    searched = {t["stage"]: t["time_s"] for t in stages if t["outcome"] == "plan"}
    assert doc["iteration"]["time_s"] == min(searched.values()) == searched[chosen]
    fixed = json.loads(invoke(runner, "plan", *base, "--zero", str(chosen), "--format",
                              "json").stdout)
    assert fixed["layers"] == doc["layers"] and fixed["iteration"] == doc["iteration"]
    table = invoke(runner, "plan", *base, "--zero", "auto").output
    assert "ZeRO auto stage 0:" in table and "(chosen)" in table
    cost = json.loads(invoke(runner, "cost", *base, "--zero", "auto", "--format",
                             "json").stdout)
    priced = {t["stage"]: t["time_s"] for t in cost["zero_auto"]}
    assert all(t["outcome"] == "fits" for t in cost["zero_auto"])
    assert cost["iteration"]["time_s"] == min(priced.values())
    assert priced[cost["problem"]["zero"]] == min(priced.values())
    sweep = json.loads(invoke(runner, "sweep", net, cl, "-p", "8", "-b", "8", "--optimizer",
                              "adam", "--zero", "auto", "--format", "json").stdout)
    assert sweep["results"][0]["zero"] == chosen
    for bad, message in ((["--zero", "auto", "--cost-model", "gholami2018"],
                          "--zero auto needs --cost-model exact"),
                         (["--zero", "all"], "'all' is not one of '0', '1', '2', '3', 'auto'")):
        out = invoke(runner, "plan", *base, *bad)
        assert out.exit_code == 2 and message in out.output and "Traceback" not in out.output


@pytest.mark.parametrize("n, intra", [
    (1024, (ALPHA, BW)),  # 4 MiB gathers (50.7 µs each) outlast a layer's 10-20 µs compute
    (64, (1e-7, 1e12)),   # 16 KiB gathers on a fast link (0.7 µs)
])
def test_stage_three_prefetch_by_hand(n, intra):
    """Three n × n linears (no bias), data parallel on 8 GPUs, ZeRO stage 3 with overlap:
    the three gathers of each pass are over one group and together under the 25 MiB
    bucket, so they fuse into one gather of 3n² elements (FSDP gathers a wrapped unit
    at once; DeepSpeed coalesces its prefetches), G3 by hand, which arrives whole before
    the first layer of the pass starts; each layer's term carries a third of it. Then
    each pass is G3 plus its compute. The three gradients share one bucket,
    reduce-scattered when the last is ready, so the step ends at forward + backward + R
    + the optimizer step."""
    net = mlp([n] * 4, bias=False, relu=False)
    cl = cluster(per_node=8, intra=intra, algorithm="ring")
    ctx, opts = _ctx(net, 8, 3, overlap="gradients", cl=cl)
    lay = make_layout("data", 1, 8)
    ev = evaluate(ctx, opts, {x.index: lay for x in net.layers if x.has_weights})
    alpha, bw = intra
    g3 = 7 * alpha + 7 / 8 * 3 * n * n * E / bw  # one ring all-gather of the three, by hand
    gathers = [(t.seconds, t.note) for r in ev.layers for t in r.cost.terms
               if t.phase == "parameters"]
    assert [x[0] for x in gathers] == pytest.approx([g3 / 3] * 6, rel=1e-12)
    assert {x[1] for x in gathers} == {"gather (forward) bucketed",
                                      "gather (backward) bucketed"}
    c = [r.cost.forward_s for r in ev.layers]
    b = [r.cost.backward_s for r in ev.layers]
    assert ev.forward_s == pytest.approx(g3 + sum(c), rel=1e-12)
    assert ev.backward_s == pytest.approx(g3 + sum(b), rel=1e-12)
    rs = 7 * alpha + 7 / 8 * 3 * n * n * E / bw
    assert len(ev.buckets) == 1
    assert ev.time_s == pytest.approx(ev.forward_s + ev.backward_s + rs + ev.optimizer_s,
                                      rel=1e-12)
    # gathered parameters in the buffers: the layer's own and the two prefetched (within
    # the window), besides two gradient buckets (here all three gradients)
    assert ev.memory.comm_buffers == pytest.approx(6 * n * n * E, rel=1e-12)


def test_stage_three_without_buckets_waits_for_each_gather():
    """``--bucket-size 0``: ZeRO stage 3's gathers one a layer, each issued as the layer
    before it starts (the prefetch window is empty, and one layer's gather is always
    let through; before, an empty window issued none, and the gathers were free). Three
    1024 × 1024 linears as above, g = 50.7 µs a gather by hand against 10, 10 and 20 µs
    of forward: layer 0 starts at g, each next layer g later, so the forward ends at 3g
    + 20 µs."""
    net = mlp([1024] * 4, bias=False, relu=False)
    ctx, opts = _ctx(net, 8, 3, overlap="gradients", bucket_bytes=0.0)
    lay = make_layout("data", 1, 8)
    ev = evaluate(ctx, opts, {x.index: lay for x in net.layers if x.has_weights})
    g = _ring(8, 1024 * 1024 * E)
    f = [r.cost.forward_s for r in ev.layers]
    assert f == [1e-5, 1e-5, 2e-5]
    assert ev.forward_s == pytest.approx(g + max(f[0], g) + max(f[1], g) + f[2], rel=1e-12)


def test_prefetched_gathers_queue_behind_gradient_buckets():
    """The backward gathers share the channel with the gradient reduce-scatters, first
    come first served. Three 1024 × 1024 linears as above, with a 1-byte bucket size:
    each gradient its own bucket, and a prefetch window of one layer (each gather issued
    when the layer before it starts): gather G = 50.7 µs and reduce-scatter R (of 4 MiB, the same
    by hand) against 20 µs of backward compute. From the start of the backward (time 0):
    layer 3 starts at s3 = G, gather 2 runs s3 → s3 + G; layer 3 ends at e3 = s3 + b3 and
    its reduce-scatter queues behind gather 2: r3 = max(s3 + G, e3) + R; layer 2 starts
    at s2 = max(e3, s3 + G) and issues gather 1, behind r3: a1 = max(r3, s2) + G; and so
    on."""
    net = mlp([1024] * 4, bias=False, relu=False)
    ctx, opts = _ctx(net, 8, 3, overlap="gradients", bucket_bytes=1.0)
    lay = make_layout("data", 1, 8)
    ev = evaluate(ctx, opts, {x.index: lay for x in net.layers if x.has_weights})
    g = r = _ring(8, 1024 * 1024 * E)
    b1, b2, b3 = (x.cost.backward_s for x in ev.layers)
    s3 = g
    e3 = s3 + b3
    r3 = max(s3 + g, e3) + r
    s2 = max(e3, s3 + g)
    a1 = max(r3, s2) + g
    e2 = s2 + b2
    r2 = max(a1, e2) + r
    s1 = max(e2, a1)
    e1 = s1 + b1
    r1 = max(r2, e1) + r
    assert len(ev.buckets) == 3
    assert ev.backward_s == pytest.approx(e1, rel=1e-12)
    assert ev.time_s == pytest.approx(ev.forward_s + max(e1, r1) + ev.optimizer_s, rel=1e-12)
    assert [x["end_s"] - ev.forward_s for x in ev.buckets] == pytest.approx([r3, r2, r1],
                                                                            rel=1e-12)


@pytest.mark.parametrize("n, intra", [
    (1024, (ALPHA, BW)),  # 4 MiB gathers (50.7 µs each) outlast a layer's 10 µs forward
    (64, (1e-7, 1e12)),   # 16 KiB gathers on a fast link (0.71 µs)
])
@pytest.mark.parametrize("zero", [1, 2])
def test_overlapped_parameter_gathers_by_hand(n, intra, zero):
    """Megatron-LM's ``--overlap-param-gather``: three n × n linears (no bias), data
    parallel on 8 GPUs, ZeRO 1 or 2, a 1-byte bucket (each layer's gather its own, and a
    window of one: each issued when the layer before it starts). The gathers after the
    step, g = 7α + 7/8 · n²·E/B each by hand, run under the next step's forward of f = 10
    µs a layer (20 µs for the last, with the loss): layer 0 starts at g, and each next
    layer max(f, g) later (its gather, issued as the one before starts, takes g), so that
    forward ends at g + 2·max(f, g) + 2f, where it took 4f: the step pays g + 2·max(f, g)
    − 2f of the 3g it paid after the optimizer. The traffic is the same."""
    net = mlp([n] * 4, bias=False, relu=False)
    cl = cluster(per_node=8, intra=intra, algorithm="ring")
    lay = make_layout("data", 1, 8)
    evs = []
    for overlapped in (False, True):
        ctx, opts = _ctx(net, 8, zero, overlap="gradients", cl=cl, bucket_bytes=1.0,
                         overlap_param_gather=overlapped)
        evs.append(evaluate(ctx, opts, {x.index: lay for x in net.layers if x.has_weights}))
    plain, over = evs
    alpha, bw = intra
    g = 7 * alpha + 7 / 8 * n * n * E / bw
    assert [t.seconds for r in plain.layers for t in r.cost.terms if t.when == "update"] \
        == pytest.approx([g] * 3, rel=1e-12)
    f = 1e-5
    assert [r.cost.forward_s for r in plain.layers] == [f, f, 2 * f]
    paid = g + 2 * max(f, g) - 2 * f
    assert over.time_s == pytest.approx(plain.time_s - 3 * g + paid, rel=1e-12)
    assert over.comm_s == plain.comm_s and over.parameters_s == plain.parameters_s
    assert over.exposed_comm_s < plain.exposed_comm_s


def test_overlapped_parameter_gathers_on_the_command_line(runner, tmp_path):
    """``--overlap-param-gather`` is recorded in the plan, shortens GPT-2's step on 16
    GPUs with ZeRO 1 and is compared by ``check --plan`` and passed on by ``launch``.
    Without ZeRO 1-2 (stage 0 has no gathers after the step, stage 3 prefetches its own)
    or without overlapped gradients it is a usage error (exit 2); in a training
    configuration, an input error at its line."""
    net, cl = str(NETWORKS / "gpt2-small.yaml"), str(CLUSTERS / "dgx-h100.yaml")
    args = ["cost", net, cl, "-p", "8", "-b", "8", "--optimizer", "adam", "--zero", "1",
            "--format", "json"]
    plain = json.loads(invoke(runner, *args).stdout)
    res = invoke(runner, *args, "--overlap-param-gather")
    assert res.exit_code == 0, res.output
    over = json.loads(res.stdout)
    assert over["problem"]["overlap_param_gather"] is True
    assert "overlap_param_gather" not in plain["problem"]
    assert over["iteration"]["time_s"] < plain["iteration"]["time_s"]
    assert over["iteration"]["comm_s"] == plain["iteration"]["comm_s"]
    for bad, words in ((["--zero", "0"], "--zero 0 has none"),
                       (["--zero", "3"], "--zero 3 gathers before each pass"),
                       (["--overlap", "none"], "needs --overlap gradients")):
        out = invoke(runner, *args, "--overlap-param-gather", *bad)
        assert out.exit_code == 2 and words in out.stderr, out.stderr
    table = invoke(runner, *args[:-2], "--overlap-param-gather").output
    assert "overlap gradients and parameter gathers" in table
    (tmp_path / "over.json").write_text(res.stdout)
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    for plan, extra, code, words in (
            ("over.json", "zero: 1\noverlap_param_gather: true\n", 0, ""),
            ("plain.json", "zero: 1\noverlap_param_gather: true\n", 1,
             "the plan is for overlap_param_gather=false, the configuration says true"),
            ("over.json", "zero: 1\n", 1,
             "the plan is for overlap_param_gather=true, the configuration says false")):
        path = _config(tmp_path, extra)
        path.write_text(path.read_text().replace("grid: 1x8", f"plan: {plan}"))
        out = invoke(runner, "check", str(path))
        assert out.exit_code == code and words in out.output, out.output
    for extra, where in (("zero: 0\noverlap_param_gather: true\n", "train.yaml:10"),
                         ("zero: 1\noverlap_param_gather: maybe\n", "train.yaml:10:23")):
        out = invoke(runner, "check", str(_config(tmp_path, extra)))
        assert out.exit_code == 2 and where in out.stderr, out.stderr
    env = invoke(runner, "launch", str(tmp_path / "over.json"), "--emit", "env").output
    assert "PLANNER_OVERLAP_PARAM_GATHER=1" in env and "--overlap-param-gather" in env
    assert "PARAM_GATHER" not in invoke(runner, "launch", str(tmp_path / "plain.json"),
                                        "--emit", "env").output


# hybrid sharding: ZeRO within nodes, replicated across them -----------------------------

INTER = (5e-6, 10e9)  # helpers.cluster's inter-node tier


def _ring_across(m, nbytes):
    """A ring all-reduce over ``m`` nodes, one rank in each, by hand (Thakur et al.
    2005): every step at the inter-node tier, 2(m − 1)α + 2(m − 1)/m · n/B."""
    return 2 * ((m - 1) * INTER[0] + (m - 1) / m * nbytes / INTER[1])


def _hybrid_ctx(net, p, zero, shard="node", overlap="none", **kw):
    return _ctx(net, p, zero, overlap=overlap, zero_shard=shard, **kw)


def test_hybrid_terms_by_hand():
    """fc1 (8,320 parameters) data parallel on 16 GPUs, two nodes of 8, ring
    collectives. Sharded within nodes (FSDP's HYBRID_SHARD): the gathers are rings over
    the 8 GPUs of the node, and the gradient one ``hybrid_reduce``: a ring
    reduce-scatter over the node's 8, then a ring all-reduce of its 1/8 over the 2
    nodes. Each GPU keeps 1/8 of the state, not 1/16."""
    net = mlp([64, 128, 32])
    fc1 = net.by_name("fc1")
    n = 8320 * E
    lay = make_layout("data", 1, 16)
    hybrid = _ring(8, n) + _ring_across(2, n / 8)
    got = {}
    for zero in (1, 3):
        ctx, _ = _hybrid_ctx(net, 16, zero)
        terms = weighted_terms(fc1, lay, ctx)
        assert shards(terms) == 8
        got[zero] = [(t.phase, t.collective, t.when, t.group.size, t.group.per_node, t.bytes,
                      t.seconds, t.algorithm) for t in terms]
    gather = pytest.approx(_ring(8, n), rel=1e-12)
    reduce = ("weight_grad", "hybrid_reduce", "gradient", 16, 8, n,
              pytest.approx(hybrid, rel=1e-12), "ring+ring")
    assert got[1] == [reduce, ("parameters", "all_gather", "update", 8, 8, n, gather, "ring")]
    assert got[3] == [("parameters", "all_gather", "forward", 8, 8, n, gather, "ring"),
                      ("parameters", "all_gather", "backward", 8, 8, n, gather, "ring"),
                      reduce]
    everywhere, _ = _hybrid_ctx(net, 16, 3, shard="all")
    assert shards(weighted_terms(fc1, lay, everywhere)) == 16


def test_hybrid_is_plain_zero_inside_a_node_and_none_with_one_replica_a_node():
    """Replicas all in one node: sharding within nodes is sharding over all of them (the
    same terms). Model 8x2 on two nodes of 8: each shard's 2 replicas sit in different
    nodes, one a node, so nothing is sharded (1/1 kept): the gradient is all-reduced
    across the nodes and nothing is gathered, as without ZeRO."""
    net = mlp([64, 128, 32])
    fc1 = net.by_name("fc1")
    one_node = make_layout("data", 1, 8)
    hybrid, _ = _hybrid_ctx(net, 8, 3)
    full, _ = _hybrid_ctx(net, 8, 3, shard="all")
    assert weighted_terms(fc1, one_node, hybrid) == weighted_terms(fc1, one_node, full)
    lay = make_layout("model", 8, 2)
    ctx, _ = _hybrid_ctx(net, 16, 3)
    terms = [t for t in weighted_terms(fc1, lay, ctx) if t.phase in ("weight_grad",
                                                                      "parameters")]
    n = 8320 / 8 * E
    assert [(t.collective, t.group.size, t.group.per_node, t.seconds) for t in terms] == [
        ("hybrid_reduce", 2, 1, pytest.approx(_ring_across(2, n), rel=1e-12))]
    assert shards(terms) == 1


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_hybrid_memory_by_hand(zero):
    """Two linears data parallel on 16 GPUs in two nodes, fp32 Adam: within nodes each
    GPU keeps the sharded columns over 8 (ZeRO §3.1 with N_d = 8), over all over 16."""
    net = mlp([64, 128, 32])
    lay = make_layout("data", 1, 16)
    params = 64 * 128 + 128 + 128 * 32 + 32
    for shard, r in (("node", 8), ("all", 16)):
        ctx, opts = _hybrid_ctx(net, 16, zero, shard=shard)
        mem = evaluate(ctx, opts, {x.index: lay for x in net.layers if x.has_weights}).memory
        assert mem.weights == pytest.approx(params * E / (r if zero >= 3 else 1), rel=1e-12)
        assert mem.gradients == pytest.approx(params * E / (r if zero >= 2 else 1), rel=1e-12)
        assert mem.optimizer == pytest.approx(params * 8 / r, rel=1e-12)


def test_hybrid_reductions_bucket_as_one_collective():
    """Under --overlap gradients the three layers' hybrid reductions (one group, one
    term each) fill one 25 MiB bucket: one reduce-scatter in the node and one all-reduce
    across nodes of the sum, and one gather in the node of the updated parameters."""
    net = mlp([64, 128, 256, 32])
    ctx, opts = _hybrid_ctx(net, 16, 1, overlap="gradients")
    lay = make_layout("data", 1, 16)
    ev = evaluate(ctx, opts, {x.index: lay for x in net.layers if x.has_weights})
    total = (64 * 128 + 128 + 128 * 256 + 256 + 256 * 32 + 32) * E
    assert len(ev.buckets) == 1
    assert ev.weight_grad_s == pytest.approx(_ring(8, total) + _ring_across(2, total / 8),
                                             rel=1e-12)
    assert ev.parameters_s == pytest.approx(_ring(8, total), rel=1e-12)


@pytest.mark.parametrize("zero", [1, 3])
def test_hybrid_dynamic_program_equals_the_evaluation(zero):
    """The search's dynamic program prices hybrid sharding's terms, memory and step as
    the evaluation does (16 devices, two nodes, no overlap)."""
    net = load_network_text(_transformer_text(2))
    cl = cluster(per_node=8, intra=(1e-6, 1e11), inter=(5e-6, 1e10))
    opts = Options(gpus=16, batch=128, overlap="none", optimizer="adam", zero=zero,
                   zero_shard="node")
    value, ev = program_and_evaluation(net, cl, opts)
    assert value == pytest.approx(ev.time_s, rel=1e-12)
    assert any(t.collective == "hybrid_reduce" for r in ev.layers for t in r.cost.terms)


@pytest.mark.parametrize("width, depth, overlap, want", [
    (8192, 6, "gradients", (3, "all")),     # prefetched gathers across nodes are hidden
    (12288, 20, "gradients", (3, "all")),   # stage 2 within nodes is searched (see below)
    (8192, 6, "none", (1, "all")),          # the replica groups stay in a node: a tie
])
def test_auto_over_stages_and_shards(width, depth, overlap, want):
    """``search_zero`` over both ways of sharding returns the fastest of every (stage,
    shard) searched one by one, on linear stacks on 16 P4s (two nodes); a setting it
    skips is never faster; a tie goes to the lower stage, then to sharding over all."""
    from planner.costs.compute import Roofline
    from planner.search import search_zero

    net = mlp([width] * (depth + 1), relu=False)
    explicit = {}
    for zero in (0, 1, 2, 3):
        for shard in ("all", "node"):
            opts = Options(gpus=16, batch=4096, optimizer="adam", zero=zero, overlap=overlap,
                           zero_shard=shard)
            ctx = make_context(net, cluster(per_node=8, device="P4"), opts, Roofline())
            explicit[zero, shard] = search(ctx, opts).best.evaluation.time_s
    ctx, opts = _roofline_ctx(net, 16, 4096, overlap=overlap)
    res, sctx, sopts = search_zero(ctx, opts, shards=("all", "node"))
    assert (sopts.zero, sopts.zero_shard) == (sctx.zero, sctx.zero_shard) == want
    best = min(explicit.values())
    assert res.best.evaluation.time_s == pytest.approx(best, rel=1e-12)
    assert want == min(explicit, key=lambda k: (explicit[k], k[0], k[1] != "all"))
    assert [(t.stage, t.shard) for t in res.zero_trials] == [
        (0, "all"), (1, "all"), (2, "all"), (3, "all"), (1, "node"), (2, "node"), (3, "node")]
    for t in res.zero_trials:
        if t.outcome == "plan":
            assert t.time_s == pytest.approx(explicit[t.stage, t.shard], rel=1e-12)
        else:
            assert explicit[t.stage, t.shard] >= best * (1 - 1e-12)


def test_hybrid_on_the_command_line(runner, tmp_path):
    """``--zero-shard node`` and ``auto`` on GPT-2 small over two DGX H100 nodes: the
    plan records ``problem.zero_shard``, the gradient terms are hybrid reductions, each
    GPU keeps twice the ZeRO state it keeps sharded over all 16; without ZeRO it is a
    usage error; ``auto`` lists both ways and the table says which it chose."""
    net, cl = str(NETWORKS / "gpt2-small.yaml"), str(CLUSTERS / "dgx-h100.yaml")
    base = [net, cl, "-p", "16", "-b", "16", "--optimizer", "adam", "--format", "json"]
    docs = {}
    for shard in ("all", "node"):
        res = invoke(runner, "cost", *base, "--zero", "3", "--zero-shard", shard)
        assert res.exit_code == 0, res.output
        docs[shard] = json.loads(res.stdout)
    assert docs["node"]["problem"]["zero_shard"] == "node"
    assert docs["all"]["problem"]["zero_shard"] == "all"
    plain = json.loads(invoke(runner, "cost", *base).stdout)
    assert "zero_shard" not in plain["problem"]
    kinds = {t["collective"] for x in docs["node"]["layers"] for t in x["comm"]["terms"]}
    assert "hybrid_reduce" in kinds and "reduce_scatter" not in kinds
    gathers = {t["per_node"] for x in docs["node"]["layers"] for t in x["comm"]["terms"]
               if t["collective"] == "all_gather"}
    assert gathers == {8}
    b_all, b_node = docs["all"]["memory"]["breakdown"], docs["node"]["memory"]["breakdown"]
    for key in ("weights", "gradients", "optimizer"):
        assert b_node[key] == pytest.approx(2 * b_all[key], rel=1e-3)
    bad = invoke(runner, "cost", *base, "--zero-shard", "node")
    assert bad.exit_code == 2 and "--zero-shard node needs ZeRO" in bad.output
    assert "Traceback" not in bad.output
    auto = json.loads(invoke(runner, "plan", *base, "--zero", "3", "--zero-shard",
                             "auto").stdout)
    assert [(t["stage"], t["shard"]) for t in auto["zero_auto"]] == [(3, "all"), (3, "node")]
    times = {t["shard"]: t["time_s"] for t in auto["zero_auto"]}
    assert auto["iteration"]["time_s"] == min(times.values())
    assert times[auto["problem"]["zero_shard"]] == min(times.values())
    assert "--zero-shard auto chose stage 3" in " ".join(auto["search"]["notes"])
    one_node = json.loads(invoke(runner, "plan", net, cl, "-p", "8", "-b", "8", "--optimizer",
                                 "adam", "--zero", "3", "--zero-shard", "auto", "--format",
                                 "json").stdout)
    assert "zero_auto" not in one_node  # in one node the two ways are one
    runner.env = {"COLUMNS": "200"}
    table = invoke(runner, "cost", *base[:-2], "--zero", "3", "--zero-shard", "node").output
    assert "ZeRO stage 3 within nodes" in table
    both = invoke(runner, "cost", *base[:-2], "--zero", "auto", "--zero-shard", "auto").output
    assert "stage 3 within nodes:" in both and "(chosen)" in both


def test_training_configuration_takes_the_sharding(runner, tmp_path):
    """``zero_shard`` in a configuration: without ZeRO it is an error at its line and
    column; a plan made sharding over all is stale for a configuration sharding within
    nodes."""
    bad = invoke(runner, "check", str(_config(tmp_path, "zero_shard: node\n")))
    assert bad.exit_code == 2 and "train.yaml:9:13" in bad.output, bad.output
    assert "sharding within nodes needs ZeRO" in bad.output
    wrong = invoke(runner, "check", str(_config(tmp_path, "zero: 3\nzero_shard: nodes\n")))
    assert wrong.exit_code == 2 and "train.yaml:10:13" in wrong.output, wrong.output
    net, cl = str(NETWORKS / "gpt2-small.yaml"), str(CLUSTERS / "dgx-h100.yaml")
    plan = tmp_path / "plan.json"
    res = invoke(runner, "plan", net, cl, "-p", "16", "-b", "16", "--optimizer", "adam",
                 "--zero", "3", "--format", "json", "-o", str(plan))
    assert res.exit_code == 0, res.output
    for extra, stale in (("zero: 3\n", False), ("zero: 3\nzero_shard: node\n", True)):
        path = tmp_path / "train.yaml"
        path.write_text(f"kind: training\nnetwork: {net}\ncluster: {cl}\ngpus: 16\n"
                        f"batch: 16\noptimizer: adam\nstrategy:\n  plan: {plan}\n{extra}")
        out = invoke(runner, "check", str(path), "--format", "json").output
        assert ("the plan is for zero_shard=all, the configuration says node" in out) \
            == stale, out


def test_no_plan_within_nodes_suggests_sharding_over_all():
    """Twelve 16,384-wide linears (3.2 G parameters, 52 GB of fp32 Adam state) on four
    8 GB P4s, two a node, at stage 2 within nodes: nothing fits, and the message names
    sharding over all replicas before the next stage."""
    net = mlp([16384] * 13, relu=False)
    ctx, opts = _ctx(net, 4, 2, b=4, cl=cluster(per_node=2, device="P4"), zero_shard="node")
    with pytest.raises(NoFeasiblePlan) as err:
        search(ctx, opts)
    text = str(err.value)
    assert "--zero-shard all (shards over all" in text
    assert text.index("--zero-shard all") < text.index("--zero 3")
    ctx, opts = _ctx(net, 4, 2, b=4, cl=cluster(per_node=2, device="P4"))
    with pytest.raises(NoFeasiblePlan) as err:
        search(ctx, opts)
    assert "--zero-shard" not in str(err.value)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_lower_bound_holds_at_every_stage(runner, zero):
    """No plan is faster than the recorded lower bound, at every stage. Stages 1-2's
    gathers after the step used to count in the bound per layer while the timeline fuses
    them into buckets, so a four-layer MLP on 8 GPUs took 125.9 µs against a 'bound' of
    142.5 µs (and the local search, skipped within 1% of the bound, never ran)."""
    for args in ((ROOT / "examples" / "launch" / "mlp4.yaml", "-p", "8", "-b", "16"),
                 (NETWORKS / "gpt2-small.yaml", "-p", "8", "-b", "64", "--optimizer", "adam")):
        res = invoke(runner, "plan", args[0], CLUSTERS / "dgx-h100.yaml", *args[1:],
                     "--zero", str(zero), "--format", "json")
        assert res.exit_code == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["search"]["lower_bound_s"] <= doc["iteration"]["time_s"], args[0]


def _zero_and_recompute(memory: float, p: int, batch: int, share: bool):
    """``--zero auto --recompute auto`` on a four-block transformer whose devices hold
    ``memory`` bytes; ``share``: the counts tell one another which ZeRO settings had no
    plan (as ``plan`` does), else each count searches every setting."""
    import dataclasses

    from planner.search import ZERO_STAGES, search_recompute, search_zero

    cl = cluster(per_node=4)
    cl = dataclasses.replace(cl, device=dataclasses.replace(cl.device, memory_bytes=memory),
                             reserved_memory=0.0)
    opts = Options(gpus=p, batch=batch, optimizer="adam")
    ctx = make_context(load_network_text(_transformer_text(4)), cl, opts)

    def inner(c, o, count, no_plan):
        return search_zero(c, o, "time", {}, ZERO_STAGES, ("all",), count,
                           no_plan if share else {})

    try:
        return search_recompute(ctx, opts, inner)
    except NoFeasiblePlan as exc:
        return str(exc)


@pytest.mark.parametrize("memory,p,batch", [(8e6, 4, 64), (12e6, 4, 64), (16e6, 4, 64),
                                            (10e6, 2, 32), (14e6, 4, 32), (4e6, 4, 64)])
def test_a_zero_stage_without_a_plan_is_not_searched_with_fewer_blocks_recomputed(
        memory, p, batch, monkeypatch):
    """Under ``--zero auto --recompute auto`` a ZeRO stage that had no plan with N blocks
    recomputed is not searched with fewer (they keep more): on questions where stages
    fail at some counts and plan at others (8-16 MB devices; 4 MB: nothing fits), the
    same plan, count, stage and trials as searching every stage at every count, the
    skipped ones recorded as ``no plan with N recomputed`` where the full search found
    no plan."""
    import planner.search as search_module

    calls: list[int] = []
    plain = search_module.search

    def counted(ctx, *args, **kwargs):
        calls.append(ctx.zero)
        return plain(ctx, *args, **kwargs)

    monkeypatch.setattr(search_module, "search", counted)
    shared = _zero_and_recompute(memory, p, batch, True)
    searched = len(calls)
    full = _zero_and_recompute(memory, p, batch, False)
    assert searched <= len(calls) - searched
    if isinstance(full, str):
        assert shared == full and memory == 4e6
        return
    (res, c, o), (fres, fc, fo) = shared, full
    assert o == fo
    assert (res.best.assignment, c.zero, c.recompute, res.best.evaluation) == \
        (fres.best.assignment, fc.zero, fc.recompute, fres.best.evaluation)
    assert res.recompute_trials == fres.recompute_trials
    for t, ft in zip(res.zero_trials, fres.zero_trials, strict=True):
        if t.outcome.startswith("no plan with "):
            assert ft.outcome == "no plan" and int(t.outcome.split()[3]) > 0
            assert dataclasses.replace(t, outcome="no plan") == ft
        else:
            assert t == ft
    if memory == 8e6:  # stages fail at 6 of 8 blocks and at every count below
        assert searched < len(calls) - searched


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_the_program_counts_what_runs_once_a_step_once_under_every_stage(zero, m):
    """Found by an audit: under ZeRO 2 and 3 with microbatches the gradients are
    reduced every microbatch, and the program weighed ZeRO 1-2's gather of the updated
    parameters (and the sequence-parallel norms' gradient all-reduce), which run once a
    step, with them, M times: `plan` on this MLP with ZeRO 2 and 4 microbatches chose a
    plan of 413.1 µs where one of 383.5 µs fits (7.7%), though with `--overlap none` the
    program is exact. Now M times its value is the evaluation of its answer and the
    least of every assignment's, and the search returns that optimum."""
    import itertools

    from planner.evaluate import EvalCache
    from planner.search import Space, Weights, solve

    net = load_network_text("kind: network\nname: mlp\ninput: [64]\nlayers:\n"
                            "  - {name: fc1, type: linear, out_features: 256}\n"
                            "  - {type: relu}\n"
                            "  - {name: fc2, type: linear, out_features: 32}\n"
                            "  - {name: fc3, type: linear, out_features: 512}\n")
    cl = cluster(per_node=2, intra=(1e-6, 1e11), inter=(5e-6, 1e9))
    opts = Options(gpus=8, batch=64 // m, overlap="none", microbatches=m, zero=zero,
                   optimizer="adam")
    ctx = make_context(net, cl, opts)
    space = Space(ctx, opts, {})
    space.prepare_transitions()
    per = 1.0 if zero >= 2 and m > 1 else 1 / m
    value, assignment = solve(space, Weights(gradient=per, step_share=1 / m, update=1 / m))
    assert value * m == pytest.approx(evaluate(ctx, opts, assignment).time_s, rel=1e-9)
    weighted = [layer.index for layer in net.layers if layer.has_weights]
    cache = EvalCache()
    best = min(evaluate(ctx, opts, dict(zip(weighted, combo, strict=True)), cache).time_s
               for combo in itertools.product(*(space.candidates[i] for i in weighted)))
    assert value * m == pytest.approx(best, rel=1e-9)
    assert search(ctx, opts).best.evaluation.time_s == pytest.approx(best, rel=1e-9)
