"""The cost model is the truth: run one training step of the launch example on PyTorch
distributed (CPU, gloo, 4 and 8 processes) under plans from ``planner cost``, with and
without ZeRO, count the bytes every collective moves, and compare them with the plan, term
by term; check the updated weights against single-process training.

Needs the ``torch`` extra (the test extra installs ``torch==2.13.0``, the CPU build)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

from .conftest import CLUSTERS, EXAMPLES

MLP = EXAMPLES / "launch" / "mlp4.yaml"
#: the same MLP on a sequence of 8 tokens (sequence and context parallelism)
SEQ_MLP = EXAMPLES / "launch" / "mlp4-seq.yaml"
TRAIN = EXAMPLES / "launch" / "train.py"
BATCH = 32

CASES = {
    "1x4": (4, ["--grid", "1x4"]),
    "2x2": (4, ["--grid", "2x2", "--mode", "model"]),
    "4x1": (4, ["--grid", "4x1", "--mode", "model"]),
    "mixed4": (4, ["--pin", "fc1=data", "--pin", "fc2=model:2x2", "--pin", "fc3=model:4x1",
                   "--pin", "fc4=data"]),
    "2x4": (8, ["--grid", "2x4", "--mode", "model"]),
    "mixed8": (8, ["--pin", "fc1=data", "--pin", "fc2=model:2x4", "--pin", "fc3=model:8x1",
                   "--pin", "fc4=model:4x2"]),
    # ZeRO: gradients reduce-scattered, parameters gathered after the step (stage 1) or
    # before each forward and backward (stage 3)
    "1x4-zero1": (4, ["--grid", "1x4", "--zero", "1"]),
    "2x2-zero3": (4, ["--grid", "2x2", "--mode", "model", "--zero", "3"]),
    "mixed8-zero2": (8, ["--pin", "fc1=data", "--pin", "fc2=model:2x4", "--pin",
                         "fc3=model:8x1", "--pin", "fc4=model:4x2", "--zero", "2"]),
    "mixed8-zero3": (8, ["--pin", "fc1=data", "--pin", "fc2=model:2x4", "--pin",
                         "fc3=model:8x1", "--pin", "fc4=model:4x2", "--zero", "3"]),
    # gradients reduced in a dtype of their own (--grad-precision): every reduction
    # moves twice the bytes, the parameter gathers what they moved
    "2x2-grads64": (4, ["--grid", "2x2", "--mode", "model", "--grad-precision", "fp64"]),
    "mixed8-zero1-grads64": (8, ["--pin", "fc1=data", "--pin", "fc2=model:2x4", "--pin",
                                 "fc3=model:8x1", "--pin", "fc4=model:4x2", "--zero", "1",
                                 "--grad-precision", "fp64"]),
}


def _plan(tmp: Path, gpus: int, layout_args: list[str], cluster: Path | None = None,
          command: str = "cost", network: Path = MLP) -> Path:
    out = tmp / "plan.yaml"
    cmd = [sys.executable, "-m", "planner", command, str(network),
           str(cluster or CLUSTERS / "pcie-8gpu.yaml"),
           "-p", str(gpus), "-b", str(BATCH), "--optimizer", "sgd", "--overlap", "none",
           "--estimator", "roofline", "--format", "yaml", "-o", str(out), *layout_args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def _run(tmp: Path, gpus: int, plan: Path, network: Path = MLP) -> Path:
    out = tmp / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(gpus),
           "--master-port", str(29400 + gpus + (os.getpid() % 500)), str(TRAIN), "--plan",
           str(plan), "--network", str(network), "--device", "cpu", "--backend", "gloo",
           "--out", str(out), "--lr", "0.1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def _reference(lr: float = 0.1, network: Path = MLP) -> dict[str, dict[str, torch.Tensor]]:
    """The same step on one process (same seed and draws as the example)."""
    from planner import load_network

    net = load_network(network)
    g = torch.Generator().manual_seed(0)
    linears = [lay for lay in net.layers if lay.type == "linear"]
    ws = {lay.name: (torch.randn(lay.linear.out_features, lay.linear.in_features,
                                 generator=g) * 0.2).requires_grad_() for lay in linears}
    bs = {lay.name: (torch.randn(lay.linear.out_features, generator=g) * 0.1)
          .requires_grad_() for lay in linears}
    x = torch.randn(BATCH, *net.input_shape, generator=g)
    t = torch.randn(BATCH, *linears[-1].output_shape, generator=g)
    h = x
    for lay in net.layers:
        h = torch.relu(h) if lay.type == "relu" else h @ ws[lay.name].T + bs[lay.name]
    loss = ((h - t) ** 2).mean()
    loss.backward()
    return {name: {"weight": (ws[name] - lr * ws[name].grad).detach(),
                   "bias": (bs[name] - lr * bs[name].grad).detach()} for name in ws}


def _predicted(plan: Path) -> Counter:
    doc = yaml.safe_load(plan.read_text())
    got: Counter = Counter()
    for rec in doc["layers"]:
        for t in rec["comm"]["terms"]:
            note = t.get("note", "") if t["phase"] in ("redistribute", "parameters") else ""
            got[(rec["name"], t["phase"], t["collective"], int(t["bytes"]), t["group"],
                 note)] += 1
    return got


@pytest.fixture(scope="module")
def reference():
    return _reference()


@pytest.mark.parametrize("case", sorted(CASES))
def test_bytes_match_the_plan_and_weights_match_one_process(case, tmp_path, reference):
    gpus, args = CASES[case]
    plan = _plan(tmp_path, gpus, args)
    assert _predicted(plan), "the plan predicts some communication"
    _run_and_compare(tmp_path, gpus, plan, reference)


def _run_and_compare(tmp: Path, gpus: int, plan: Path, reference,
                     network: Path = MLP) -> None:
    """Run the plan; every rank's collectives are the plan's terms, and the updated
    weights one process's (to 1e-5)."""
    out = _run(tmp, gpus, plan, network)
    predicted = _predicted(plan)
    for rank in range(gpus):
        calls = json.loads((out / f"rank{rank}.json").read_text())
        # where a redistribution's group members need different rows the program runs
        # what the plan priced: an exchange (all_to_all) of the bytes the device lacks,
        # or an all-gather of the members' whole blocks
        measured = Counter((c["layer"], c["phase"], c["collective"], c["bytes"],
                            c["group"], c["note"]) for c in calls)
        assert measured == predicted, \
            f"rank {rank}: run only {measured - predicted}, planned only {predicted - measured}"
    weights = json.loads((out / "weights.json").read_text())
    for name, ref in reference.items():
        got_w = torch.tensor(weights[name]["weight"])
        got_b = torch.tensor(weights[name]["bias"])
        torch.testing.assert_close(got_w, ref["weight"], rtol=0, atol=1e-5)
        torch.testing.assert_close(got_b, ref["bias"], rtol=0, atol=1e-5)


