"""Gradients in a dtype of their own (``--grad-precision``, a configuration's
``grad_precision``): accumulated and reduced in it, so the gradient memory, the bytes of
every weight-gradient reduction and the optimizer step's gradient read scale with it,
while the weights, their ZeRO gathers and the activations stay in the network's dtype.

Megatron-LM keeps a bf16 model's gradients in fp32: 18 bytes a parameter for Adam, and
6 + 12/d under its distributed optimizer over d data-parallel replicas (the Megatron Core
developer guide, "Distributed Optimizer", its table of bytes per parameter)."""

from __future__ import annotations

import json

import pytest

from planner.costs.layer import weighted_terms
from planner.costs.memory import param_bytes, sharded
from planner.errors import UsageError
from planner.evaluate import Options, evaluate, make_context
from planner.inputs import load_network_text
from planner.layout import make_layout

from .conftest import CLUSTERS, NETWORKS, invoke
from .helpers import FixedEstimator, cluster, mlp, program_and_evaluation
from .test_search import _transformer_text

ALPHA, BW = 2e-6, 100e9  # helpers.cluster's intra-node tier


def _ring(p, nbytes, halves=1):
    """A ring all-gather or reduce-scatter inside a node, by hand (Thakur et al. 2005):
    (p − 1)α + (p − 1)/p · n/B; an all-reduce is two of them."""
    return halves * ((p - 1) * ALPHA + (p - 1) / p * nbytes / BW)


@pytest.mark.parametrize(("elem", "grad", "d", "want_total", "want_stage1"), [
    (2, 4, 8, 18, 6 + 12 / 8),   # bf16 parameters, fp32 gradients
    (4, 4, 8, 16, 8 + 8 / 8),    # fp32 parameters, fp32 gradients
    (2, 4, 64, 18, 6 + 12 / 64),
])
def test_megatron_bytes_per_parameter(elem, grad, d, want_total, want_stage1):
    """The Megatron Core table (Adam, fp32 main parameters), without and with the
    distributed optimizer (ZeRO stage 1 over d replicas)."""
    pb = param_bytes("adam", elem, True if elem < 4 else None, grad)
    assert pb.total == want_total
    assert sharded(pb, 1, d).total == pytest.approx(want_stage1, rel=1e-15)


def test_the_default_is_the_weights_dtype():
    assert param_bytes("adam", 2) == param_bytes("adam", 2, None, 2)
    assert param_bytes("momentum", 4).gradients == 4


def test_the_optimizer_step_reads_the_wider_gradient():
    """Read and write the weights (2 + 2) and the fp32 master copy and moments (12 + 12),
    read the fp32 gradient (4): 32 bytes a parameter, 2 more than with bf16 gradients."""
    assert param_bytes("adam", 2, None, 4).update_traffic == 32
    assert param_bytes("adam", 2).update_traffic == 30


def _ctx(net, p, zero, grad=None, b=16, cost_model="exact"):
    opts = Options(gpus=p, batch=b, overlap="none", optimizer="adam", zero=zero,
                   grad_dtype=grad, cost_model=cost_model)
    cl = cluster(per_node=8, algorithm="ring")
    return make_context(net, cl, opts, FixedEstimator(1e-5)), opts


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_terms_by_hand(zero):
    """fc1 of a bf16 MLP (64 → 128, 8,320 parameters) data parallel on 8 GPUs of one
    node, gradients in fp32: every reduction moves 4 bytes a parameter, every gather of
    parameters 2."""
    net = mlp([64, 128, 32], dtype="bfloat16")
    fc1 = net.by_name("fc1")
    g, w = 8320 * 4, 8320 * 2
    ctx, _ = _ctx(net, 8, zero, "float32")
    got = [(t.phase, t.collective, t.bytes, t.seconds)
           for t in weighted_terms(fc1, make_layout("data", 1, 8), ctx)]
    rs = ("weight_grad", "reduce_scatter", g, pytest.approx(_ring(8, g), rel=1e-12))
    gather = ("parameters", "all_gather", w, pytest.approx(_ring(8, w), rel=1e-12))
    want = {0: [("weight_grad", "all_reduce", g, pytest.approx(_ring(8, g, 2), rel=1e-12))],
            1: [rs, gather], 2: [rs, gather], 3: [gather, gather, rs]}[zero]
    assert got == want


