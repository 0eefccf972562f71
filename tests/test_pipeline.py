"""Gradient accumulation (``--microbatches``) and pipeline parallelism (``--pipeline``).

Each figure is derived by hand from the definitions in :mod:`planner.pipeline`: the
1F1B step is its order of passes simulated (worked by hand in
``tests/test_schedule_1f1b.py``; Narayanan et al., SC 2021, for the bubble
``(S − 1)/M`` of equal stages) plus the slowest stage's work after its last backward
pass, ``min(S − s, M)`` microbatches kept at stage ``s``
(Narayanan et al., ICML 2021), and a step of gradient accumulation ``(M − 1)`` plain
microbatches before the last one, whose backward pass reduces the gradients.
"""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as hst

from planner.cli_plan import Question, run_search
from planner.evaluate import Options, evaluate, local_elems, make_context
from planner.inputs import load_network_text
from planner.layout import make_layout
from planner.pipeline import (
    balance,
    cut_points,
    one_f_one_b_finish,
    p2p_seconds,
    search_pipeline,
    stage_network,
    stage_starts,
)
from planner.search import Space, Weights

from .conftest import CLUSTERS, NETWORKS, ROOT, invoke
from .helpers import FixedEstimator, cluster, mlp

SEQ, DIM = 64, 128


def _net(blocks: int = 2, tie: bool = True):
    """A token table, ``blocks`` pre-norm decoder blocks and a head (tied or not)."""
    return load_network_text(f"""
kind: network
name: pp
input: [{SEQ}]
dtype: bfloat16
layers:
  - {{name: wte, type: embedding, vocab: 512, dim: {DIM}}}
  - repeat: {blocks}
    name: blk
    layers:
      - name: attn
        type: residual
        body:
          - {{name: ln, type: rmsnorm}}
          - {{name: sa, type: attention, heads: 8, kv_heads: 2, causal: true, flash: true,
              bias: false}}
      - name: mlp
        type: residual
        body:
          - {{name: ln, type: rmsnorm}}
          - {{name: up, type: linear, out_features: 256, bias: false}}
          - {{name: act, type: gelu}}
          - {{name: down, type: linear, out_features: {DIM}, bias: false}}
  - {{name: head, type: linear, out_features: 512, bias: false{", tie: wte" if tie else ""}}}
""")


# -- stages ------------------------------------------------------------------------------

def test_cut_points_fall_between_residual_blocks():
    """A boundary inside a block would cut its shortcut (the add reads the block's
    input): only the starts of blocks and of the head remain."""
    net = _net()
    names = [net.layers[c].name for c in cut_points(net)]
    assert names == ["blk.0.attn.ln", "blk.0.mlp.ln", "blk.1.attn.ln", "blk.1.mlp.ln",
                     "head"]
    # an MLP may be cut anywhere; a plan's stages each start at a layer with weights,
    # the ReLU staying with the stage before
    net = mlp([8, 8, 8, 8])
    assert cut_points(net) == [1, 2, 3, 4]
    assert [net.layers[c].name for c in stage_starts(net)] == ["fc2", "fc3"]
    # a transformer's final norm stays with the last block, not alone before the head
    net = _net()
    assert [net.layers[c].name for c in stage_starts(net)] == [
        "blk.0.attn.ln", "blk.0.mlp.ln", "blk.1.attn.ln", "blk.1.mlp.ln", "head"]


def test_stages_between_layers_only():
    """``--stage-boundaries layers``: stages start between two copies of the network's
    repeat groups only (a transformer layer is a copy: its attention and MLP blocks), so
    the token table stays with the first copy and the head with the last. Each layer
    knows its copy (−1 outside), nested and unnamed groups by their outermost copy;
    a network without a repeat group has none."""
    net = _net(blocks=3)
    assert net.copies == tuple([-1] + [0] * 8 + [1] * 8 + [2] * 8 + [-1])
    layers = dataclasses.replace(net, stage_unit="layers")
    assert [net.layers[c].name for c in stage_starts(layers)] == ["blk.1.attn.ln",
                                                                  "blk.2.attn.ln"]
    nested = load_network_text("""
kind: network
input: [16]
layers:
  - {type: linear, out_features: 16}
  - repeat: 2
    layers:
      - repeat: 2
        layers:
          - {type: linear, out_features: 16}
      - {type: relu}
  - {type: linear, out_features: 4}
""")
    assert nested.copies == (-1, 0, 0, 0, 1, 1, 1, -1)
    assert [nested.layers[c].name for c in stage_starts(
        dataclasses.replace(nested, stage_unit="layers"))] == [nested.layers[4].name]
    assert mlp([8, 8, 8]).copies == (-1, -1, -1)


def test_stage_boundaries_on_the_command_line(runner, tmp_path):
    """GPT-2 small in 2 stages of 2 chunks: by layers the balanced chunks start at
    attention blocks (recorded as problem.pipeline.boundaries); in 2 stages of 1F1B,
    Megatron-LM's arguments can then be emitted (its first and last stages may
    differ). A network without repeat groups, or a start inside a layer, is a usage
    error; a training configuration compares the setting with its plan's."""
    gpt2 = "examples/networks/gpt2-small.yaml"
    args = ("cost", gpt2, "examples/clusters/dgx-h100.yaml", "-p", "16", "-b", "64",
            "--grid", "4x2", "--mode", "megatron", "--pipeline", "2", "--virtual-stages",
            "2", "--microbatches", "8", "--format", "yaml")
    doc = yaml.safe_load(invoke(runner, *args, "--stage-boundaries", "layers").stdout)
    assert doc["problem"]["pipeline"]["boundaries"] == "layers"
    starts = [st["layers"][0] for st in doc["pipeline"]["stage_plans"]]
    assert starts[0] == "wte" and all(s.endswith(".attn.ln_1") for s in starts[1:]), starts
    plain = yaml.safe_load(invoke(runner, *args).stdout)
    assert "boundaries" not in plain["problem"]["pipeline"]
    (tmp_path / "layers.yaml").write_text(yaml.safe_dump(doc))
    at = args.index("--virtual-stages")
    flat = [*args[:at], *args[at + 2:], "--stage-boundaries", "layers"]
    (tmp_path / "flat.yaml").write_text(invoke(runner, *flat).stdout)
    out = invoke(runner, "launch", tmp_path / "flat.yaml", "--emit", "megatron")
    assert out.exit_code == 0 and "--pipeline-model-parallel-size 2" in out.stdout
    bad = invoke(runner, "cost", "examples/networks/alexnet.yaml",
                 "examples/clusters/dgx-h100.yaml", "-p", "8", "-b", "64", "--pipeline",
                 "2", "--microbatches", "2", "--stage-boundaries", "layers")
    assert bad.exit_code == 2 and "has no repeat group" in bad.stderr
    inside = invoke(runner, *args[:-2], "--stage-boundaries", "layers", "--stage-starts",
                    "h.3.attn.ln_1,h.5.mlp.ln_2,h.9.attn.ln_1")
    assert inside.exit_code == 2 and "between copies of a repeat group" in inside.stderr
    (tmp_path / "blocks.yaml").write_text(yaml.safe_dump(plain))
    for plan, extra, code in (("layers.yaml", "stage_boundaries: layers\n", 0),
                              ("blocks.yaml", "stage_boundaries: layers\n", 1),
                              ("layers.yaml", "", 1)):
        cfg = tmp_path / "t.yaml"
        cfg.write_text(f"kind: training\nnetwork: {ROOT / gpt2}\ncluster: "
                       f"{ROOT / 'examples/clusters/dgx-h100.yaml'}\ngpus: 16\nbatch: 64\n"
                       f"microbatches: 8\npipeline: 2\nvirtual_stages: 2\n{extra}"
                       f"strategy: {{plan: {plan}}}\nmax_slowdown: 100\n")
        out = invoke(runner, "check", cfg)
        assert out.exit_code == code, out.output
        if code:
            assert "stage_boundaries=" in out.output


