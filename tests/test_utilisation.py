"""Model FLOPs utilisation (MFU) in plan documents, sweeps and tables, by hand.

MFU (Chowdhery et al., "PaLM", 2022, Appendix B) is the rate of the FLOPs the network
needs, three times its forward FLOPs a sample, over the device's dense peak. The peaks
are the device catalog's (NVIDIA H100 datasheet, SXM5: 989.4 TFLOP/s in bf16, 66.9 in
fp32). Plan documents round floats to 4 significant digits, hence ``rel=1e-3``.
"""

from __future__ import annotations

import json

import pytest

from planner.cluster import lookup_device
from planner.plan import utilisation

from .conftest import CLUSTERS, NETWORKS, invoke
from .helpers import mlp
from .test_pipeline import NET

CL = str(CLUSTERS / "dgx-h100.yaml")
#: a two-layer MLP of 1024 → 4096 → 1024 features, no biases, no activation: forward
#: FLOPs a sample 2·1024·4096 + 2·4096·1024 = 16,777,216
MLP = """kind: network
name: mlp
input: [1024]
dtype: bfloat16
layers:
  - {name: fc1, type: linear, out_features: 4096, bias: false}
  - {name: fc2, type: linear, out_features: 1024, bias: false}
"""


def test_utilisation_by_hand():
    net = mlp([1024, 4096, 1024], bias=False, dtype="bfloat16", relu=False)
    assert net.flops == 16_777_216
    h100 = lookup_device("H100-SXM")
    # batch 64 on 8 devices in 1 µs: 3·16,777,216·64 = 3,221,225,472 FLOPs a step,
    # 3.221e15 FLOP/s / 8 = 402.65 TFLOP/s a device, 402.65 / 989.4 = 40.70% of the bf16
    # peak
    use = utilisation(net, h100, 8, 64, 1e-6)
    assert use["model_flops"] == 3_221_225_472
    assert use["tflops_per_device"] == pytest.approx(402.653184, rel=1e-9)
    assert use["mfu"] == pytest.approx(402.653184 / 989.4, rel=1e-9)
    # an fp32 network against the fp32 peak (66.9 TFLOP/s)
    f32 = mlp([1024, 4096, 1024], bias=False, dtype="float32", relu=False)
    assert utilisation(f32, h100, 8, 64, 1e-6)["mfu"] == pytest.approx(402.653184 / 66.9,
                                                                      rel=1e-9)
    assert utilisation(net, h100, 8, 64, 0.0)["mfu"] == 0.0  # no time, no rate


def test_plan_and_cost_documents_carry_it(runner, tmp_path):
    path = tmp_path / "mlp.yaml"
    path.write_text(MLP)
    for command in ("plan", "cost"):
        out = invoke(runner, command, path, CL, "-p", "8", "-b", "64", "--format", "json")
        assert out.exit_code == 0, out.output
        it = json.loads(out.stdout)["iteration"]
        assert it["model_flops"] == 3_221_225_472
        rate = 3_221_225_472 / it["time_s"] / 8
        assert it["tflops_per_device"] == pytest.approx(rate / 1e12, rel=1e-3)
        assert it["mfu"] == pytest.approx(rate / 989.4e12, rel=1e-3)
        table = invoke(runner, command, path, CL, "-p", "8", "-b", "64")
        assert f"MFU {it['mfu']:.1%}" in table.output.replace("\n", " ")


def test_a_pipeline_counts_every_device_and_the_whole_step(runner, tmp_path):
    """Under a pipeline the step is all microbatches on all ``P`` devices, not one
    stage's ``P/S``: 2 stages of 8 devices, 8 microbatches of 4 sequences."""
    path = tmp_path / "net.yaml"
    path.write_text(NET)
    show = json.loads(invoke(runner, "show", path, "--format", "json").stdout)
    forward = sum(layer["flops_forward"] for layer in show["layers"])
    out = invoke(runner, "plan", path, CL, "-p", "16", "-b", "32", "--microbatches", "8",
                 "--pipeline", "2", "--estimator", "roofline", "--format", "json")
    assert out.exit_code == 0, out.output
    it = json.loads(out.stdout)["iteration"]
    assert it["model_flops"] == 3 * forward * 32
    assert it["tflops_per_device"] == pytest.approx(
        3 * forward * 32 / it["time_s"] / 16 / 1e12, rel=1e-3)


def test_sweep_rows_carry_it(runner, tmp_path):
    path = tmp_path / "mlp.yaml"
    path.write_text(MLP)
    out = invoke(runner, "sweep", path, CL, "-p", "8,16", "-b", "64", "--format", "json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["results"]
    for r in rows:
        assert r["mfu"] == pytest.approx(3_221_225_472 / r["time_s"] / r["gpus"] / 989.4e12,
                                         rel=1e-3)


def test_llama3_405b():
    """Llama 3 405B (Meta, "The Llama 3 Herd of Models", 2024, Table 3: 126 layers, model
    dimension 16,384, FFN dimension 53,248, 128 attention heads, 8 key/value heads). By
    hand: per block 16,384 · (16,384 + 2 · 1024) + 16,384 · 16,384 = 570,425,344 in
    attention, 3 · 16,384 · 53,248 = 2,617,245,696 in the MLP and 2 · 16,384 in its norms,
    3,187,703,808 a block; 126 blocks, the embedding and the head (128,256 · 16,384 each)
    and the final norm: 405,853,388,800."""
    from planner.inputs import load_network

    net = load_network(NETWORKS / "llama3-405b.yaml")
    assert net.params == 126 * 3_187_703_808 + 2 * 128_256 * 16_384 + 16_384 \
        == 405_853_388_800
    assert net.by_name("layers.0.attn.self_attn").params == 570_425_344