def test_model_parallel_reduction_moves_the_wider_gradient():
    """A 2x4 model layout: the column group reduces the device's half of fc1's
    parameters (8,320 / 2) in fp32; the activations' collectives stay bf16."""
    net = mlp([64, 128, 32], dtype="bfloat16")
    fc1 = net.by_name("fc1")
    lay = make_layout("model", 2, 4)
    wide, _ = _ctx(net, 8, 0, "float32")
    same, _ = _ctx(net, 8, 0)
    a, b = weighted_terms(fc1, lay, wide), weighted_terms(fc1, lay, same)
    assert [t.bytes for t in a if t.phase == "weight_grad"] == [8320 / 2 * 4]
    assert [t.bytes for t in b if t.phase == "weight_grad"] == [8320 / 2 * 2]
    assert [t for t in a if t.phase != "weight_grad"] == \
        [t for t in b if t.phase != "weight_grad"]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_memory_report_by_hand(zero):
    """Two bf16 linears on a 2x4 model grid: each device keeps half of each one's
    parameters; weights 2 bytes, gradients 4, Adam's fp32 copy and moments 12, the
    sharded ones divided by R = 4."""
    net = mlp([64, 128, 32], dtype="bfloat16")
    ctx, opts = _ctx(net, 8, zero, "float32")
    lay = make_layout("model", 2, 4)
    mem = evaluate(ctx, opts, {net.by_name(n).index: lay for n in ("fc1", "fc2")}).memory
    local = (64 * 128 + 128) / 2 + (128 * 32 + 32) / 2
    r = 4
    assert mem.weights == pytest.approx(local * 2 / (r if zero >= 3 else 1), rel=1e-12)
    assert mem.gradients == pytest.approx(local * 4 / (r if zero >= 2 else 1), rel=1e-12)
    assert mem.optimizer == pytest.approx(local * 12 / (r if zero >= 1 else 1), rel=1e-12)


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_dynamic_program_equals_the_evaluation(zero):
    """The search prices the wider gradients' terms, memory and optimizer step as the
    evaluation does (bf16 transformer blocks, fp32 gradients, learned kernel models)."""
    net = load_network_text(_transformer_text(2)).in_dtype("bfloat16")
    cl = cluster(per_node=8, intra=(1e-6, 1e11), inter=(5e-6, 1e10))
    opts = Options(gpus=16, batch=128, overlap="none", optimizer="adam", zero=zero,
                   grad_dtype="float32")
    value, ev = program_and_evaluation(net, cl, opts)
    assert value == pytest.approx(ev.time_s, rel=1e-12)


def test_the_library_refuses_it_under_the_paper_accounting():
    with pytest.raises(UsageError, match="--grad-precision needs --cost-model exact"):
        _ctx(mlp([8, 8]), 2, 0, "float32", cost_model="gholami2018")
    with pytest.raises(UsageError, match="unknown gradient precision 'int8'"):
        _ctx(mlp([8, 8]), 2, 0, "int8")


NET, CL = str(NETWORKS / "gpt2-small.yaml"), str(CLUSTERS / "dgx-h100.yaml")


