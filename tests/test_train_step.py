"""The PyTorch networks `tests/benchmarks/train_step.py` trains on a GPU are the example
network files it compares with: the same parameters, layer for layer, and a training step
runs (CPU, the ``torch`` extra). The README's *One GPU, measured* rests on this."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from torch import nn
from torch.nn import functional as F  # noqa: N812 - PyTorch's own spelling

from planner.inputs import load_network

from .conftest import NETWORKS, ROOT

_spec = importlib.util.spec_from_file_location(
    "train_step", ROOT / "tests" / "benchmarks" / "train_step.py")
assert _spec is not None and _spec.loader is not None
train_step = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_step)


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet50_is_the_network_file():
    model = train_step._resnet50(nn)
    want = load_network(NETWORKS / "resnet50.yaml").params
    assert _params(model) == want == 25_557_032  # REFERENCES §7
    # layer for layer: every convolution's weight shape in the file's order
    convs = [m.weight.shape for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 53 and tuple(convs[0]) == (64, 3, 7, 7)


@pytest.mark.parametrize("fused", [False, True])
def test_gpt2_is_the_network_file(fused):
    model = train_step._gpt2(nn, F, fused)
    want = load_network(NETWORKS / "gpt2-small.yaml").params
    assert _params(model) == want == 124_439_808  # REFERENCES §7: the head is tied


def test_a_step_runs_and_is_written(tmp_path: Path):
    out = tmp_path / "steps.csv"
    train_step.measure(out, "cpu", quick=True)
    rows = out.read_text().splitlines()
    assert rows[0].split(",") == list(train_step.COLUMNS)
    assert len(rows) == 4
    for line in rows[1:]:
        rec = dict(zip(train_step.COLUMNS, line.split(","), strict=True))
        assert float(rec["step_ms"]) > 0 and rec["device"] == "cpu"