@pytest.mark.parametrize(("gpus", "pins"), [
    (4, []),
    (8, ["--pin", "fc1=column:8x1", "--pin", "fc2=row:4x2", "--pin", "fc3=column:4x2",
         "--pin", "fc4=row:8x1"]),
])
def test_searched_plans_with_column_and_row_layouts(gpus, pins, tmp_path, reference):
    """Plans from ``planner plan``, which picks Megatron's column/row pairs for the MLP
    (4 processes: fc1 column 4x1, fc2 row 2x2 cols, ...; 8: pinned pairs on grids that
    differ, so activations move between feature and batch blocks: fc1's 8 feature blocks
    of the whole batch become fc2's 4 feature blocks of half the batch, fc3's output
    split by batch and features becomes fc4's 8 feature blocks of the whole batch): every
    collective is the plan's and the weights are one process's."""
    plan = _plan(tmp_path, gpus, pins, command="plan")
    modes = {rec["mode"] for rec in yaml.safe_load(plan.read_text())["layers"]}
    assert {"column", "row"} <= modes, modes
    _run_and_compare(tmp_path, gpus, plan, reference)


SEQ_CASES = {
    # no moves between them: the tokens split over the row group of 2 throughout
    "domain-sp-2x2": (4, ["--pin", "fc1=domain:2x2", "--pin", "fc2=column-sp:2x2", "--pin",
                          "fc3=row-sp:2x2", "--pin", "fc4=domain:2x2"]),
    # P_r = 4, P_c = 1: the batch whole on every rank
    "sp-4x1": (4, ["--pin", "fc1=column-sp:4x1", "--pin", "fc2=row-sp:4x1", "--pin",
                   "fc3=domain:4x1", "--pin", "fc4=domain:4x1"]),
    # fc4 (data) gathers fc3's tokens where the members hold other samples
    "sp-4x2-data": (8, ["--pin", "fc1=column-sp:4x2", "--pin", "fc2=row-sp:4x2", "--pin",
                        "fc3=domain:4x2", "--pin", "fc4=data"]),
}


@pytest.fixture(scope="module")
def seq_reference():
    return _reference(network=SEQ_MLP)


