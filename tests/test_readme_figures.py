"""Figures the README's prose quotes are what the planner computes today.

The README cites many results next to the command that gives them. They went stale as
the cost model improved (an audit on 2026-11-28 found fifteen, 245.4 ms quoted for a
plan that took 253.6 ms), because only the sample outputs were tested. Each case here
runs one such command and reads its figures back out of the README's prose: a quoted
figure must equal the computed one to the digits it shows (half a unit of its last
digit). Parenthesised history ("before ..., it was ...") is not checked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from .conftest import CLUSTERS, NETWORKS, ROOT, invoke

GIB = 2.0**30
#: the README with its whitespace as single spaces (its prose wraps anywhere)
README = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
H100 = str(CLUSTERS / "dgx-h100.yaml")
LLAMA8 = str(NETWORKS / "llama3-8b.yaml")
GPT2 = str(NETWORKS / "gpt2-small.yaml")

Doc = dict[str, Any]


def _ms(key: str) -> Callable[[Doc], float]:
    return lambda d: d["iteration"][key] * 1e3


def _s(d: Doc) -> float:
    return float(d["iteration"]["time_s"])


def _mfu(d: Doc) -> float:
    return float(d["iteration"]["mfu"]) * 100.0


def _gib(d: Doc) -> float:
    return float(d["memory"]["peak_bytes"]) / GIB


def _activations_gib(d: Doc) -> float:
    return float(d["memory"]["breakdown"]["activations"]) / GIB


def _baseline(name: str, key: str, scale: float) -> Callable[[Doc], float]:
    return lambda d: float(next(b for b in d["baselines"] if b["name"] == name)[key]) / scale


LLAMA8_B16 = ["plan", LLAMA8, H100, "-p", "64", "-b", "16", "--optimizer", "adam"]


def _moe(network: str, *extra: str) -> list[str]:
    """``plan`` of a mixture of experts on 64 H100s, batch 64, Adam with ZeRO 1."""
    return ["plan", str(NETWORKS / network), H100, "-p", "64", "-b", "64", "--optimizer",
            "adam", "--zero", "1", *extra]

Case = tuple[str, list[str], str, dict[str, Callable[[Doc], float]]]


def _meta_405b(gpus: int, micro: int, meta: int) -> Case:
    """Meta's Llama 3 405B layout at 4 chunks a stage, ZeRO 1: the bold row of its GPU
    count in *Against a published run*."""
    return (f"Llama 3 405B, Meta's layout on {gpus:,} GPUs, 4 chunks",
            ["cost", str(NETWORKS / "llama3-405b.yaml"), str(CLUSTERS / "h100-roce-16k.yaml"),
             "-p", str(gpus), "-b", "2048", "--optimizer", "adam", "--pipeline", "16",
             "--microbatches", str(micro), "--recompute", "auto", "--zero", "1",
             "--virtual-stages", "4", "--grid", f"8x{gpus // 128}", "--mode", "megatron-sp"],
            rf"\| {gpus:,} \| {meta} \| Meta's layout \| 1 \| 1 \| .*? \| \| \| \| 1 \| 4 \| "
            r"(?P<t>[\d.]+) s \| \*\*(?P<f>[\d.]+)\*\* \| (?P<mfu>[\d.]+)% \| "
            r"(?P<bubble>[\d.]+)% \| (?P<m>[\d.]+) GiB \|",
            {"t": _s, "f": lambda d: float(d["iteration"]["tflops_per_device"]), "mfu": _mfu,
             "bubble": lambda d: float(d["pipeline"]["bubble_fraction"]) * 100.0, "m": _gib})


def _torchtitan(network: str, recompute: str, per_gpu: int, setting: str,
                measured: str) -> Case:
    """A row of the torchtitan table in *Against a published run*: FSDP alone on 64
    A100s, the planner's tokens a second a GPU."""
    tokens = per_gpu * (4096 if network.startswith("llama2") else 8192)
    return (f"torchtitan: {network}, {setting} checkpointing",
            ["cost", str(NETWORKS / f"{network}.yaml"), str(CLUSTERS / "dgx-a100.yaml"),
             "-p", "64", "-b", str(64 * per_gpu), "--grid", "1x64", "--mode", "data",
             "--zero", "3", "--optimizer", "adam", "--grad-precision", "fp32",
             "--recompute", recompute, "--recompute-unit", "layers"],
            rf"\| {network} \| {per_gpu} \| {setting} \| {recompute} \| {measured} \| "
            r"(?P<w>[\d,]+) \|",
            {"w": lambda d: tokens / d["iteration"]["time_s"]})


