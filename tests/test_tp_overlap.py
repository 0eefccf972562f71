"""Tensor-parallel communication overlap (``--tp-comm-overlap``): Megatron-LM's flag,
which runs Transformer Engine's userbuffers with their default method per GEMM
(``transformer_engine.pytorch.module.base.initialize_ub``: ``ring_exchange`` for the
all-gathers feeding qkv_fprop, fc1_fprop, proj_dgrad and fc2_dgrad, split ``tp_size``
ways on copy engines; ``pipeline`` for the reduce-scatters draining proj_fprop and
fc2_fprop, 4 splits on 16 SMs; ``bulk`` beside qkv/fc1 dgrad and wgrad, on 16 SMs).

The GEMMs here are timed at a round rate (``RATE`` FLOP/s, elementwise passes at
``RATE`` bytes/s) so that every exposed time is derived by hand from the formulas in
:func:`planner.costs.layer.overlap_tp`; the collectives' own seconds come from the
collective model, which ``test_costs_comm`` checks against its sources."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from planner.costs.comm import collective_time
from planner.costs.layer import TP_COMM_SMS, TP_PIPELINE_SPLITS, weighted_terms
from planner.evaluate import Options, evaluate, make_context
from planner.inputs import load_network_text
from planner.layout import make_layout
from planner.ops import Gemm

from .conftest import EXAMPLES, invoke
from .helpers import RateEstimator, cluster, solved

B = 16
SEQ, DIM, FFN, HEADS = 32, 64, 256, 4
SMS = 132  # H100 SXM5 (NVIDIA's datasheet; the catalog's sm_count)
SLOW = SMS / (SMS - TP_COMM_SMS)  # a GEMM on the SMs the collective leaves


def _net():
    """A pre-norm transformer block on 32 tokens of width 64 (fp32)."""
    return load_network_text(f"""
kind: network
name: block
input: [{SEQ}, {DIM}]
dtype: float32
layers:
  - {{name: ln0, type: rmsnorm}}
  - name: attn
    type: residual
    body:
      - {{name: ln, type: rmsnorm}}
      - {{name: attn, type: attention, heads: {HEADS}, causal: true, bias: false}}
  - name: mlp
    type: residual
    body:
      - {{name: ln, type: rmsnorm}}
      - {{name: up, type: linear, out_features: {FFN}, bias: false}}
      - {{name: act, type: gelu}}
      - {{name: down, type: linear, out_features: {DIM}, bias: false}}