def _plan(runner, *extra):
    res = invoke(runner, "cost", NET, CL, "-p", "16", "-b", "32", "--precision", "bf16",
                 "--optimizer", "adam", "--grid", "1x16", "--mode", "data", "--zero", "1",
                 "--format", "json", *extra)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_cli_doubles_the_gradients_and_nothing_else(runner):
    """GPT-2 small in bf16, data parallel on 16 H100s (2 nodes), ZeRO stage 1: with fp32
    gradients every weight-gradient reduce-scatter carries twice the bytes, the update
    gathers the same, the gradient memory doubles, the weights and optimizer state do not."""
    base, wide = _plan(runner), _plan(runner, "--grad-precision", "fp32")
    assert base["problem"]["grad_dtype"] == "bfloat16"
    assert wide["problem"]["grad_dtype"] == "float32"
    for a, b in zip(base["layers"], wide["layers"], strict=True):
        for ta, tb in zip(a["comm"]["terms"], b["comm"]["terms"], strict=True):
            assert tb["bytes"] == ta["bytes"] * (2 if ta["phase"] == "weight_grad" else 1)
    ma, mb = base["memory"]["breakdown"], wide["memory"]["breakdown"]
    assert mb["gradients"] == 2 * ma["gradients"]
    assert (mb["weights"], mb["optimizer"], mb["activations"]) == \
        (ma["weights"], ma["optimizer"], ma["activations"])
    assert wide["iteration"]["weight_grad_s"] > base["iteration"]["weight_grad_s"]


def test_cli_table_and_errors(runner):
    res = invoke(runner, "cost", NET, CL, "-p", "8", "-b", "8", "--precision", "bf16",
                 "--grad-precision", "fp32")
    assert res.exit_code == 0, res.output
    assert "bfloat16 (gradients in float32)" in res.output
    same = invoke(runner, "cost", NET, CL, "-p", "8", "-b", "8", "--grad-precision", "fp32")
    assert same.exit_code == 0 and "(gradients in" not in same.output
    bad = invoke(runner, "cost", NET, CL, "-p", "8", "-b", "8", "--grad-precision", "int8")
    assert bad.exit_code == 2 and "--grad-precision" in bad.output
    paper = invoke(runner, "cost", NET, CL, "-p", "8", "-b", "8", "--grad-precision", "fp32",
                   "--cost-model", "gholami2018")
    assert paper.exit_code == 2 and "needs --cost-model exact" in paper.output
    assert "Traceback" not in paper.output


def _config(tmp_path, extra):
    path = tmp_path / "train.yaml"
    path.write_text(f"kind: training\nnetwork: {NET}\ncluster: {CL}\ngpus: 8\nbatch: 8\n"
                    f"optimizer: adam\nprecision: bf16\n{extra}")
    return path


def test_training_configuration(runner, tmp_path):
    """A configuration takes grad_precision; a bad one is named at its line and column;
    a plan made with other gradients is stale; a plan written before gradients had a
    dtype of their own reads as the weights'."""
    bad = invoke(runner, "check", str(_config(tmp_path, "grad_precision: fp8\n"
                                                        "strategy: {grid: 1x8}\n")))
    assert bad.exit_code == 2, bad.output
    assert "train.yaml:8:17" in bad.output and "unknown precision 'fp8'" in bad.output
    paper = invoke(runner, "check", str(_config(
        tmp_path, "grad_precision: fp32\ncost_model: gholami2018\nstrategy: {grid: 1x8}\n")))
    assert paper.exit_code == 2 and "needs 'cost_model: exact'" in paper.output
    plan = tmp_path / "plan.json"
    res = invoke(runner, "plan", NET, CL, "-p", "8", "-b", "8", "--optimizer", "adam",
                 "--precision", "bf16", "--format", "json", "-o", str(plan))
    assert res.exit_code == 0, res.output
    strategy = f"strategy:\n  plan: {plan}\n"
    for extra, stale in (("", False), ("grad_precision: bf16\n", False),
                         ("grad_precision: fp32\n", True)):
        out = invoke(runner, "check", str(_config(tmp_path, extra + strategy)),
                     "--format", "json").output
        msg = ("the plan is for grad_dtype=bfloat16, the configuration says float32 "
               "(grad_precision)")
        assert (msg in out) == stale, out
    doc = json.loads(plan.read_text())
    del doc["problem"]["grad_dtype"]
    plan.write_text(json.dumps(doc))
    out = invoke(runner, "check", str(_config(tmp_path, strategy)), "--format", "json").output
    assert "grad_dtype" not in out, out