#: (name, command, README pattern (whitespace as any run of it), figure -> how to read it
#: from the command's JSON). A pattern's groups are the quoted figures.
CASES: list[Case] = [
    ("GPT-2 small unfused on one H100 in bf16 (Per-layer costs; found stale by an audit)",
     ["cost", GPT2, H100, "-p", "1", "-b", "8", "--precision", "bf16"],
     r"GPT-2 small on one H100 in bf16 at batch 8 takes (?P<t>[\d.]+) ms an iteration",
     {"t": _ms("time_s")}),
    ("Mistral 7B, a sliding window (Network)",
     ["plan", str(NETWORKS / "mistral-7b.yaml"), H100, "-p", "64", "-b", "64", "--optimizer",
      "adam"],
     r"examples/clusters/dgx-h100.yaml -p 64 -b 64 --optimizer adam` gives (?P<t>[\d.]+) ms, "
     r"(?P<m>[\d.]+) GiB a GPU",
     {"t": _ms("time_s"), "m": _gib}),
    ("8B at batch 16 and its Megatron baselines (Network)", LLAMA8_B16,
     r"Megatron-style\): (?P<t>[\d.]+) ms for 131,072 tokens, (?P<m>[\d.]+) GiB a GPU, "
     r"against (?P<mt>[\d.]+) ms and (?P<mm>[\d.]+) GiB for Megatron's layouts at 4 × 16 "
     r"throughout \(its baseline\), and (?P<st>[\d.]+) ms and (?P<sm>[\d.]+) GiB for them "
     r"with sequence parallelism",
     {"t": _ms("time_s"), "m": _gib, "mt": _baseline("megatron", "time_s", 1e-3),
      "mm": _baseline("megatron", "peak_bytes", GIB),
      "st": _baseline("megatron-sp", "time_s", 1e-3),
      "sm": _baseline("megatron-sp", "peak_bytes", GIB)}),
    ("8B at batch 16 refused by launch --emit megatron", LLAMA8_B16,
     r"its token table over 16; (?P<t>[\d.]+) ms\) is refused, and the baseline it names, "
     r"`megatron-sp` at 4 × 16 \((?P<mt>[\d.]+) ms;",
     {"t": _ms("time_s"), "mt": _baseline("megatron-sp", "time_s", 1e-3)}),
    ("8B, two stages, megatron-cp",
     ["cost", LLAMA8, H100, "-p", "64", "-b", "64", "--optimizer", "adam", "--microbatches",
      "8", "--pipeline", "2", "--grid", "4x8", "--mode", "megatron-cp"],
     r"context parallelism 4 × data 8 in each stage \((?P<t>[\d.]+) ms, (?P<m>[\d.]+) GiB\)",
     {"t": _ms("time_s"), "m": _gib}),
    ("8B, two stages, searched",
     ["plan", LLAMA8, H100, "-p", "64", "-b", "64", "--optimizer", "adam", "--microbatches",
      "8", "--pipeline", "2"],
     r"weighed by `1/M`, it finds (?P<t>[\d.]+) ms itself",
     {"t": _ms("time_s")}),
    ("8B, ZeRO 2 in microbatches",
     ["plan", LLAMA8, H100, "-p", "64", "-b", "64", "--optimizer", "adam", "--microbatches",
      "8", "--zero", "2"],
     r"--zero 2`: (?P<t>[\d.]+) ms a step with (?P<c>[\d.]+) ms of communication, "
     r"(?P<e>[\d.]+) ms of it exposed",
     {"t": _ms("time_s"), "c": _ms("comm_s"), "e": _ms("exposed_comm_s")}),
    ("8B, megatron-sp with and without --tp-comm-overlap",
     ["cost", LLAMA8, H100, "-p", "64", "-b", "64", "--optimizer", "adam", "--grid", "4x16",
      "--mode", "megatron-sp", "--tp-comm-overlap"],
     r"without, \*\*(?P<t>[\d.]+) ms\*\* with, the (?P<a>[\d.]+) ms of activation traffic",
     {"t": _ms("time_s"), "a": _ms("activation_comm_s")}),
    ("8B, one microbatch",
     ["plan", LLAMA8, H100, "-p", "64", "-b", "64", "--optimizer", "adam"],
     r"Llama 3 8B at `-b 64` in one microbatch takes (?P<t>[\d.]+) ms and (?P<m>[\d.]+) GiB",
     {"t": _ms("time_s"), "m": _gib}),
    ("8B, one microbatch, against its Megatron baselines",
     ["plan", LLAMA8, H100, "-p", "64", "-b", "64", "--optimizer", "adam"],
     r"without sequence parallelism need (?P<mm>[\d.]+) GiB a device; with it, "
     r"(?P<st>[\d.]+) ms and (?P<sm>[\d.]+) GiB at 4 × 16; the plan finds (?P<t>[\d.]+) ms "
     r"and (?P<m>[\d.]+) GiB",
     {"mm": _baseline("megatron", "peak_bytes", GIB),
      "st": _baseline("megatron-sp", "time_s", 1e-3),
      "sm": _baseline("megatron-sp", "peak_bytes", GIB), "t": _ms("time_s"), "m": _gib}),
    ("8B, megatron-sp without --tp-comm-overlap",
     ["cost", LLAMA8, H100, "-p", "64", "-b", "64", "--optimizer", "adam", "--grid", "4x16",
      "--mode", "megatron-sp"],
     r"\(`--mode megatron-sp`, the layout above\): (?P<t>[\d.]+) ms without,",
     {"t": _ms("time_s")}),
    ("8B, four microbatches",
     ["plan", LLAMA8, H100, "-p", "64", "-b", "64", "--optimizer", "adam", "--microbatches",
      "4"],
     r"Llama 3 8B on 64 GPUs at `-b 64 --microbatches 4` takes (?P<t>[\d.]+) ms and "
     r"(?P<m>[\d.]+) GiB",
     {"t": _ms("time_s"), "m": _gib}),
    ("70B, 2 microbatches, no stages",
     ["plan", str(NETWORKS / "llama3-70b.yaml"), H100, "-p", "256", "-b", "128",
      "--optimizer", "adam", "--microbatches", "2"],
     r"`--microbatches 2` gives (?P<t>[\d.]+) s \((?P<m>[\d.]+) GiB\)",
     {"t": _s, "m": _gib}),
    ("GPT-2, all blocks recomputed",
     ["plan", GPT2, H100, "-p", "8", "-b", "64", "--optimizer", "adam", "--recompute",
      "blocks"],
     r"activations [\d.]+ → (?P<a>[\d.]+) GiB .*? iteration [\d.]+ → (?P<t>[\d.]+) ms "
     r"\(the re-run (?P<r>[\d.]+) ms\)",
     {"a": _activations_gib, "t": _ms("time_s"), "r": _ms("recompute_s")}),
    ("GPT-2, nothing recomputed",
     ["plan", GPT2, H100, "-p", "8", "-b", "64", "--optimizer", "adam"],
     r"GPT-2 small at batch 64 on 8 H100s \(fp32, Adam\): activations (?P<a>[\d.]+) → .*? "
     r"iteration (?P<t>[\d.]+) →",
     {"a": _activations_gib, "t": _ms("time_s")}),
    *(("8B at batch 16, context-parallel attention, " + how,
       ["cost", LLAMA8, H100, "-p", "64", "-b", "16", "--optimizer", "adam", "--mode",
        "megatron", "--grid", "4x16", "--pin", "embed_tokens=model:16x4", "--pin",
        "*self_attn=domain:4x16", "--pin", "*gate_up_proj=column:4x16", "--pin",
        "*down_proj=row-sp:4x16", "--cp-comm-type", how],
       r"\[--cp-comm-type allgather\]`\) takes (?P<p2p>[\d.]+) ms with the ring and "
       r"(?P<allgather>[\d.]+) ms gathering",
       {how: _ms("time_s")})
      for how in ("p2p", "allgather")),
    *((f"GPT-2 at batch {batch}, --recompute auto",
       ["plan", GPT2, H100, "-p", "8", "-b", str(batch), "--optimizer", "adam", "--recompute",
        "auto"],
       r"`--recompute auto` recomputes 9 of the 24 blocks, (?P<b384>[\d.]+) s against "
       r"(?P<a384>[\d.]+) s recomputing all; at batch 512, 15 blocks, (?P<b512>[\d.]+) s "
       r"against (?P<a512>[\d.]+) s",
       {f"b{batch}": _s, f"a{batch}": lambda d: float(next(
           r["time_s"] for r in d["recompute_auto"] if r["blocks"] == 24))})
      for batch in (384, 512)),
    ("8B at 131,072 tokens",
     ["plan", str(NETWORKS / "llama3-8b-128k.yaml"), H100, "-p", "64", "-b", "4",
      "--optimizer", "adam", "--zero", "1"],
     r"over 4, (?P<t>[\d.]+) s a step \(MFU (?P<mfu>[\d.]+)%\)\. .*? the `megatron-cp` "
     r"baseline prices the same (?P<cp>[\d.]+) s",
     {"t": _s, "mfu": _mfu,
      "cp": _baseline("megatron-cp", "time_s", 1.0)}),
    ("8B at 131,072 tokens, keys and values gathered",
     ["plan", str(NETWORKS / "llama3-8b-128k.yaml"), H100, "-p", "64", "-b", "4",
      "--optimizer", "adam", "--zero", "1", "--cp-comm-type", "allgather"],
     r"one attention kernel a layer against all 131,072 keys\) the same layout is "
     r"(?P<t>[\d.]+) s",
     {"t": _s}),
    ("8B at 131,072 tokens, Ulysses",
     ["plan", str(NETWORKS / "llama3-8b-128k.yaml"), H100, "-p", "64", "-b", "4",
      "--optimizer", "adam", "--zero", "1", "--pin", "*.self_attn=ulysses:16x4"],
     r"each key/value head sent to two devices\) (?P<t>[\d.]+) s \(`--pin",
     {"t": _s}),
    ("Mixtral 8x7B",
     _moe("mixtral-8x7b.yaml"),
     r"cross nodes: (?P<t>[\d.]+) ms, (?P<m>[\d.]+) GiB\. With the expert groups",
     {"t": _ms("time_s"), "m": _gib}),
    ("Mixtral 8x7B, expert groups inside nodes",
     _moe("mixtral-8x7b.yaml", "--pin", "*.experts=expert:8x8:rows"),
     r"'\*\.experts=expert:8x8:rows'`\) (?P<t>[\d.]+) ms\.",
     {"t": _ms("time_s")}),
    ("DeepSeekMoE 16B, expert parallelism over 8",
     _moe("deepseek-moe-16b.yaml", "--pin", "*.experts=expert:8x8"),
     r"\(`--pin '\*\.experts=expert:8x8'`\) takes (?P<t>[\d.]+) ms and (?P<m>[\d.]+) GiB",
     {"t": _ms("time_s"), "m": _gib}),
    ("DeepSeekMoE 16B",
     _moe("deepseek-moe-16b.yaml"),
     r"`model 2x32`: (?P<t>[\d.]+) ms, (?P<m>[\d.]+) GiB, MFU (?P<mfu>[\d.]+)%;",
     {"t": _ms("time_s"), "m": _gib, "mfu": _mfu}),
    *(_meta_405b(gpus, micro, meta) for gpus, micro, meta in ((8192, 32, 430),
                                                              (16384, 16, 400))),
    *(_torchtitan(*run) for run in (("llama3-8b", "16", 1, "selective layer", "2,904"),
                                     ("llama3-70b", "blocks", 1, "full", "331"),
                                     ("llama2-13b", "none", 2, "no", "2,162"),
                                     ("llama2-70b", "blocks", 2, "full", "353"))),
    ("VGG-16 on 24 A100s: bands held to the batch split",
     ["plan", str(NETWORKS / "vgg16.yaml"), str(CLUSTERS / "dgx-a100.yaml"), "-p", "24",
      "-b", "768"],
     r"and the plan takes (?P<t>[\d.]+) ms against data\s+parallelism's (?P<d>[\d.]+) ms, "
     r"with less communication \((?P<c>[\d.]+) against [\d.]+ ms\) and about\s+the same "
     r"compute \((?P<k>[\d.]+) against [\d.]+ ms\)",
     {"t": _ms("time_s"), "c": _ms("comm_s"), "k": _ms("compute_s"),
      "d": _baseline("data", "time_s", 1e-3)}),
    ("GPT-2, ZeRO 3, a gather a layer",
     ["cost", GPT2, H100, "-p", "16", "-b", "64", "--zero", "3", "--bucket-size", "0"],
     r"`--bucket-size 0`: (?P<t>[\d.]+) ms;",
     {"t": _ms("time_s")}),
]