""")


def _ctx(rate, per_node=8, overlap=True, **kw):
    net = _net()
    opts = Options(gpus=8, batch=B, overlap="none", tp_comm_overlap=overlap, **kw)
    return net, make_context(net, cluster(per_node=per_node), opts, RateEstimator(rate)), opts


def _by_note(terms):
    return {(t.phase, t.collective, t.note): t for t in terms}


def _ring(gemm: float, comm: float, n: int = 4) -> float:
    """A ring of ``n``: ``c + (n − 1)·max(c, S/(n − 1)) − C`` with ``c = C/n`` (a GEMM's
    FLOPs are linear in its rows at a fixed rate), never below 0."""
    return max(0.0, gemm / n + (n - 1) * max(gemm / n, comm / (n - 1)) - gemm)


def _pipeline(gemm: float, term, ctx) -> float:
    """The pipelined reduce-scatter: 4 chunks of ``c' = C/4 · 132/116``, each
    reduce-scattered (``s``: a quarter of the bytes): ``c' + 3·max(c', s) + s − C``."""
    k = TP_PIPELINE_SPLITS
    s = float(collective_time("reduce_scatter", np.array([term.bytes / k]), term.group,
                              ctx.cluster, None)[0][0])
    c = gemm / k * SLOW
    return c + (k - 1) * max(c, s) + s - gemm


def _bulk(gemm: float, comm: float) -> float:
    """Side by side on 116 of 132 SMs: ``max(C·132/116, S) − C``."""
    return max(gemm * SLOW, comm) - gemm


# 4x2: the row group (tensor parallelism) 4 devices of one node, 8 samples a column group,
# 8·32 = 256 tokens gathered
PR, TOKENS = 4, 8 * SEQ
UP, DOWN = Gemm(TOKENS, FFN // PR, DIM), Gemm(TOKENS, DIM, FFN // PR)


def test_column_ring_and_bulk_by_hand():
    """``up`` (column-sp, 64 → 256 over P_r = 4): forward, the input's all-gather
    against its GEMM ``C`` in 4 chunks ``c = C/4`` (a GEMM's FLOPs are linear in its rows
    at a fixed rate): ``c + 3·max(c, S/3) − C``, 0 when compute covers it (slow rate),
    ``S − 3c`` when the ring does (fast rate). Backward, the input's second all-gather
    beside the input gradient's GEMM and the input gradient's reduce-scatter beside the
    weight gradient's, each on 116 of 132 SMs: ``max(C·132/116, S) − C``."""
    for rate in (1e9, 1e14):
        net, ctx, _ = _ctx(rate)
        up = net.by_name("mlp.up")
        t = _by_note(weighted_terms(up, make_layout("column-sp", PR, 2), ctx))
        c_f = 2.0 * TOKENS * (FFN // PR) * DIM / rate  # fprop, dgrad and wgrad alike
        ag = t[("forward", "all_gather", "tokens")]
        assert ag.exposed_s == pytest.approx(_ring(c_f, ag.seconds), rel=1e-12, abs=1e-18)
        for key in (("backward_data", "all_gather", "tokens again"),
                    ("backward_data", "reduce_scatter", "tokens")):
            assert t[key].exposed_s == pytest.approx(_bulk(c_f, t[key].seconds), rel=1e-12)
        if rate == 1e9:  # compute-bound: the ring hides all; the bulk pays the SMs
            assert ag.exposed_s == 0.0
            assert t[key].exposed_s == pytest.approx(c_f * (SLOW - 1), rel=1e-12)
        else:  # communication-bound: the ring pays what its first chunk cannot cover
            assert ag.exposed_s == pytest.approx(ag.seconds - 3 * c_f / 4, rel=1e-12)
            assert t[key].exposed_s == pytest.approx(t[key].seconds - c_f, rel=1e-12)


def test_row_pipeline_and_ring_by_hand():
    """``down`` (row-sp, 256 → 64): forward, the output's reduce-scatter drains its
    GEMM in 4 chunks, each on the SMs the collective leaves (``c' = C/4 · 132/116``),
    each chunk reduce-scattered (``s``: a quarter of the bytes) while the next is
    computed: ``c' + 3·max(c', s) + s − C``; backward, the output gradient's all-gather
    feeds the input gradient's GEMM as a ring (as ``up``'s forward)."""
    for rate in (1e9, 1e14):
        net, ctx, _ = _ctx(rate)
        down = net.by_name("mlp.down")
        layout = make_layout("row-sp", PR, 2)
        t = _by_note(weighted_terms(down, layout, ctx))
        big = 2.0 * TOKENS * DIM * (FFN // PR) / rate
        rs = t[("forward", "reduce_scatter", "tokens")]
        assert rs.exposed_s == pytest.approx(_pipeline(big, rs, ctx), rel=1e-12)
        ag = t[("backward_data", "all_gather", "tokens")]
        assert ag.exposed_s == pytest.approx(_ring(big, ag.seconds), rel=1e-12, abs=1e-18)


def test_attention_pairs_each_collective_with_its_projection():
    """Attention (model-sp): the input's all-gather feeds the QKV projection, the
    output's reduce-scatter drains the output projection, the output gradient's
    all-gather feeds the output projection's input gradient, and the backward bulk
    collectives sit beside the QKV projection's input and weight gradients. With four
    heads of 16 over 4 devices each device projects ``(1 + 2)·16 = 48`` of QKV and
    takes 16 features into the output projection."""
    rate = 1e9
    net, ctx, _ = _ctx(rate)
    attn = net.by_name("attn.attn")
    t = _by_note(weighted_terms(attn, make_layout("model-sp", PR, 2), ctx))
    qkv = 2.0 * TOKENS * 3 * (DIM // HEADS) * DIM / rate  # fprop, dgrad, wgrad alike
    proj = 2.0 * TOKENS * DIM * (DIM // HEADS) / rate
    ag = t[("forward", "all_gather", "tokens")]
    assert ag.exposed_s == pytest.approx(_ring(qkv, ag.seconds), rel=1e-12, abs=1e-18)
    rs = t[("forward", "reduce_scatter", "tokens")]
    assert rs.exposed_s == pytest.approx(_pipeline(proj, rs, ctx), rel=1e-12)
    bag = t[("backward_data", "all_gather", "tokens")]
    assert bag.exposed_s == pytest.approx(_ring(proj, bag.seconds), rel=1e-12, abs=1e-18)
    for key in (("backward_data", "all_gather", "tokens again"),
                ("backward_data", "reduce_scatter", "tokens")):
        assert t[key].exposed_s == pytest.approx(_bulk(qkv, t[key].seconds), rel=1e-12)


def test_where_nothing_overlaps():
    """No overlap: without the flag; a tensor-parallel group across nodes (2 GPUs a
    node, P_r = 4: userbuffers overlap within a node); a layout without sequence
    parallelism; and, where the weight gradients are deferred (ZB-H1's W pass), the
    input gradient's reduce-scatter, whose partner GEMM has left the backward pass."""
    rate = 1e9
    net, off, _ = _ctx(rate, overlap=False)
    up = net.by_name("mlp.up")
    assert all(t.exposed_s is None for t in weighted_terms(up, make_layout("column-sp", 4, 2),
                                                           off))
    _, spans, _ = _ctx(rate, per_node=2)
    assert all(t.exposed_s is None for t in weighted_terms(up, make_layout("column-sp", 4, 2),
                                                           spans))
    _, on, _ = _ctx(rate)
    assert all(t.exposed_s is None for t in weighted_terms(up, make_layout("column", 4, 2),
                                                           on))
    _, zb, _ = _ctx(rate, wgrad_deferred=True)
    t = _by_note(weighted_terms(up, make_layout("column-sp", 4, 2), zb))
    assert t[("backward_data", "reduce_scatter", "tokens")].exposed_s is None
    assert t[("backward_data", "all_gather", "tokens again")].exposed_s is not None


def test_recomputed_forward_overlaps_again():
    """A recomputed block runs its forward GEMMs again, chunked as before: the
    re-run's collectives expose what the forward's did."""
    net, ctx, _ = _ctx(1e9, recompute="blocks")
    t = weighted_terms(net.by_name("mlp.up"), make_layout("column-sp", PR, 2), ctx)
    fwd = _by_note(t)[("forward", "all_gather", "tokens")]
    again = [x for x in t if x.phase == "recompute"]
    assert len(again) == 1 and again[0].exposed_s == fwd.exposed_s


def _megatron(net):
    return {net.by_name("attn.attn").index: make_layout("model-sp", PR, 2),
            net.by_name("mlp.up").index: make_layout("column-sp", PR, 2),
            net.by_name("mlp.down").index: make_layout("row-sp", PR, 2)}


@pytest.mark.parametrize("rate", [1e9, 1e12, 1e14])
def test_the_timeline_pays_what_is_exposed(rate):
    """With the gradients' reductions after the backward pass (``overlap: none``) the
    iteration is a sum: with the overlap it is the time without, less every critical
    collective's hidden seconds (``seconds − exposed_s``, which is negative where
    chunking costs more than it hides); the traffic (``comm_s``) is the same."""
    net, on, opts_on = _ctx(rate)
    _, off, opts_off = _ctx(rate, overlap=False)
    a = evaluate(on, opts_on, _megatron(net))
    b = evaluate(off, opts_off, _megatron(net))
    hidden = sum(t.seconds - t.exposed_s for r in a.layers for t in r.cost.terms
                 if t.exposed_s is not None)
    assert hidden != 0.0
    assert a.time_s == pytest.approx(b.time_s - hidden, rel=1e-12)
    assert a.comm_s == pytest.approx(b.comm_s, rel=1e-12)
    assert a.compute_s == pytest.approx(b.compute_s, rel=1e-12)


@pytest.mark.parametrize("rate", [1e9, 1e14])
def test_program_equals_evaluation(rate):
    """The search weighs what the timeline pays: the dynamic program's value is the
    evaluation of its answer (to 1e-12), the split layers held to sequence-parallel
    layouts on 2, 4 or 8 devices (the program picks among them)."""
    net = _net()
    opts = Options(gpus=8, batch=B, overlap="none", tp_comm_overlap=True)
    ctx = make_context(net, cluster(), opts, RateEstimator(rate))
    pins = {net.by_name(name).index: [make_layout(mode, pr, 8 // pr) for pr in (2, 4, 8)]
            for name, mode in (("attn.attn", "model-sp"), ("mlp.up", "column-sp"),
                               ("mlp.down", "row-sp"))}
    value, _, ev = solved(ctx, opts, pins)
    assert value == pytest.approx(ev.time_s, rel=1e-12)
    assert any(t.exposed_s is not None for r in ev.layers for t in r.cost.terms)


LLAMA = EXAMPLES / "networks" / "llama3-8b.yaml"
DGX = EXAMPLES / "clusters" / "dgx-h100.yaml"
COST = ("cost", LLAMA, DGX, "-p", "16", "-b", "16", "--grid", "8x2", "--mode", "megatron-sp",
        "--optimizer", "adam", "--zero", "1", "--format", "json")


def test_cli_records_and_prices_it(runner, tmp_path):
    """``cost --tp-comm-overlap`` records ``problem.tp_comm_overlap: true`` and each
    overlapped term's ``exposed_s``; Llama 3 8B at TP 8 on a DGX H100 is faster with it
    and moves the same bytes. Without the flag nothing is recorded (plans made before it
    read the same). The paper's accounting has no sequence parallelism: exit 2."""
    plain = json.loads(invoke(runner, *COST).stdout)
    over = json.loads(invoke(runner, *COST, "--tp-comm-overlap").stdout)
    assert "tp_comm_overlap" not in plain["problem"]
    assert over["problem"]["tp_comm_overlap"] is True
    assert over["iteration"]["time_s"] < plain["iteration"]["time_s"]
    assert over["iteration"]["comm_s"] == plain["iteration"]["comm_s"]
    exposed = [t for lay in over["layers"] for t in lay["comm"]["terms"] if "exposed_s" in t]
    assert {t["note"] for t in exposed} == {"tokens", "tokens again"}
    assert not any("exposed_s" in t for lay in plain["layers"] for t in lay["comm"]["terms"])
    bad = invoke(runner, *COST[:-2], "--tp-comm-overlap", "--cost-model", "gholami2018")
    assert bad.exit_code == 2 and "--tp-comm-overlap needs --cost-model exact" in bad.stderr
    table = invoke(runner, *COST[:-2], "--tp-comm-overlap").stdout
    assert "overlap gradients and tensor-parallel" in table


def _training(tmp_path, extra: str, strategy: str = "{grid: 8x2, mode: megatron-sp}"):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(f"kind: training\nnetwork: {LLAMA}\ncluster: {DGX}\ngpus: 16\nbatch: 16\n"
                   f"optimizer: adam\nzero: 1\n{extra}strategy: {strategy}\n"
                   "max_slowdown: 100\n")
    return cfg


def test_training_configuration_and_launch(runner, tmp_path):
    """A training configuration says ``tp_comm_overlap: true``; a plan made without it
    does not match it (``check`` names the key), one made with it does, and ``launch``
    passes it on. A value that is not a boolean is an input error at its line and
    column (exit 2), and so is asking for it under the paper's accounting."""
    (tmp_path / "with.yaml").write_text(invoke(runner, *COST[:-2], "--tp-comm-overlap",
                                               "--format", "yaml").stdout)
    (tmp_path / "without.yaml").write_text(invoke(runner, *COST[:-2], "--format",
                                                  "yaml").stdout)
    ok = invoke(runner, "check", _training(tmp_path, "tp_comm_overlap: true\n",
                                           "{plan: with.yaml}"))
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    stale = invoke(runner, "check", _training(tmp_path, "tp_comm_overlap: true\n",
                                              "{plan: without.yaml}"))
    assert stale.exit_code == 1
    assert "the plan is for tp_comm_overlap=false, the configuration says true" in stale.stdout
    grid = invoke(runner, "check", _training(tmp_path, "tp_comm_overlap: true\n"))
    assert grid.exit_code == 0, grid.stdout + grid.stderr
    wrong = invoke(runner, "check", _training(tmp_path, "tp_comm_overlap: sometimes\n"))
    assert wrong.exit_code == 2 and "t.yaml:8:18" in wrong.stderr, wrong.stderr
    paper = invoke(runner, "check", _training(
        tmp_path, "tp_comm_overlap: true\ncost_model: gholami2018\n"))
    assert paper.exit_code == 2 and "t.yaml:8" in paper.stderr, paper.stderr
    env = invoke(runner, "launch", tmp_path / "with.yaml", "--emit", "env").stdout
    assert "PLANNER_TP_COMM_OVERLAP=1" in env and "--tp-comm-overlap" in env
    assert "TP_COMM" not in invoke(runner, "launch", tmp_path / "without.yaml", "--emit",
                                   "env").stdout
    doc = yaml.safe_load((tmp_path / "with.yaml").read_text())
    doc["problem"]["tp_comm_overlap"] = "yes"
    (tmp_path / "edited.yaml").write_text(yaml.safe_dump(doc))
    edited = invoke(runner, "launch", tmp_path / "edited.yaml", "--emit", "env")
    assert edited.exit_code == 2 and "tp_comm_overlap" in edited.stderr


def test_a_note_names_what_cannot_overlap(runner, tmp_path):
    """Tensor parallelism over 8 devices of 4-GPU nodes (the DGX H100's network with half
    its GPUs a node; Llama 3's 8 key/value heads allow no more than 8): the flag changes
    nothing, and standard error says so (exit 0, the plan unchanged); within a node, no
    note."""
    half = tmp_path / "dgx-4.yaml"
    half.write_text(DGX.read_text().replace("devices_per_node: 8", "devices_per_node: 4"))
    args = ("cost", LLAMA, half, "-p", "32", "-b", "32", "--grid", "8x4", "--mode",
            "megatron-sp", "--optimizer", "adam", "--format", "json")
    across = invoke(runner, *args, "--tp-comm-overlap")
    assert across.exit_code == 0
    assert "97 sequence-parallel layers ('layers.0.attn.self_attn', ...) split over " \
        "devices of more than one node" in across.stderr
    without = json.loads(invoke(runner, *args).stdout)
    assert json.loads(across.stdout)["iteration"] == without["iteration"]
    inside = invoke(runner, *COST, "--tp-comm-overlap")
    assert inside.exit_code == 0 and "--tp-comm-overlap:" not in inside.stderr
    # under ZB-H1 the input gradient's reduce-scatter waits (its partner is deferred):
    # not for want of a node, so no note
    zb = invoke(runner, "cost", LLAMA, DGX, "-p", "16", "-b", "16", "--optimizer", "adam",
                "--pipeline", "2", "--microbatches", "4", "--schedule", "zb-h1", "--grid",
                "8x1", "--mode", "megatron-sp", "--tp-comm-overlap", "--format", "json")
    assert zb.exit_code == 0 and "--tp-comm-overlap:" not in zb.stderr
    up = next(lay for lay in json.loads(zb.stdout)["layers"]
              if lay["name"].endswith("gate_up_proj"))
    waits = [t for t in up["comm"]["terms"] if t.get("note") == "tokens"
             and t["collective"] == "reduce_scatter"]
    assert len(waits) == 1 and "exposed_s" not in waits[0]