@pytest.mark.parametrize("case", sorted(SEQ_CASES))
def test_sequence_and_context_parallel_layouts(case, tmp_path, seq_reference):
    """The MLP on 8 tokens under Megatron-LM's sequence parallelism (column-sp: the
    tokens all-gathered forward and again backward, the input gradient reduce-scattered;
    row-sp: the output reduce-scattered by tokens, its gradient all-gathered, the bias's
    gradient all-reduced over the row group) and context parallelism (domain: each rank
    its own tokens, whole weights reduced over all ranks): every collective each rank
    calls is the plan's term, bytes and group, and the weights are one process's."""
    gpus, args = SEQ_CASES[case]
    plan = _plan(tmp_path, gpus, args, network=SEQ_MLP)
    kinds = {(k[2], k[4]) for k in _predicted(plan) if k[1] != "redistribute"}
    assert ("reduce_scatter", gpus // 2 if gpus == 8 else (4 if "4x1" in case else 2)) \
        in kinds
    assert ("all_reduce", gpus) in kinds  # domain: whole weights over all ranks
    _run_and_compare(tmp_path, gpus, plan, seq_reference, SEQ_MLP)


def _nodes(tmp: Path, nodes: int, per_node: int, latency: str) -> Path:
    """The PCIe box's cluster file split into ``nodes`` nodes of ``per_node``, joined by
    a 10 GB/s network with ``latency``."""
    path = tmp / f"{nodes}-nodes.yaml"
    path.write_text((CLUSTERS / "pcie-8gpu.yaml").read_text()
                    .replace("nodes: 1", f"nodes: {nodes}")
                    .replace("devices_per_node: 8", f"devices_per_node: {per_node}")
                    .replace("  intra_node:", f"  inter_node: {{latency: {latency}, "
                                              "bandwidth: 10 GB/s}\n  intra_node:"))
    return path


MIXED8 = ["--pin", "fc1=data", "--pin", "fc2=model:2x4", "--pin", "fc3=model:8x1", "--pin",
          "fc4=model:4x2"]


@pytest.mark.parametrize("zero", ["1", "3"])
def test_hybrid_sharding_matches_the_plan(zero, tmp_path, reference):
    """``--zero-shard node`` on two nodes of four (8 processes): fc1's column group (all
    8) shards over the 4 in each node, fc2's (4, two a node) over 2, fc4's (2, one a
    node) over none (an all-reduce across the nodes), fc3 has no replicas. Every rank's
    collectives are the plan's terms (hybrid reductions, gathers inside the node), and
    the weights are one process's."""
    cluster = _nodes(tmp_path, 2, 4, "5 us")
    plan = _plan(tmp_path, 8, [*MIXED8, "--zero", zero, "--zero-shard", "node"], cluster)
    predicted = _predicted(plan)
    kinds = {(k[0], k[2], k[4]) for k in predicted}
    assert ("fc1", "hybrid_reduce", 8) in kinds and ("fc4", "hybrid_reduce", 2) in kinds
    assert {k[4] for k in predicted if k[2] == "all_gather" and k[1] == "parameters"} \
        == {4, 2}
    _run_and_compare(tmp_path, 8, plan, reference)


def test_moves_across_nodes_run_as_priced(tmp_path, reference):
    """Four nodes of two (8 processes) with 100 µs between nodes: fc1 column 8x1 leaves
    its output split by features over all 8, and fc2 (data 1x8) needs a batch block with
    every feature. The 8 need different parts of one another's blocks: an exchange would
    send 6 messages across nodes, so the plan all-gathers the whole blocks (3 steps
    across nodes, the whole 4 kB activation) and each keeps its part. fc3 column 4x2 to
    fc4 data 1x8 does the same over groups of 4 (two nodes of 2). The program runs what
    the plan says: every collective is the plan's, and the weights are one process's."""
    cluster = _nodes(tmp_path, 4, 2, "100 us")
    plan = _plan(tmp_path, 8, ["--pin", "fc1=column:8x1", "--pin", "fc2=data", "--pin",
                               "fc3=column:4x2", "--pin", "fc4=data"], cluster)
    moves = {(k[0], k[2], k[3], k[4], k[5]) for k in _predicted(plan)
             if k[1] == "redistribute"}
    assert ("fc2", "all_gather", BATCH * 32 * 4, 8, "input (forward)") in moves
    assert ("fc4", "all_gather", BATCH // 2 * 32 * 4, 4, "input (forward)") in moves
    _run_and_compare(tmp_path, 8, plan, reference)


def test_uneven_feature_blocks_are_refused_by_name(tmp_path):
    """The planner prices a feature split that P_r does not divide by its busiest block
    (32 features on 3 devices: 11); the example holds equal blocks, and sliced
    ``features // P_r`` rows, dropping two of them and training another network with
    exit 0. It stops, naming the layer."""
    plan = _plan(tmp_path, 3, ["--pin", "fc1=model:3x1", "--pin", "*=data"])
    _refused(tmp_path, plan, 3, 29300 + (os.getpid() % 500),
             "fc1: 32 features do not split 3 ways; this example needs equal blocks")


def test_pipeline_plans_are_refused_by_name(tmp_path):
    """A plan in pipeline stages: the example runs none, and its ranks of stage 0
    trained the whole network on their own while stage 1's died in a device mesh that
    did not hold them (found by an audit). Every rank stops before any work, naming
    the stages."""
    plan = _plan(tmp_path, 4, ["--pipeline", "2"], command="plan")
    _refused(tmp_path, plan, 4, 29800 + (os.getpid() % 150),
             "this example runs no pipeline stages; the plan has 2 (make it without "
             "--pipeline)")


def _refused(tmp_path: Path, plan: Path, procs: int, port: int, message: str) -> None:
    """The example started on ``procs`` CPU processes stops with ``message``, nothing
    written."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs),
           "--master-port", str(port), str(TRAIN), "--plan", str(plan), "--network",
           str(MLP), "--device", "cpu", "--backend", "gloo", "--out", str(tmp_path / "run"),
           "--lr", "0.1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert not (tmp_path / "run").exists()