def _shown(text: str) -> Decimal:
    """Half a unit of the last digit a quoted figure shows."""
    return Decimal(1).scaleb(int(Decimal(text).as_tuple().exponent)) / 2


@pytest.mark.parametrize("name, args, pattern, figures", CASES, ids=[c[0] for c in CASES])
def test_quoted_figure_is_current(runner, name, args, pattern, figures):
    found = re.search(pattern.replace(" ", r"\s+"), README)
    assert found is not None, f"the README no longer says this ({name}): {pattern}"
    r = invoke(runner, *args, "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    for group, read in figures.items():
        quoted = found.group(group).replace(",", "")
        value = read(doc)
        assert abs(Decimal(quoted) - Decimal(repr(value))) <= _shown(quoted), (
            f"{name}: the README quotes {quoted}, the planner gives {value:.6g}")


def test_quoted_shortfall_is_current(runner):
    """Llama 3 70B on 256 H100s at 16 microbatches of 8 without stages: nothing fits
    (exit 1), and the leanest layout needs what the README quotes (attention's weights
    whole on every device: its 8 key/value heads cannot split 32 ways)."""
    found = re.search(r"nothing fits without ZeRO \(the leanest layout needs "
                      r"(?P<m>[\d.]+) GiB;", README)
    assert found is not None, "the README no longer quotes the 70B shortfall"
    r = invoke(runner, "plan", NETWORKS / "llama3-70b.yaml", H100, "-p", "256", "-b", "128",
               "--optimizer", "adam", "--microbatches", "16")
    assert r.exit_code == 1, r.output
    assert f"the leanest layout found needs {found.group('m')} GiB per device" in r.stderr


def test_h200_step_table_is_current():
    """*One GPU, measured*: the table of whole training steps on an H200 against `planner
    cost` is what ``tests/benchmarks/train_step.py compare`` prints today for the committed
    measurements (the planner's columns move with the kernel models and the cost model)."""
    import importlib.util

    path = ROOT / "tests" / "benchmarks" / "train_step.py"
    spec = importlib.util.spec_from_file_location("train_step", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.table(ROOT / "tests" / "benchmarks" / "data" / "h200_steps.csv")
    assert len(table.splitlines()) == 14  # header, rule, 12 configurations
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert table in text
    # GPT-2's peaks with the step's own logits added and its gradients taken away (a
    # table inside a list item: indented two spaces)
    acct = module.memory_accounting(ROOT / "tests" / "benchmarks" / "data" / "h200_steps.csv")
    assert len(acct.splitlines()) == 10  # header, rule, 8 GPT-2 configurations
    assert "\n".join("  " + line for line in acct.splitlines()) in text
    ratios = [float(line.rsplit("|", 2)[1]) for line in acct.splitlines()[2:]]
    assert all(1.0 <= r <= 1.02 for r in ratios), ratios  # README: within 0.2-1.6%