def test_every_stage_of_a_cnn_has_weights(runner):
    """AlexNet's pools and dropouts between its layers: no stage of them alone (a
    four-stage plan once gave one, and crashed)."""
    from planner.inputs import load_network

    net = load_network("examples/networks/alexnet.yaml")
    starts = stage_starts(net)
    assert all(net.layers[c].has_weights for c in starts)
    assert len(starts) == sum(layer.has_weights for layer in net.layers) - 1
    out = invoke(runner, "plan", "examples/networks/alexnet.yaml",
                 "examples/clusters/dgx-h100.yaml", "-p", "8", "-b", "128",
                 "--microbatches", "4", "--pipeline", "8", "--estimator", "roofline",
                 "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert len(doc["pipeline"]["stage_plans"]) == 8
    for s in range(8):
        assert any(r["stage"] == s and "follows" not in r for r in doc["layers"])


def test_stage_network_renumbers_unties_and_keeps_the_loss_last():
    net = _net()
    cuts = cut_points(net)
    lo = cuts[1]  # blk.0.mlp.ln
    first, last = stage_network(net, 0, lo), stage_network(net, lo, len(net.layers))
    assert [layer.index for layer in last.layers] == list(range(len(last.layers)))
    assert last.layers[0].inputs == (-1,)  # reads what the previous stage sent
    assert last.input_shape == net.layers[lo - 1].output_shape == (SEQ, DIM)
    assert last.input_kind == "sequence" and first.input_kind == net.input_kind
    # the blocks inside the stage, renumbered: blk.0.mlp reads the stage input
    assert [b.name for b in last.blocks] == ["blk.0.mlp", "blk.1.attn", "blk.1.mlp"]
    assert last.blocks[0].input == -1 and last.blocks[0].add == 4
    # the head tied to wte in another stage keeps its own copy: 512·128 parameters
    head = last.layers[-1]
    assert head.tied_to is None and head.linear.tied_to is None
    assert head.params == 512 * DIM
    assert first.params + last.params == net.params + 512 * DIM
    # the loss only where the network ends
    assert last.loss and not first.loss
    assert stage_network(net, 0, len(net.layers)).ties == net.ties


def test_a_stage_computes_its_inputs_gradient():
    """A stage after the first sends its input's gradient back, so its first layer runs
    its backward-data kernel although it reads the stage network's input; the
    network's own first layer does not. Found by the lower bounds of
    ``planner.bounds``: GPT-2's head alone in the last of 8 stages on 16 H100s (batch
    32) was planned at 58.7 ms, without its 26.0 ms ``dX = dY·W`` GEMM (84.6 ms with
    it; the step 336.7 ms, now 363.0)."""
    from planner.network import layer_kernels

    net = mlp([64, 32, 16], relu=False)  # fc1 reads the network input, fc2 fc1's output
    whole = {layer.name: layer for layer in net.layers}
    tail = stage_network(net, 1, 2).layers[0]
    head = stage_network(net, 0, 1).layers[0]
    assert tail.inputs == (-1,) and tail.stage_input and tail.input_grad
    assert head.inputs == (-1,) and not head.stage_input and not head.input_grad
    assert whole["fc2"].input_grad and not whole["fc1"].input_grad

    def dgrad(layer):
        return [(k.m, k.n, k.k) for k in layer_kernels(layer, 8, 4)["backward_data"]]

    # fc2: 8 samples, 32 → 16; its input's gradient dX (8 × 32) = dY (8 × 16) · W
    assert dgrad(tail) == dgrad(whole["fc2"]) == [(8, 32, 16)]
    assert dgrad(head) == dgrad(whole["fc1"]) == []


def _brute(weights, cuts, stages):
    n = len(weights)
    best = None
    for combo in itertools.combinations(cuts, stages - 1):
        bounds = [0, *combo, n]
        worst = max(sum(weights[a:b]) for a, b in itertools.pairwise(bounds))
        best = worst if best is None else min(best, worst)
    return best


@settings(max_examples=150, deadline=None)
@given(hst.lists(hst.floats(0.0, 10.0), min_size=2, max_size=9), hst.data())
def test_balance_finds_the_lightest_heaviest_stage(weights, data):
    n = len(weights)
    cuts = sorted(data.draw(hst.sets(hst.integers(1, n - 1), min_size=1)))
    stages = data.draw(hst.integers(1, len(cuts) + 1))
    got = balance(np.array(weights), cuts, stages)
    assert got is not None and len(got) == stages + 1
    assert got[0] == 0 and got[-1] == n and all(c in cuts for c in got[1:-1])
    assert got == sorted(set(got))
    worst = max(sum(weights[a:b]) for a, b in itertools.pairwise(got))
    assert worst <= _brute(weights, cuts, stages) * (1 + 1e-9) + 1e-12


def test_balance_refuses_more_stages_than_boundaries():
    assert balance(np.ones(4), [2], 3) is None


def test_p2p_between_stages_by_hand():
    """α + n/β over the tier the peers cross (the test cluster: NVLink 2 µs, 100 GB/s;
    network 5 µs, 10 GB/s; 8 devices a node)."""
    cl = cluster(per_node=8)
    n = 1e6
    assert p2p_seconds(cl, 0, 8, n) == pytest.approx(5e-6 + n / 10e9, rel=1e-12)
    assert p2p_seconds(cl, 0, 4, n) == pytest.approx(2e-6 + n / 100e9, rel=1e-12)
    assert p2p_seconds(cl, 4, 4, n) == pytest.approx(5e-6 + n / 10e9, rel=1e-12)
    assert p2p_seconds(cl, 0, 4, 0.0) == 0.0


# -- gradient accumulation ----------------------------------------------------------------

def _one_and_four_microbatches(zero=0):
    """An MLP, data parallel on 4 devices without overlap, priced at 8 samples in one
    microbatch and in each of four."""
    net = mlp([256, 512, 512, 256])
    cl = cluster(per_node=4)
    one = Options(gpus=4, batch=8, overlap="none", zero=zero)
    four = dataclasses.replace(one, microbatches=4)
    est = FixedEstimator(1e-5)
    assignment = {layer.index: make_layout("data", 1, 4) for layer in net.layers
                  if layer.has_weights}
    return (evaluate(make_context(net, cl, one, est), one, assignment),
            evaluate(make_context(net, cl, four, est), four, assignment))


def test_microbatches_add_plain_passes_before_the_last():
    """A step of M microbatches: M − 1 forward and backward passes without reductions,
    then the last as a step of one; memory is one microbatch's."""
    ev1, ev4 = _one_and_four_microbatches()
    # without overlap, one microbatch's step is its passes, its reductions, its update
    assert ev1.time_s == pytest.approx(ev1.microbatch_s + ev1.weight_grad_s
                                       + ev1.optimizer_s, rel=1e-12)
    assert ev4.microbatch_s == pytest.approx(ev1.microbatch_s, rel=1e-12)
    assert ev4.time_s == pytest.approx(ev1.time_s + 3 * ev1.microbatch_s, rel=1e-12)
    assert ev4.weight_grad_s == pytest.approx(ev1.weight_grad_s, rel=1e-12)
    assert ev4.memory.peak == pytest.approx(ev1.memory.peak, rel=1e-12)


@pytest.mark.parametrize("zero, reduced", [(0, 1), (1, 1), (2, 4), (3, 4)])
def test_sharded_gradients_are_reduced_every_microbatch(zero, reduced):
    """Under ZeRO 2 and 3 a device keeps only its shard of the gradients, so each
    microbatch reduce-scatters its own (DeepSpeed's micro-steps; FSDP outside no_sync):
    without overlap, each of the M − 1 microbatches before the last adds its passes and,
    with sharded gradients, its reductions; ZeRO 0 and 1 reduce once a step."""
    ev1, ev4 = _one_and_four_microbatches(zero)
    assert ev1.weight_grad_s > 0
    passes = ev1.forward_s + ev1.backward_s
    each = passes + (ev1.weight_grad_s if reduced > 1 else 0.0)
    assert ev4.time_s == pytest.approx(ev1.time_s + 3 * each, rel=1e-12)
    assert ev4.microbatch_s == pytest.approx(each if reduced > 1 else passes, rel=1e-12)
    assert ev4.comm_s == pytest.approx(ev1.comm_s + 3 * (ev1.comm_s - ev1.weight_grad_s
                                                          - _update_gathers(ev1))
                                       + (reduced - 1) * ev1.weight_grad_s, rel=1e-12)
    assert ev4.memory.peak == pytest.approx(ev1.memory.peak, rel=1e-12)


@pytest.mark.parametrize("zero, reduced", [(0, 1), (2, 4), (3, 4)])
def test_the_communication_splits_by_what_each_microbatch_repeats(zero, reduced):
    """The iteration's split of its communication over 4 microbatches: every
    microbatch's activation collectives (a model layout's all-gathers), the gradient
    reductions ``reduced`` times, ZeRO's gathers of the updated parameters once and
    stage 3's gathers every microbatch. The activation figure once read the total less
    one reduction, so under ZeRO 2 and 3 it counted three reductions as activations."""
    net = mlp([256, 512, 512, 256])
    opts = Options(gpus=4, batch=8, overlap="none", zero=zero, microbatches=4)
    est = FixedEstimator(1e-5)
    assignment = {layer.index: make_layout("model", 2, 2) for layer in net.layers
                  if layer.has_weights}
    ev = evaluate(make_context(net, cluster(per_node=4), opts, est), opts, assignment)
    terms = [t for r in ev.layers for t in r.cost.terms]
    acts = sum(t.seconds for t in terms if t.when in ("forward", "backward")
               and t.phase != "parameters")
    gathers = sum(t.seconds * (1 if t.when == "update" else 4) for t in terms
                  if t.phase == "parameters")
    assert acts > 0 and ev.reductions == reduced
    assert ev.activation_comm_s == pytest.approx(4 * acts, rel=1e-12)
    assert ev.parameters_s == pytest.approx(gathers, rel=1e-12)
    assert (gathers > 0) == (zero > 0)
    assert ev.comm_s == pytest.approx(ev.activation_comm_s + reduced * ev.weight_grad_s
                                      + ev.parameters_s, rel=1e-12)


def _update_gathers(ev):
    """The parameters' all-gathers after a ZeRO 1-2 step: once a step, whatever M."""
    return sum(t.seconds for r in ev.layers for t in r.cost.terms if t.when == "update")


def test_microbatches_in_flight_multiply_the_activations():
    net = _net(tie=False)
    cl = cluster(per_node=8)
    base = Options(gpus=8, batch=8, overlap="none")
    est = FixedEstimator(1e-5)
    ctx = make_context(net, cl, base, est)
    space = Space(ctx, base, {})
    assignment = {i: lays[0] for i, lays in space.candidates.items()}
    mems, scores = [], []
    for k in (1, 3, 5):
        opts = dataclasses.replace(base, inflight=k)
        ev = evaluate(make_context(net, cl, opts, est), opts, assignment)
        mems.append(ev.memory)
        scores.append(Space(make_context(net, cl, opts, est), opts, {}).score(
            assignment, Weights(0.0, 0.0, 0.0, 1.0)))
    assert mems[1].activations == pytest.approx(3 * mems[0].activations, rel=1e-12)
    assert mems[2].activations == pytest.approx(5 * mems[0].activations, rel=1e-12)
    assert mems[2].weights == mems[0].weights and mems[2].optimizer == mems[0].optimizer
    # the search's memory grows by the same kept bytes for each microbatch more
    assert scores[2] - scores[1] == pytest.approx(scores[1] - scores[0], rel=1e-9)
    assert scores[1] > scores[0]


# -- pipelines ----------------------------------------------------------------------------

def _question(net, p=8, batch=16, microbatches=4, per_node=4):
    cl = cluster(per_node=per_node)
    opts = Options(gpus=p, batch=batch // microbatches, microbatches=microbatches,
                   overlap="none")
    est = FixedEstimator(1e-5)
    return Question(net, cl, "net.yaml", "cluster.yaml", opts, make_context(net, cl, opts, est),
                    "fixed")


def _context(q):
    return lambda net, opts: make_context(net, q.cluster, opts, q.ctx.estimator)


def check_sends_and_tail(st, net, m):
    """A stage's (or chunk's) sends, the boundary activation on and its gradient back,
    each α + n/β over the nodes' network of the test cluster (none after the last
    layer); its own step (M − 1) plain microbatches, then one with its tail."""
    ev = st.evaluation
    if st.hi < len(net.layers):
        last = ev.layers[-1]
        nbytes = local_elems(last.layer.out_elems, last.dist_out, 4) * 2
        assert st.send_s == pytest.approx(2 * (5e-6 + nbytes / 10e9), rel=1e-12)
    else:
        assert st.send_s == 0.0
    assert st.tail_s == pytest.approx(ev.time_s - m * ev.microbatch_s, abs=1e-15)


def test_pipeline_step_composes_the_stage_times_by_hand():
    net = _net(blocks=4)
    q = _question(net)
    res = search_pipeline(q, 2, "time", (), run_search, _context(q))
    m, s = 4, 2
    assert [st.inflight for st in res.stages] == [min(s - k, m) for k in range(s)]
    assert [st.devices for st in res.stages] == [4, 4]
    assert [st.first_rank for st in res.stages] == [0, 4]
    assert res.stages[0].lo == 0 and res.stages[-1].hi == len(net.layers)
    assert res.stages[0].hi == res.stages[1].lo and res.stages[0].hi in cut_points(net)
    t = []
    for st in res.stages:
        # stage 0 on ranks 0-3 sends to ranks 4-7: the other node (4 a node)
        check_sends_and_tail(st, net, m)
        t.append(st.evaluation.microbatch_s + st.send_s)
        assert st.tail_s >= 0
    tails = max(st.tail_s for st in res.stages)
    # the tied head lives in the last stage: its gradient is all-reduced with wte's
    assert res.ties_s > 0
    # 1F1B's order simulated (tests/test_schedule_1f1b.py) from each stage's forward
    # pass (its forward and its activation's send) and the rest of its microbatch
    passes = [(st.evaluation.forward_s + st.send_s / 2,
               st.evaluation.microbatch_s + st.send_s / 2 - st.evaluation.forward_s)
              for st in res.stages]
    span = max(one_f_one_b_finish(passes, 2, 1, m))
    assert span >= sum(t) - 1e-15  # the first microbatch crosses both stages
    assert res.time_s == pytest.approx(span + tails + res.ties_s, rel=1e-12)
    assert res.bubble_s == pytest.approx(span - m * max(t), rel=1e-12)


def test_pipeline_stage_memory_keeps_its_microbatches_in_flight():
    net = _net(blocks=4, tie=False)
    q = _question(net, microbatches=8)
    res = search_pipeline(q, 2, "time", (), run_search, _context(q))
    assert res.ties_s == 0.0
    for st in res.stages:
        one = dataclasses.replace(st.question.options, inflight=1)
        ev1 = evaluate(make_context(st.question.network, q.cluster, one, q.ctx.estimator),
                       one, st.result.best.assignment)
        assert st.evaluation.memory.activations == pytest.approx(
            st.inflight * ev1.memory.activations, rel=1e-12)
    assert [st.inflight for st in res.stages] == [2, 1]


# -- the command line ---------------------------------------------------------------------

NET = """\
kind: network
name: tiny-lm
input: [64]
dtype: bfloat16
layers:
  - {name: wte, type: embedding, vocab: 512, dim: 128}
  - repeat: 4
    name: blk
    layers:
      - name: attn
        type: residual
        body:
          - {name: ln, type: rmsnorm}
          - {name: sa, type: attention, heads: 8, kv_heads: 2, causal: true, flash: true,
             bias: false}
      - name: mlp
        type: residual
        body:
          - {name: ln, type: rmsnorm}
          - {name: up, type: linear, out_features: 256, bias: false}
          - {name: act, type: gelu}
          - {name: down, type: linear, out_features: 128, bias: false}
  - {name: head, type: linear, out_features: 512, bias: false, tie: wte}
"""


@pytest.fixture
def files(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text(NET)
    return str(net), "examples/clusters/dgx-h100.yaml"


def test_pipeline_plan_document_and_launch(runner, files, tmp_path):
    net, cl = files
    args = ("plan", net, cl, "-p", "16", "-b", "32", "--microbatches", "8", "--pipeline",
            "2", "--estimator", "roofline", "--format", "yaml")
    first = invoke(runner, *args)
    assert first.exit_code == 0, first.output
    assert invoke(runner, *args).output == first.output  # byte-identical
    doc = yaml.safe_load(first.stdout)
    assert doc["problem"]["batch"] == 32 and doc["problem"]["microbatches"] == 8
    assert doc["problem"]["pipeline"] == {"stages": 2, "schedule": "1f1b"}
    pipe = doc["pipeline"]
    stages = pipe["stage_plans"]
    assert [s["ranks"] for s in stages] == [[0, 7], [8, 15]]
    assert [s["inflight"] for s in stages] == [2, 1]
    # every layer once, in order, each with its stage
    assert [r["name"] for r in doc["layers"]] == [
        layer.name for layer in load_network_text(NET).layers]
    assert [r["stage"] for r in doc["layers"]] == sorted(r["stage"] for r in doc["layers"])
    # the step from the stage records (rounded to 4 digits: within 1e-3)
    passes = [(s["passes_s"]["forward"], s["passes_s"]["backward"]) for s in stages]
    for s, (f, b) in zip(stages, passes, strict=True):
        assert f + b == pytest.approx(s["microbatch_s"], rel=1e-3)
    step = max(one_f_one_b_finish(passes, 2, 1, 8)) + max(s["tail_s"] for s in stages) \
        + pipe["tied_allreduce_s"]
    assert doc["iteration"]["time_s"] == pytest.approx(step, rel=1e-3)
    assert doc["iteration"]["samples_per_s"] == pytest.approx(
        32 / doc["iteration"]["time_s"], rel=1e-3)
    assert doc["baselines"][0]["name"] == "no pipeline"
    assert all(g["grid"][0] * g["grid"][1] == 8 for g in doc["placement"]["grids"])
    plan = tmp_path / "plan.yaml"
    plan.write_text(first.stdout)
    env = invoke(runner, "launch", str(plan), "--emit", "env")
    assert env.exit_code == 0, env.output
    assert "PLANNER_PIPELINE_STAGES=2" in env.output
    assert "PLANNER_MICROBATCHES=8" in env.output
    assert "# pipeline: 2 stages of 8 ranks" in env.output
    table = invoke(runner, *args[:-2])
    assert table.exit_code == 0 and "pipeline 2 stages, 8 microbatches" in table.output


def test_pipeline_auto_tries_every_stage_count(runner, files):
    net, cl = files
    out = invoke(runner, "plan", net, cl, "-p", "8", "-b", "16", "--microbatches", "4",
                 "--pipeline", "auto", "--estimator", "roofline", "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    trials = doc["pipeline_auto"]
    assert [t["stages"] for t in trials] == [1, 2, 4, 8]
    done = [t for t in trials if t["time_s"] is not None]
    assert doc["iteration"]["time_s"] == pytest.approx(min(t["time_s"] for t in done),
                                                       rel=1e-3)


def test_gradient_accumulation_on_the_command_line(runner, files):
    net, cl = files
    out = invoke(runner, "plan", net, cl, "-p", "8", "-b", "32", "--microbatches", "4",
                 "--estimator", "roofline", "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["problem"]["batch"] == 32 and doc["problem"]["microbatches"] == 4
    assert doc["iteration"]["samples_per_s"] == pytest.approx(
        32 / doc["iteration"]["time_s"], rel=1e-3)
    assert "pipeline" not in doc
    plain = json.loads(invoke(runner, "plan", net, cl, "-p", "8", "-b", "32", "--estimator",
                              "roofline", "--format", "json").stdout)
    assert "microbatches" not in plain["problem"]


@pytest.mark.parametrize("extra, words", [
    (("-b", "10", "--microbatches", "4"), "not a multiple of --microbatches 4"),
    (("-b", "16", "--pipeline", "3"), "does not divide the 8 devices"),
    (("-b", "16", "--pipeline", "0"), "number of stages"),
    (("-b", "16", "--pipeline", "two"), "number of stages"),
    (("-b", "16", "--pipeline", "2", "--objective", "comm"), "--objective time"),
    (("-b", "16", "--pipeline", "2", "--cost-model", "gholami2018"), "--cost-model exact"),
    (("-b", "16", "--microbatches", "2", "--cost-model", "gholami2018"),
     "--cost-model exact"),
])
def test_bad_pipeline_questions_exit_2(runner, files, extra, words):
    net, cl = files
    out = invoke(runner, "plan", net, cl, "-p", "8", *extra, "--estimator", "roofline")
    assert out.exit_code == 2, out.output
    assert words in out.output
    assert "Traceback" not in out.output


def test_more_stages_than_boundaries_exit_2(runner, tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text(NET.replace("repeat: 4", "repeat: 1"))
    out = invoke(runner, "plan", str(net), "examples/clusters/dgx-h100.yaml", "-p", "8",
                 "-b", "8", "--pipeline", "8", "--estimator", "roofline")
    assert out.exit_code == 2, out.output
    assert "at most 4 stages" in out.output


def test_microbatches_auto_takes_the_fastest_count(runner, files):
    net, cl = files
    args = ("plan", net, cl, "-p", "8", "-b", "32", "--microbatches", "auto",
            "--estimator", "roofline", "--format", "json")
    out = invoke(runner, *args)
    assert out.exit_code == 0, out.output
    assert invoke(runner, *args).output == out.output  # byte-identical
    doc = json.loads(out.stdout)
    trials = doc["microbatches_auto"]
    counts = [t["microbatches"] for t in trials]
    divisors = [1, 2, 4, 8, 16, 32]
    assert counts == divisors[:len(counts)]  # from 1 up, the divisors of the batch
    timed = [t for t in trials if t["time_s"] is not None]
    best = min(timed, key=lambda t: (t["time_s"], t["microbatches"]))
    assert doc["problem"].get("microbatches", 1) == best["microbatches"]
    assert doc["iteration"]["time_s"] == best["time_s"]
    if len(counts) < len(divisors):  # it stopped: the last three were slower than the best
        assert all(t["time_s"] > best["time_s"] for t in trials[-3:])
    # each count's time is the plan of that count on its own
    for t in timed[:2]:
        one = json.loads(invoke(runner, "plan", net, cl, "-p", "8", "-b", "32",
                                "--microbatches", str(t["microbatches"]),
                                "--estimator", "roofline", "--format", "json").stdout)
        assert one["iteration"]["time_s"] == t["time_s"]
    table = invoke(runner, *args[:-2])
    assert table.exit_code == 0 and "microbatches auto " in table.output


def test_microbatches_auto_with_pipeline_auto(runner, files):
    net, cl = files
    out = invoke(runner, "plan", net, cl, "-p", "8", "-b", "16", "--microbatches", "auto",
                 "--pipeline", "auto", "--estimator", "roofline", "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    trials = doc["microbatches_auto"]
    assert all("stages" in t for t in trials if t["time_s"] is not None)
    picked = min((t for t in trials if t["time_s"] is not None),
                 key=lambda t: (t["time_s"], t["microbatches"]))
    stages = (doc["problem"].get("pipeline") or {}).get("stages", 1)
    assert picked["stages"] == stages
    assert "pipeline_auto" in doc


@pytest.mark.parametrize("command, extra, words", [
    ("cost", (), "--microbatches auto is for `planner plan`"),
    ("plan", ("--objective", "comm"), "--microbatches auto plans for --objective time"),
    ("plan", ("--cost-model", "gholami2018"), "--cost-model exact"),
])
def test_microbatches_auto_refused_where_it_means_nothing(runner, files, command, extra,
                                                          words):
    net, cl = files
    out = invoke(runner, command, net, cl, "-p", "8", "-b", "16", "--microbatches", "auto",
                 *extra, "--estimator", "roofline")
    assert out.exit_code == 2, out.output
    assert words in out.output
    bad = invoke(runner, "plan", net, cl, "-p", "8", "-b", "16", "--microbatches", "x")
    assert bad.exit_code == 2 and "number of microbatches" in bad.output


def test_a_recompute_count_applies_to_each_stage(runner, files):
    """``--recompute N`` recomputes the first N residual blocks of each stage (chunk), as
    Megatron-LM's ``--recompute-num-layers`` does each pipeline stage's: all of them in a
    stage with fewer, none in the output head's stage alone (which once failed the whole
    plan, "the network has no residual blocks", after every stage before it was
    searched)."""
    from planner.pipeline import chunk_recompute

    assert [chunk_recompute(v, 4) for v in ("none", "0", "1", "4", "9", "blocks")] == [
        "none", "none", "1", "blocks", "blocks", "blocks"]
    assert chunk_recompute("2", 0) == chunk_recompute("blocks", 0) == "none"
    net, cl = files
    base = ["cost", net, cl, "-p", "16", "-b", "64", "--microbatches", "8", "--pipeline",
            "2", "--stage-starts", "head", "--estimator", "roofline", "--format", "json"]
    docs = {}
    for value in ("none", "1", "8"):
        out = invoke(runner, *base, "--recompute", value)
        assert out.exit_code == 0, out.output
        docs[value] = json.loads(out.stdout)["iteration"]
    assert docs["none"]["recompute_s"] == 0 < docs["1"]["recompute_s"] \
        < docs["8"]["recompute_s"]


@pytest.mark.parametrize("extra", [
    ("--schedule", "zb-h1"),
    ("--schedule", "zb-h1", "--recompute", "auto", "--zero", "auto"),
], ids=["zb-h1", "recompute-and-zero-auto"])
def test_identical_chunks_are_searched_once(runner, tmp_path, monkeypatch, extra):
    """Chunks that ask the same question (the same layers but for their names, devices
    and microbatches in flight: here the middle stages of 8 blocks in 8 stages under
    ZB-H1, which keeps as many microbatches on every stage) take the first one's answer,
    evaluated on their own layers: the plan is the one searching each gives, byte for
    byte but for the count of evaluations, which falls."""
    import planner.pipeline as pl

    net = tmp_path / "net.yaml"  # the test decoder, 8 blocks of width 1,024, 512 tokens
    net.write_text(NET.replace("repeat: 4", "repeat: 8").replace("dim: 128", "dim: 1024")
                   .replace("out_features: 256", "out_features: 4096")
                   .replace("out_features: 128,", "out_features: 1024,")
                   .replace("input: [64]", "input: [512]"))
    args = ("plan", net, "examples/clusters/dgx-h100.yaml", "-p", "16", "-b", "64",
            "--microbatches", "8", "--pipeline", "8", *extra, "--estimator", "roofline",
            "--format", "json")
    reused = json.loads(invoke(runner, *args).stdout)
    chunks = [tuple(s["layers"]) for s in reused["pipeline"]["stage_plans"]]
    # two of one question: stages that start half a block in (with --recompute auto and
    # --zero auto), or whole blocks (ZB-H1 alone, since the H100's catalog compute is its
    # measured 0.775: the balancing cuts where the times say)
    assert {("blk.2.mlp.ln", "blk.3.attn.add"), ("blk.5.mlp.ln", "blk.6.attn.add")} \
        <= set(chunks) or {("blk.2.attn.ln", "blk.2.mlp.add"),
                           ("blk.5.attn.ln", "blk.5.mlp.add")} <= set(chunks), chunks
    whole = pl._pipeline
    monkeypatch.setattr(pl, "_pipeline", lambda *a, **kw: whole(*a, **{**kw, "reuse": False}))
    searched = json.loads(invoke(runner, *args).stdout)
    assert reused["search"].pop("evaluated") < searched["search"].pop("evaluated")
    assert reused == searched


def test_exposed_communication_leaves_the_bubble_out(runner):
    """A pipelined plan's exposed communication is ``time − bubble − compute``, at most
    its ``comm_s``. GPT-2 in 2 stages of data parallel 4, 2 microbatches: the bubble (23.6
    ms) outgrows the 1.74 ms of gradient all-reduces, most of which backward hides; the
    figure read ``time − compute`` before and called all of it exposed (found by an
    audit). Here compute, exposed and bubble make the step (to the plan's 4 digits), and
    so they do where the stages' own communication is less than what is left: the rest
    is the tied weights' reductions between stages (``tied_allreduce_s``), which comm_s
    counts (it left them apart, and the step's figures fell short of its time: an
    audit)."""
    doc = json.loads(invoke(runner, "cost", "examples/networks/gpt2-small.yaml",
                            "examples/clusters/dgx-h100.yaml", "-p", "8", "-b", "16",
                            "--grid", "1x4", "--mode", "data", "--pipeline", "2",
                            "--microbatches", "2", "--format", "json").stdout)
    it = doc["iteration"]
    assert it["bubble_s"] > it["comm_s"] > 0
    assert it["exposed_comm_s"] < 0.8 * it["comm_s"]
    assert it["compute_s"] + it["exposed_comm_s"] + it["bubble_s"] == pytest.approx(
        it["time_s"], rel=5e-4)
    # 16 devices, 8 microbatches: what is left (3.96 ms) exceeds the stages' own
    # communication (3.0 ms); with the tied reductions (3.1 ms) comm_s holds it
    doc = json.loads(invoke(runner, "cost", "examples/networks/gpt2-small.yaml",
                            "examples/clusters/dgx-h100.yaml", "-p", "16", "-b", "64",
                            "--grid", "1x8", "--mode", "data", "--pipeline", "2",
                            "--microbatches", "8", "--format", "json").stdout)
    it, ties = doc["iteration"], doc["pipeline"]["tied_allreduce_s"]
    assert it["comm_s"] - ties < it["time_s"] - it["bubble_s"] - it["compute_s"]
    assert it["compute_s"] + it["exposed_comm_s"] + it["bubble_s"] == pytest.approx(
        it["time_s"], rel=5e-4)
    assert it["exposed_comm_s"] < it["comm_s"]


def test_a_stage_that_does_not_begin_a_node_is_priced_where_it_runs(runner):
    """GPT-2 in 4 stages of 3 GPUs on 8-GPU nodes: stage 2 runs on ranks 6-8, two on
    node 0 and one on node 1, and stage 1 on ranks 3-5 of node 0. Every stage holds
    three of the 12 blocks, so with the same data-parallel grid their gradient
    all-reduces differ only by where they run. They were priced alike (0.374 ms each:
    found by an audit), as if every stage began a node; now stage 2's crosses nodes,
    its plan document says so, and it takes more than twice stage 1's."""
    r = invoke(runner, "cost", ROOT / "examples/networks/gpt2-small.yaml",
               ROOT / "examples/clusters/dgx-h100.yaml", "-p", "12", "-b", "48",
               "--pipeline", "4", "--optimizer", "adam", "--grid", "1x3", "--mode", "data",
               "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    stages = doc["pipeline"]["stage_plans"]
    assert [s["ranks"] for s in stages] == [[0, 2], [3, 5], [6, 8], [9, 11]]
    cols = {g["stage"]: g["col_groups"] for g in doc["placement"]["grids"]}
    assert (cols[1]["per_node"], cols[1]["nodes"], cols[1]["spans_nodes"]) == (3, 1, False)
    assert (cols[2]["per_node"], cols[2]["nodes"], cols[2]["spans_nodes"]) == (1, 2, True)
    assert stages[2]["tail_s"] > 2 * stages[1]["tail_s"]


def test_flat_baselines_are_listed_where_nothing_fits_without_stages(runner):
    """Llama 3 70B on 256 H100s, 16 microbatches of 8, 4 stages: without stages nothing
    fits (attention's 8 key/value heads keep its weights whole), and the plan still lists
    the baselines priced on all devices, each applicable or with why not, where it
    listed only "nothing fits without a pipeline" (found by an audit): megatron-cp is
    priced and does not fit; Megatron-LM's tensor parallelism does not apply."""
    r = invoke(runner, "plan", ROOT / "examples" / "networks" / "llama3-70b.yaml",
               ROOT / "examples" / "clusters" / "dgx-h100.yaml", "-p", "256", "-b", "128",
               "--optimizer", "adam", "--microbatches", "16", "--pipeline", "4",
               "--format", "json")
    assert r.exit_code == 0, r.stderr
    base = {b["name"]: b for b in json.loads(r.stdout)["baselines"]}
    assert base["no pipeline"]["applicable"] is False
    assert {"data", "model", "single-grid", "gholami", "megatron", "megatron-sp",
            "megatron-cp"} <= set(base)
    cp = base["megatron-cp"]
    assert cp["applicable"] is True and cp["fits"] is False and cp["time_s"] > 0
    assert "P_r=32 does not divide its 8 key/value heads" in base["megatron-sp"]["reason"]


def _stage_rows(width: int) -> str:
    """The stage table of a two-stage plan whose layer names are as long as Llama's,
    rendered ``width`` columns wide the way the CLI renders it."""
    from rich.console import Console

    from planner.plan import pipeline_table
    from planner.tables import fit

    first = ("embed_tokens", "layers.5.mlp.add"), ("layers.6.attn.input_layernorm",
                                                   "lm_head")
    plans = [{"stage": s, "layers": list(names), "layer_count": 49 + s, "ranks": [32 * s,
              32 * s + 31], "inflight": 2 - s, "microbatch_s": 0.2624,
              "passes_s": {"forward": 0.08689, "input_grad": 0.1755}, "send_s": 0.005388,
              "tail_s": 0.02089, "peak_bytes": 76.82 * 2**30, "fits": True}
             for s, names in enumerate(first)]
    doc = {"pipeline": {"stages": 2, "microbatches": 8, "schedule": "1f1b",
                        "bubble_s": 1.025, "bubble_fraction": 0.228,
                        "tied_allreduce_s": 0.0, "stage_plans": plans}}
    console = Console(width=width, record=True)
    table = pipeline_table(doc)
    console.print(table, width=fit(console, table))
    return console.export_text()


def test_stage_table_keeps_layer_names_whole_where_the_console_is_narrow():
    """At 120 columns the stage table's layer names folded mid-name
    ('layers.6.attn.input_' / 'layernorm ..'); there the microbatch column, the sum of
    the F / B column's passes, gives way, and each name has a line of its own."""
    narrow = _stage_rows(120)
    lines = narrow.splitlines()
    head = next(line for line in lines if line.lstrip().startswith("stage "))
    assert "microbatch" not in head and "86.89 ms / 175.5 ms" in narrow
    for name in ("embed_tokens ..", "layers.5.mlp.add (49)",
                 "layers.6.attn.input_layernorm ..", "lm_head (50)"):
        assert any(name in line for line in lines), narrow
    assert max(len(line.rstrip()) for line in lines) <= 120
    wide = _stage_rows(160)  # room for everything: the microbatch's time too
    head = next(line for line in wide.splitlines() if line.lstrip().startswith("stage "))
    assert "microbatch" in head and "262.4 ms" in wide


def test_zero_auto_with_stages_is_one_setting_for_every_stage(runner, files, tmp_path):
    """``--zero auto`` with pipeline stages picks one ZeRO stage for the whole job (as
    Megatron-LM's distributed optimizer and DeepSpeed's ``zero_optimization.stage`` are
    one setting): the plan is the fastest of the plans given each stage, byte for byte
    but for the record of the choice, and ``problem.zero`` (what ``launch`` and ``check``
    read) says which. Each stage chose its own before, and the plan said ZeRO 0 while its
    stages used 1 (found by an audit)."""
    net, cl = files
    base = ("-p", "16", "-b", "32", "--microbatches", "8", "--pipeline", "2",
            "--estimator", "roofline", "--optimizer", "adam", "--format", "json")
    fixed = {}
    for z in range(4):
        out = invoke(runner, "plan", net, cl, *base, "--zero", str(z))
        assert out.exit_code == 0, out.output
        fixed[z] = json.loads(out.stdout)
    out = invoke(runner, "plan", net, cl, *base, "--zero", "auto")
    assert out.exit_code == 0, out.output
    auto = json.loads(out.stdout)
    times = {z: d["iteration"]["time_s"] for z, d in fixed.items()}
    want = min(times, key=lambda z: (times[z], z))
    assert auto["problem"]["zero"] == want == 1, times
    trials = {t["stage"]: t for t in auto.pop("zero_auto")}
    # stages 0, 1 and (prefetched) 3 searched; 2 keeps less than 1 at the same price
    assert [trials[z]["outcome"] for z in range(4)] == ["plan", "plan", "same as 1", "plan"]
    for z in (0, 1, 3):
        assert trials[z]["time_s"] == times[z]
    note = auto["search"]["notes"].pop()
    assert note.startswith("--zero auto chose stage 1 for every pipeline stage (searched: ")
    assert all("zero" not in s for s in auto["pipeline"]["stage_plans"])
    assert {k: v for k, v in auto.items() if k != "command"} == \
        {k: v for k, v in fixed[want].items() if k != "command"}
    plan = tmp_path / "plan.json"
    plan.write_text(out.stdout)
    env = invoke(runner, "launch", str(plan), "--emit", "env")
    assert env.exit_code == 0 and "PLANNER_ZERO=1\n" in env.output, env.output
    # cost: the one layout at every stage, the fastest that fits
    grid = ("--grid", "2x4")
    costs = {z: json.loads(invoke(runner, "cost", net, cl, *base, *grid, "--zero", str(z)
                                  ).stdout) for z in range(4)}
    cost = json.loads(invoke(runner, "cost", net, cl, *base, *grid, "--zero", "auto").stdout)
    priced = {t["stage"]: t for t in cost.pop("zero_auto")}
    assert all(priced[z]["outcome"] == "fits" and priced[z]["time_s"] ==
               costs[z]["iteration"]["time_s"] for z in range(4))
    pick = min(range(4), key=lambda z: (costs[z]["iteration"]["time_s"], z))
    assert cost["problem"]["zero"] == pick
    assert {k: v for k, v in cost.items() if k != "command"} == \
        {k: v for k, v in costs[pick].items() if k != "command"}


def test_a_pin_need_not_match_every_stage(runner):
    """A pin sets the layers it matches wherever they are: VGG-16's classifier (fc6-fc8)
    is in the last of 2 stages, and `plan --pipeline 2 --pin 'fc*=model:2x4'` exited 2,
    "matches no layer of 'vgg16[0:12]'", the first stage (found by an audit of the README,
    which said it plans it); a pin that matches no layer of the network still exits 2."""
    base = ("plan", NETWORKS / "vgg16.yaml", CLUSTERS / "dgx-h100.yaml", "-p", "16", "-b",
            "64", "--pipeline", "2", "--estimator", "roofline", "--format", "json")
    out = invoke(runner, *base, "--pin", "fc*=model:2x4")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    fcs = [r for r in doc["layers"] if r["name"] in ("fc6", "fc7", "fc8")]
    assert [(r["mode"], r["grid"], r["stage"]) for r in fcs] == [("model", [2, 4], 1)] * 3
    bad = invoke(runner, *base, "--pin", "zz*=model:2x4")
    assert bad.exit_code == 2
    assert "--pin 'zz*=model:2x4' matches no layer of 'vgg16'" in bad.stderr


def test_a_pins_grid_is_one_stages(runner, files):
    """With stages, a pin's grid is one stage's ``P/S`` devices (as ``cost --pipeline``
    reads it): 2x4 on 16 devices in 2 stages is planned, the plan without stages, whose
    devices are 16, not applicable and why; a grid of all 16 exits 2 naming the 8 a
    stage has. Before, the plan without stages was searched first with every pin and
    exited 2 on the stage-sized grid ("grid 2x4 has 8 devices but --gpus is 16"), and a
    16-device grid failed in a stage's search saying --gpus was 8 (found by an audit)."""
    net, cl = files
    base = ("plan", net, cl, "-p", "16", "-b", "32", "--microbatches", "8",
            "--estimator", "roofline", "--format", "json")
    pin = "blk.*.mlp.up=model:2x4"
    out = invoke(runner, *base, "--pipeline", "2", "--pin", pin)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    ups = [r for r in doc["layers"] if r["name"].endswith("mlp.up")]
    assert len(ups) == 4 and all(r["mode"] == "model" and r["grid"] == [2, 4]
                                 for r in ups), ups
    flat = doc["baselines"][0]
    assert flat["name"] == "no pipeline" and flat["applicable"] is False
    assert flat["reason"] == (f"--pin '{pin}' has a grid of 8 devices, and the plan "
                              "without stages has all 16")
    # auto: the counts the grid does not fit are not searched, and say why
    auto = json.loads(invoke(runner, *base, "--pipeline", "auto", "--pin", pin).stdout)
    assert auto["problem"]["pipeline"]["stages"] == 2
    assert [(t["stages"], t["outcome"]) for t in auto["pipeline_auto"]] == [
        (1, f"--pin '{pin}' has a grid of 8 devices, and the plan without stages has all 16"),
        (2, "plan"),
        (4, f"--pin '{pin}' has a grid of 8 devices, and a stage of 4 has 4"),
        (8, f"--pin '{pin}' has a grid of 8 devices, and a stage of 8 has 2")]
    for extra, words in (
            (("--pipeline", "2", "--pin", "blk.*.mlp.up=model:4x4"),
             "--pin 'blk.*.mlp.up=model:4x4': with --pipeline 2 a pin's grid is one "
             "stage's, 8 devices (--gpus 16 / --pipeline 2), not 16"),
            (("--pipeline", "auto", "--pin", "blk.*.mlp.up=model:3x1"),
             "no stage count gives a stage 3 of the 16 devices (P/S for S among 1, 2, 4, "
             "8)")):
        bad = invoke(runner, *base, *extra)
        assert bad.exit_code == 2, bad.output
        assert words in bad.output and "Traceback" not in bad.output


def test_tied_weights_reductions_are_in_the_pipelined_steps_communication(runner):
    """Found by an audit: GPT-2's tied embedding and head on stages 0 and 3 sum their
    gradients once a step (tied_allreduce_s), on the step's critical path, but comm_s
    left it out, so the step's time was more than its compute, bubble and communication
    together. It is in comm_s, and the step is its compute, bubble and exposed part."""
    r = invoke(runner, "plan", NETWORKS / "gpt2-small.yaml", CLUSTERS / "dgx-h100.yaml",
               "-p", "16", "-b", "32", "--pipeline", "4", "--microbatches", "8",
               "--optimizer", "adam", "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    it, ties = doc["iteration"], doc["pipeline"]["tied_allreduce_s"]
    assert ties > 0
    rest = it["time_s"] - it["compute_s"] - it["bubble_s"]
    # the document's 4 significant digits: half a unit of each of the four figures
    assert it["exposed_comm_s"] == pytest.approx(rest, abs=1.2e-5)  # 1 ms apart before
    assert it["comm_s"] >= rest and it["comm_s"] >= ties


def test_exposed_communication_has_no_rounding_residue(runner, tmp_path):
    """Where nothing waits for communication, a pipeline's exposed figure, a difference
    of sums (step less bubble less compute), is 0, not its rounding residue: a chain of
    eight linear layers in 4 stages of one device printed "exposed 1.084e-19 s" (an
    audit)."""
    net = tmp_path / "chain.yaml"
    net.write_text("kind: network\nname: chain\ninput: [4096]\ndtype: bfloat16\nlayers:\n"
                   + "".join(f"  - {{name: fc{i}, type: linear, out_features: 4096, "
                             "bias: false}\n" for i in range(8)))
    cl = tmp_path / "toy.yaml"
    cl.write_text("kind: cluster\nnodes: 16\ndevices_per_node: 8\ndevice: H100-SXM\n"
                  "network:\n  intra_node: {latency: 0 us, bandwidth: 100 GB/s}\n"
                  "  inter_node: {latency: 0 us, bandwidth: 10 GB/s}\n"
                  "collectives: {algorithm: ring}\nreserved_memory: 0 GiB\n")
    r = invoke(runner, "cost", net, cl, "-p", "4", "-b", "64",
               "--microbatches", "8", "--pipeline", "4", "--grid", "1x1", "--mode", "data",
               "--format", "json")
    assert r.exit_code == 0, r.stderr
    it = json.loads(r.stdout)["iteration"]
    assert it["comm_s"] > 0 and it["exposed_comm_s"] == 0.0