def test_launch_passes_the_dtypes_on(runner, tmp_path):
    """`launch --emit env` gives the script both dtypes; a comment names FSDP's setting
    where they differ; an edited dtype is named at its line; a plan from before reads as
    gradients in the weights' dtype."""
    plan = tmp_path / "plan.yaml"
    res = invoke(runner, "plan", NET, CL, "-p", "16", "-b", "64", "--precision", "bf16",
                 "--grad-precision", "fp32", "--format", "yaml", "-o", str(plan))
    assert res.exit_code == 0, res.output
    out = invoke(runner, "launch", str(plan), "--emit", "env").output
    assert "PLANNER_DTYPE=bfloat16\nPLANNER_GRAD_DTYPE=float32\n" in out
    assert "MixedPrecision(reduce_dtype=torch.float32)" in out
    text = plan.read_text()
    line = text.splitlines().index("  grad_dtype: float32") + 1
    plan.write_text(text.replace("  grad_dtype: float32", "  grad_dtype: float8"))
    bad = invoke(runner, "launch", str(plan), "--emit", "env")
    assert bad.exit_code == 2 and f"plan.yaml:{line}:15" in bad.output, bad.output
    plan.write_text(text.replace("  grad_dtype: float32\n", ""))
    old = invoke(runner, "launch", str(plan), "--emit", "env").output
    assert "PLANNER_GRAD_DTYPE=bfloat16\n" in old and "MixedPrecision" not in old


def test_the_no_fit_advice_names_the_gradients(runner, tmp_path):
    """GPT-2 small in bf16 with Adam on one H100 left 3.2 GiB: fp32 gradients miss by
    90 MiB, and the advice says what bf16 ones save (a quarter of 1 GB of them); on one
    device it suggests no ZeRO stage, which would shard over nobody."""
    small = tmp_path / "small.yaml"
    small.write_text((CLUSTERS / "dgx-h100.yaml").read_text().replace(
        "reserved_memory: 1 GiB", "reserved_memory: 76.45 GiB"))
    args = ("plan", NET, small, "-p", "1", "-b", "1", "--precision", "bf16", "--optimizer",
            "adam")
    res = invoke(runner, *args, "--grad-precision", "fp32")
    assert res.exit_code == 1, res.output
    assert "gradients in the weights' dtype (--grad-precision bfloat16: 237.4 MiB less)" \
        in res.output and "--zero" not in res.output
    assert invoke(runner, *args).exit_code == 0


def test_launch_refuses_a_plan_it_cannot_name_and_a_dtype_not_a_name(runner, tmp_path):
    plan = tmp_path / "plan.yaml"
    res = invoke(runner, "plan", NET, CL, "-p", "8", "-b", "8", "--format", "yaml", "-o",
                 str(plan))
    assert res.exit_code == 0, res.output
    text = plan.read_text()
    plan.write_text(text.replace("  grad_dtype: float32", "  grad_dtype: [a]"))
    bad = invoke(runner, "validate", str(plan))
    assert bad.exit_code == 2 and "got ['a'] (at $.problem.grad_dtype)" in bad.output
    assert "Traceback" not in bad.output


def test_a_sweep_says_what_it_asked(runner):
    """Two sweeps that differ only in the gradients' dtype (or the ZeRO setting) could
    not be told apart: their JSON held the files, the objective and the rows."""
    args = ("sweep", str(NETWORKS / "alexnet.yaml"), CL, "-p", "8,16", "-b", "256",
            "--format", "json")
    plain = json.loads(invoke(runner, *args).stdout)["problem"]
    wide = json.loads(invoke(runner, *args, "--precision", "bf16", "--grad-precision", "fp32",
                             "--zero", "auto", "--zero-shard", "node").stdout)["problem"]
    assert (plain["dtype"], plain["grad_dtype"], plain["zero"]) == ("float32", "float32", 0)
    assert "zero_shard" not in plain and "gpus" not in plain
    assert (wide["dtype"], wide["grad_dtype"], wide["zero"], wide["zero_shard"]) == \
        ("bfloat16", "float32", "auto", "node")
