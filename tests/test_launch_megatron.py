"""``planner launch PLAN --emit megatron``: a plan as Megatron-LM's parallelism
arguments, derived here by hand from each plan's question and layouts; a plan Megatron-LM
cannot run as planned is refused (exit 2) with the reason."""

from __future__ import annotations

import json

import pytest
import yaml

from planner.units import format_time

from .conftest import CLUSTERS, NETWORKS, invoke

DGX = CLUSTERS / "dgx-h100.yaml"
LLAMA = NETWORKS / "llama3-8b.yaml"
GPT2 = NETWORKS / "gpt2-small.yaml"


def _plan(runner, tmp_path, *args, name="plan.yaml"):
    out = invoke(runner, *args, "--format", "yaml")
    assert out.exit_code in (0, 1), out.output
    path = tmp_path / name
    path.write_text(out.stdout)
    return path


def _args(runner, plan):
    """The arguments between ``PLANNER_MEGATRON_ARGS=(`` and ``)``, one a line."""
    out = invoke(runner, "launch", plan, "--emit", "megatron")
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    start = lines.index("PLANNER_MEGATRON_ARGS=(")
    return [line.strip() for line in lines[start + 1:lines.index(")", start)]], out.stdout


def _refused(runner, plan, words):
    out = invoke(runner, "launch", plan, "--emit", "megatron")
    assert out.exit_code == 2, out.output
    assert "Megatron-LM cannot run this plan as planned" in out.stderr, out.stderr
    assert words in out.stderr, out.stderr
    assert "Traceback" not in out.output and not out.stdout
    return out.stderr


def test_tensor_parallel_plan(runner, tmp_path):
    """Llama 3 8B on 64 H100s, Megatron's layouts with sequence parallelism over 4 × 16,
    ZeRO 1, both overlaps: tensor 4 (every layer, all sequence-parallel), data 16 = 64 /
    4, one microbatch of 16 / 16 = 1 sequence, bf16 with bf16 gradients (which Megatron-LM
    reduces in fp32 unless told --grad-reduce-in-bf16) and Adam; 32 attention layers."""
    plan = _plan(runner, tmp_path, "cost", LLAMA, DGX, "-p", "64", "-b", "16", "--optimizer",
                 "adam", "--grid", "4x16", "--mode", "megatron-sp", "--zero", "1",
                 "--overlap-param-gather", "--tp-comm-overlap")
    args, text = _args(runner, plan)
    assert args == ["--tensor-model-parallel-size 4", "--sequence-parallel",
                    "--pipeline-model-parallel-size 1", "--context-parallel-size 1",
                    "--micro-batch-size 1", "--global-batch-size 16",
                    "--use-distributed-optimizer", "--overlap-grad-reduce",
                    # the plan's 25 MiB buckets of bf16 gradients: 25 · 2^20 / 2
                    "--ddp-bucket-size 13107200",
                    "--overlap-param-gather", "--tp-comm-overlap", "--bf16",
                    "--grad-reduce-in-bf16", "--optimizer adam"]
    assert "64 ranks: tensor 4 x context 1 x pipeline 1 x data 16" in text
    assert "--num-layers 32" in text


def _model_args(text):
    """The arguments between ``PLANNER_MEGATRON_MODEL_ARGS=(`` and ``)`` (None: none)."""
    lines = text.splitlines()
    if "PLANNER_MEGATRON_MODEL_ARGS=(" not in lines:
        return None
    start = lines.index("PLANNER_MEGATRON_MODEL_ARGS=(")
    return [line.strip() for line in lines[start + 1:lines.index(")", start)]]


def test_model_arguments_from_the_network_file(runner, tmp_path):
    """The network's own arguments, derived by hand from each file's text (its header
    comment gives the same figures): Llama 3 8B is 32 layers of 4,096 with 32 query and 8
    key/value heads, a SwiGLU MLP of 14,336 (its fused gate and up projection 28,672 wide),
    RMSNorm, rotary positions, no biases, no dropout, an untied head, 8,192 tokens. GPT-2
    keeps Megatron-LM's defaults where they are its own (learned positions, LayerNorm,
    GELU, biases, a tied head) and its attention dropout 0.1; Qwen2 7B has biases on Q,
    K and V alone; DeepSeekMoE 16B a dense first layer (10,944) before 27 of 64 experts
    of 1,408, 6 a token, and 2 shared ones. Gemma 2's local and global attention layers
    alternate: no arguments, and why."""
    plan = _plan(runner, tmp_path, "cost", LLAMA, DGX, "-p", "64", "-b", "16", "--optimizer",
                 "adam", "--grid", "4x16", "--mode", "megatron-sp")
    _, text = _args(runner, plan)
    assert _model_args(text) == [
        "--num-layers 32", "--hidden-size 4096", "--ffn-hidden-size 14336",
        "--num-attention-heads 32", "--group-query-attention", "--num-query-groups 8",
        "--seq-length 8192", "--max-position-embeddings 8192",
        "--position-embedding-type rope", "--normalization RMSNorm", "--swiglu",
        "--disable-bias-linear", "--untie-embeddings-and-output-weights",
        "--attention-dropout 0", "--hidden-dropout 0"]
    assert "#   the tokenizer of its 128,256-token vocabulary" in text
    assert "#   --rotary-base" in text and "#   --norm-epsilon" in text
    plan = _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "8", "-b", "16", "--grid", "2x4",
                 "--mode", "megatron", name="gpt2.yaml")
    _, text = _args(runner, plan)
    assert _model_args(text) == [
        "--num-layers 12", "--hidden-size 768", "--ffn-hidden-size 3072",
        "--num-attention-heads 12", "--seq-length 1024", "--max-position-embeddings 1024",
        "--attention-dropout 0.1"]
    assert "#   --hidden-dropout for its dropout layers" in text
    qwen = NETWORKS / "qwen2-7b.yaml"
    plan = _plan(runner, tmp_path, "cost", qwen, DGX, "-p", "8", "-b", "8", "--grid", "4x2",
                 "--mode", "megatron-sp", "--optimizer", "adam", name="qwen.yaml")
    got = _model_args(_args(runner, plan)[1])
    assert got is not None and got[got.index("--swiglu") + 1:] == [
        "--disable-bias-linear", "--add-qkv-bias", "--untie-embeddings-and-output-weights",
        "--attention-dropout 0", "--hidden-dropout 0"]
    moe = NETWORKS / "deepseek-moe-16b.yaml"
    plan = _plan(runner, tmp_path, "cost", moe, DGX, "-p", "8", "-b", "8", "--grid", "1x8",
                 "--optimizer", "adam", name="moe.yaml")
    got = _model_args(_args(runner, plan)[1])
    assert got is not None
    assert got[:3] == ["--num-layers 28", "--hidden-size 2048", "--ffn-hidden-size 10944"]
    moe_args = got[got.index("--num-experts 64"):got.index("--swiglu")]
    assert moe_args == ["--num-experts 64", "--moe-router-topk 6",
                        "--moe-ffn-hidden-size 1408",
                        "--moe-shared-expert-intermediate-size 2816",
                        "--moe-layer-freq '[0]*1+[1]*27'"]
    gemma = NETWORKS / "gemma2-9b.yaml"
    plan = _plan(runner, tmp_path, "cost", gemma, DGX, "-p", "8", "-b", "8", "--grid", "1x8",
                 "--optimizer", "adam", name="gemma.yaml")
    _, text = _args(runner, plan)
    assert _model_args(text) is None
    assert "the network is not Megatron-LM's GPT model: its attention layers' windows " \
           "differ (0, 4096))" in text
    # the network file gone: the parallelism alone, and why
    copy = tmp_path / "copy.yaml"
    copy.write_text(LLAMA.read_text())
    plan = _plan(runner, tmp_path, "cost", copy, DGX, "-p", "64", "-b", "16", "--grid",
                 "4x16", "--mode", "megatron-sp", "--optimizer", "adam", name="gone.yaml")
    copy.unlink()
    _, text = _args(runner, plan)
    assert _model_args(text) is None
    assert "--num-layers 32, and its widths; its network file is not found here or " \
           "beside the plan, or has changed)" in text


def _megatron_params(args: list[str], vocab: int) -> int:
    """The parameters of the GPT model Megatron-LM builds from ``args``, by its layer
    shapes: per decoder layer the fused QKV projection ``h × (n·d + 2·g·d)`` and the output
    ``n·d × h`` (``n`` heads of ``d``, ``g`` key/value groups), the MLP ``3·h·f`` under
    SwiGLU (``2·h·f`` otherwise), or ``E`` experts of ``3·h·f_e``, their router ``h·E``
    and shared experts ``3·h·f_s``; biases unless disabled (Q, K and V alone with
    --add-qkv-bias); two norms of ``h`` (RMSNorm) or ``2h`` (LayerNorm) a layer and a
    final one; the token table, the head unless tied, learned positions."""
    d = dict(a.partition(" ")[::2] for a in args)
    h, layers, heads = int(d["--hidden-size"]), int(d["--num-layers"]), \
        int(d["--num-attention-heads"])
    groups = int(d.get("--num-query-groups", heads))
    hd = int(d.get("--kv-channels", h // heads))
    ffn, glu = int(d["--ffn-hidden-size"]), "--swiglu" in d
    bias = "--disable-bias-linear" not in d
    norm = h if d.get("--normalization") == "RMSNorm" else 2 * h
    qkv = heads * hd + 2 * groups * hd
    attention = h * qkv + heads * hd * h + (qkv if bias or "--add-qkv-bias" in d else 0) \
        + (h if bias else 0)
    dense = (3 if glu else 2) * h * ffn + ((ffn * (2 if glu else 1) + h) if bias else 0)
    experts = int(d.get("--num-experts", 0))
    pattern = [1 if experts else 0] * layers
    if "--moe-layer-freq" in d:
        pattern = []
        for run in d["--moe-layer-freq"].strip("'").split("+"):  # [f]*n
            flag, n = run.split("*")
            pattern += [int(flag.strip("[]"))] * int(n)
    moe = experts * (3 if glu else 2) * h * int(d.get("--moe-ffn-hidden-size", 0)) \
        + h * experts + 3 * h * int(d.get("--moe-shared-expert-intermediate-size", 0))
    total = sum(attention + (moe if flag else dense) + 2 * norm for flag in pattern)
    total += norm + vocab * h * (2 if "--untie-embeddings-and-output-weights" in d else 1)
    if d.get("--position-embedding-type", "learned_absolute") == "learned_absolute":
        total += int(d["--max-position-embeddings"]) * h
    return total


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "llama2-13b", "mistral-7b",
                                  "qwen2-7b", "gpt2-small", "mixtral-8x7b",
                                  "deepseek-moe-16b"])
def test_model_arguments_build_the_networks_parameters(name):
    """The model Megatron-LM builds from the arguments has the network's parameters,
    counted from Megatron-LM's layer shapes (:func:`_megatron_params`) against the
    network file's own count (GPT-2 small 124,439,808 and Llama 3 8B 8,030,261,248,
    REFERENCES §7 and the file's header): exact, so no width, head count, bias or tie is
    off."""
    from planner.inputs import load_network
    from planner.megatron_model import model_args

    net = load_network(NETWORKS / f"{name}.yaml")
    got = model_args(net)
    assert got.refused is None, got.refused
    vocab = next(lay.embedding.vocab for lay in net.layers if lay.embedding is not None)
    assert _megatron_params(got.args, vocab) == sum(lay.params for lay in net.layers)
    known = {"gpt2-small": 124_439_808, "llama3-8b": 8_030_261_248}
    if name in known:
        assert _megatron_params(got.args, vocab) == known[name]


@pytest.mark.parametrize("cp, attention, want", [
    ("p2p", "domain", "p2p"), ("allgather", "domain", "all_gather"),
    ("p2p", "ulysses", "a2a"),
])
def test_context_parallel_plan(runner, tmp_path, cp, attention, want):
    """Every layer split by tokens 8 ways with the batch over 8 (64 H100s, batch 16):
    context 8, data 8, a microbatch of 2; the attention's method from its terms (the
    ring's ``p2p``; gathered, ``all_gather``, as Megatron-core and Transformer Engine
    spell it), DeepSpeed-Ulysses attention as ``a2a``. Without
    gradient overlap, no --overlap-grad-reduce; fp32 gradients for bf16 weights, and
    SGD with momentum."""
    plan = _plan(runner, tmp_path, "cost", LLAMA, DGX, "-p", "64", "-b", "16",
                 "--pin", f"*self_attn={attention}:8x8", "--pin", "*=domain:8x8",
                 "--cp-comm-type", cp, "--overlap", "none", "--grad-precision", "fp32")
    args, _ = _args(runner, plan)
    assert args == ["--tensor-model-parallel-size 1", "--pipeline-model-parallel-size 1",
                    "--context-parallel-size 8", f"--cp-comm-type {want}",
                    "--micro-batch-size 2", "--global-batch-size 16", "--bf16",
                    "--accumulate-allreduce-grads-in-fp32", "--optimizer sgd"]


def test_expert_parallel_plan(runner, tmp_path):
    """Mixtral 8x7B on 8 GPUs, every layer data parallel but the experts, one a device
    (``expert 8x1``): expert parallelism 8 over the 8 data-parallel ranks, its tokens
    dispatched all-to-all; 8 samples, one a replica. A mixture split by hidden features
    with the rest (``megatron`` 8x1) is plain tensor parallelism."""
    mixtral = NETWORKS / "mixtral-8x7b.yaml"
    plan = _plan(runner, tmp_path, "cost", mixtral, DGX, "-p", "8", "-b", "8",
                 "--pin", "*.moe.experts=expert:8x1")
    args, text = _args(runner, plan)
    assert args[:6] == ["--tensor-model-parallel-size 1", "--pipeline-model-parallel-size 1",
                        "--context-parallel-size 1", "--expert-model-parallel-size 8",
                        "--moe-token-dispatcher-type alltoall", "--micro-batch-size 1"]
    assert "experts over 8 of the data-parallel ranks" in text
    # one expert a rank: no grouped GEMM; no tensor parallelism: no CUDA_DEVICE_MAX_...
    assert "--moe-grouped-gemm" not in args and "CUDA_DEVICE_MAX_CONNECTIONS" not in text
    plan = _plan(runner, tmp_path, "cost", mixtral, DGX, "-p", "8", "-b", "8", "--grid",
                 "8x1", "--mode", "megatron-sp", name="tp.yaml")
    args, text = _args(runner, plan)
    # every expert on every rank, split by hidden features: one grouped GEMM of 8
    assert args[:2] == ["--tensor-model-parallel-size 8", "--sequence-parallel"]
    assert "--moe-grouped-gemm" in args and not any("expert-model" in a for a in args)
    assert "\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\nPLANNER_MEGATRON_ARGS=(" in text
    # in fp32 not: Megatron-LM's grouped GEMM has run in bf16 only
    plan = _plan(runner, tmp_path, "cost", mixtral, DGX, "-p", "8", "-b", "8", "--grid",
                 "8x1", "--mode", "megatron-sp", "--precision", "fp32", name="fp32.yaml")
    args, _ = _args(runner, plan)
    assert "--moe-grouped-gemm" not in args


def test_what_megatron_refuses_is_refused(runner, tmp_path):
    """Found by an expert audit (2026-12-07), each an assertion of Megatron-LM's
    `validate_args` or its model configuration: a mixture of experts under tensor
    parallelism needs sequence parallelism; expert parallelism is not run in fp16;
    context parallelism over C cuts each sequence into 2·C equal chunks (Llama 3's 8,192
    tokens over 3 ranks: 6 chunks do not divide them); sequence parallelism splits a
    rank's tokens evenly over T."""
    mixtral = NETWORKS / "mixtral-8x7b.yaml"
    cases = [
        (("cost", mixtral, DGX, "-p", "8", "-b", "8", "--grid", "8x1", "--mode", "megatron"),
         "tensor parallelism over 8 ranks without sequence parallelism"),
        (("cost", mixtral, DGX, "-p", "8", "-b", "8", "--pin", "*.moe.experts=expert:8x1",
          "--precision", "fp16"), "\"Expert parallelism is not supported with fp16"),
        (("cost", LLAMA, DGX, "-p", "48", "-b", "16", "--optimizer", "adam", "--grid",
          "3x16", "--mode", "megatron-cp"),
         "its 8,192-token sequences do not split into 6 equal chunks"),
    ]
    for i, (args, said) in enumerate(cases):
        plan = _plan(runner, tmp_path, *args, name=f"p{i}.yaml")
        _refused(runner, plan, said)
    ragged = tmp_path / "ragged.yaml"
    ragged.write_text((NETWORKS / "llama3-8b.yaml").read_text().replace("8192", "8190"))
    plan = _plan(runner, tmp_path, "cost", ragged, DGX, "-p", "64", "-b", "16", "--grid",
                 "4x16", "--mode", "megatron-sp", name="sp.yaml")
    _refused(runner, plan, "its 8,190 tokens a context-parallel rank do not split evenly "
                           "over the 4 ranks of sequence parallelism")


def test_a_linear_layer_megatron_cannot_shard_evenly_is_refused(runner, tmp_path):
    """Megatron-core's column-parallel linear layer divides its output features by T and
    the row-parallel one its input features (``divide`` asserts it; found by an audit of
    the launch path): GPT-2 with a 3,001-wide MLP under T = 2 is refused at its first
    column layer. Plans record each linear layer's features for it."""
    odd = tmp_path / "odd.yaml"
    odd.write_text(GPT2.read_text().replace("out_features: 3072", "out_features: 3001"))
    assert "out_features: 3001" in odd.read_text()
    plan = _plan(runner, tmp_path, "cost", odd, DGX, "-p", "8", "-b", "16", "--grid", "2x4",
                 "--mode", "megatron-sp", "--precision", "bf16", "--optimizer", "adam")
    fc = next(lay for lay in yaml.safe_load(plan.read_text())["layers"]
              if lay["name"] == "h.0.mlp.c_fc")
    assert (fc["in_features"], fc["out_features"]) == (768, 3001)
    said = _refused(runner, plan, "layer 'h.0.mlp.c_fc' is column-sp over 2 ranks, and its "
                                  "3,001 output features do not split evenly over them")
    assert "price a tensor-parallel size that divides 3,001" in said
    # GPT-2 as it is: its output head's 50,257 tokens are not refused, since Megatron-LM
    # pads the vocabulary to a multiple of 128·T
    plan = _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "8", "-b", "16", "--grid", "2x4",
                 "--mode", "megatron-sp", "--precision", "bf16", "--optimizer", "adam",
                 name="even.yaml")
    _args(runner, plan)


def test_zero_1_within_nodes_is_partial_distributed_optimizer(runner, tmp_path):
    """ZeRO 1 sharded within nodes (``--zero-shard node``) reduce-scatters within each
    node's replicas and all-reduces the shards across nodes; Megatron-LM runs that as
    ``--num-distributed-optimizer-instances N``, slices of each data-parallel group of
    ``DP·C / N`` consecutive ranks (found by an audit: it was refused). GPT-2 on 16 H100s
    (two 8-GPU nodes) at T = 4: 4 replicas, 2 a node, so N = 16 / 8 = 2. On one node the
    two shardings are one and no instance count is given; with experts split over ranks
    Megatron-LM refuses it ("Partial DistOpt cannot support MoE models with expert
    parallelism")."""
    plan = _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "16", "-b", "32", "--grid", "4x4",
                 "--mode", "megatron-sp", "--precision", "bf16", "--optimizer", "adam",
                 "--zero", "1", "--zero-shard", "node")
    args, _ = _args(runner, plan)
    assert "--use-distributed-optimizer" in args
    assert "--num-distributed-optimizer-instances 2" in args
    plan = _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "8", "-b", "32", "--grid", "4x2",
                 "--mode", "megatron-sp", "--precision", "bf16", "--optimizer", "adam",
                 "--zero", "1", "--zero-shard", "node", name="one.yaml")
    args, _ = _args(runner, plan)
    assert "--use-distributed-optimizer" in args
    assert not any(a.startswith("--num-distributed-optimizer-instances") for a in args)
    mixtral = NETWORKS / "mixtral-8x7b.yaml"
    plan = _plan(runner, tmp_path, "cost", mixtral, DGX, "-p", "16", "-b", "16", "--pin",
                 "*.moe.experts=expert:8x2", "--precision", "bf16", "--optimizer", "adam",
                 "--zero", "1", "--zero-shard", "node", name="moe.yaml")
    _refused(runner, plan, "Partial DistOpt cannot support MoE models with expert "
                           "parallelism")


def test_a_capacity_factor_is_emitted(runner, tmp_path):
    """A network's capacity factor, which the plan prices on whole buffers, is run as
    priced: --moe-expert-capacity-factor with the buffers padded to it."""
    text = (NETWORKS / "mixtral-8x7b.yaml").read_text()
    assert "top_k: 2," in text
    capped = tmp_path / "capped.yaml"
    capped.write_text(text.replace("top_k: 2,", "top_k: 2, capacity_factor: 1.25,", 1))
    plan = _plan(runner, tmp_path, "cost", capped, DGX, "-p", "8", "-b", "8",
                 "--pin", "*.moe.experts=expert:8x1")
    doc = yaml.safe_load(plan.read_text())
    moe = [r for r in doc["layers"] if r["type"] == "moe"]
    assert moe and all(r["capacity_factor"] == 1.25 and r["experts"] == 8
                       and r["top_k"] == 2 for r in moe)
    args, _ = _args(runner, plan)
    at = args.index("--moe-expert-capacity-factor 1.25")
    assert args[at + 1] == "--moe-pad-expert-input-to-capacity"


def test_interleaved_pipeline_with_even_chunks(runner, tmp_path):
    """GPT-2 small (12 layers) on 16 GPUs: 2 stages of 2 chunks, each 3 transformer
    layers (starts at h.3, h.6, h.9), tensor 4 × data 2 in each stage, 8 microbatches of
    64 / (8 · 2) = 4, recomputing the first 2 residual blocks of each chunk (one
    transformer layer: Megatron-LM's block method); plain SGD."""
    plan = _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "16", "-b", "64", "--grid", "4x2",
                 "--mode", "megatron", "--pipeline", "2", "--virtual-stages", "2",
                 "--microbatches", "8", "--stage-starts",
                 "h.3.attn.ln_1,h.6.attn.ln_1,h.9.attn.ln_1", "--recompute", "2",
                 "--optimizer", "sgd")
    args, text = _args(runner, plan)
    assert args == ["--tensor-model-parallel-size 4", "--pipeline-model-parallel-size 2",
                    "--num-layers-per-virtual-pipeline-stage 3", "--context-parallel-size 1",
                    "--micro-batch-size 4", "--global-batch-size 64", "--overlap-grad-reduce",
                    "--ddp-bucket-size 6553600",  # 25 MiB of fp32 gradients
                    "--recompute-granularity full", "--recompute-method block",
                    "--recompute-num-layers 1", "--optimizer sgd", "--sgd-momentum 0"]
    assert "16 ranks: tensor 4 x context 1 x pipeline 2 x data 2" in text


def test_uneven_chunks_as_a_pipeline_layout(runner, tmp_path):
    """Chunks of unequal transformer layers (interleaved, or middle stages of 1F1B) were
    refused; Megatron-core's ``--pipeline-model-parallel-layout`` takes any split (found
    by an audit): chunks in Megatron-LM's virtual-stage order split by ``|``, ``t*n``
    layers, the embedding ``E`` first and the loss ``L`` last. GPT-2 (12 layers) in 2
    stages of 2 chunks starting at h.3, h.7 and h.11 holds 3, 4, 4 and 1 layers."""
    from planner.megatron import pipeline_layout

    assert pipeline_layout([3, 4, 4, 1]) == "Et*3|t*4|t*4|t,L"
    assert pipeline_layout([0, 2, 0]) == "E|t*2|L"
    plan = _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "16", "-b", "64", "--grid", "4x2",
                 "--mode", "megatron", "--pipeline", "2", "--virtual-stages", "2",
                 "--microbatches", "8", "--stage-starts",
                 "h.3.attn.ln_1,h.7.attn.ln_1,h.11.attn.ln_1", "--optimizer", "sgd")
    args, _ = _args(runner, plan)
    assert "--pipeline-model-parallel-layout 'Et*3|t*4|t*4|t,L'" in args
    assert not any(a.startswith(("--num-layers-per-virtual", "--decoder-")) for a in args)
    plan = _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "32", "-b", "64", "--grid", "4x2",
                 "--mode", "megatron", "--pipeline", "4", "--microbatches", "8",
                 "--stage-starts", "h.2.attn.ln_1,h.5.attn.ln_1,h.9.attn.ln_1",
                 "--optimizer", "sgd", name="mid.yaml")
    args, _ = _args(runner, plan)
    assert "--pipeline-model-parallel-layout 'Et*2|t*3|t*4|t*3,L'" in args


def test_the_buckets_priced_are_megatrons(runner, tmp_path):
    """Megatron-LM's gradient buckets default to max(40M, 1M x replicas) parameters, not
    the plan's; the arguments carry the plan's --bucket-size in gradient elements (an
    audit found 200 MiB and 25 MiB plans gave the same arguments): 200 MiB of fp32
    gradients are 200 · 2^20 / 4 = 52,428,800; one bucket a layer (0) has no Megatron-LM
    setting, and no overlap needs none."""
    for size, want in (("200MiB", ["--ddp-bucket-size 52428800"]), ("0", [])):
        plan = _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "16", "-b", "64",
                     "--grid", "4x4", "--mode", "megatron", "--bucket-size", size)
        args, _ = _args(runner, plan)
        assert [a for a in args if a.startswith("--ddp-bucket-size")] == want, args
    plan = _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "16", "-b", "64", "--grid", "4x4",
                 "--mode", "megatron", "--overlap", "none")
    args, _ = _args(runner, plan)
    assert not any(a.startswith(("--ddp-bucket-size", "--overlap-grad")) for a in args)


def test_recomputed_layers_are_megatrons_count(runner, tmp_path):
    """With ``--recompute-unit layers`` a count is of transformer layers, as Megatron-LM's
    ``--recompute-num-layers`` counts them: 3 is its block method over 3 layers (by
    residual blocks, 3 is half a layer too many and refused; 6 is 3 layers)."""
    common = ("cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x2", "--mode", "megatron")
    for extra, want in ((("--recompute", "3", "--recompute-unit", "layers"), "3"),
                        (("--recompute", "6"), "3")):
        args, _ = _args(runner, _plan(runner, tmp_path, *common, *extra))
        assert args[-4:-1] == ["--recompute-granularity full", "--recompute-method block",
                               f"--recompute-num-layers {want}"], extra
    args, _ = _args(runner, _plan(runner, tmp_path, *common, "--recompute", "blocks",
                                  "--recompute-unit", "layers"))
    assert "--recompute-method uniform" in args


def test_uneven_first_and_last_stages(runner, tmp_path):
    """Three stages of 2, 5 and 5 transformer layers (starts at h.2 and h.7) are
    Megatron-LM's uneven first and last stages (the middle ones share what is left
    evenly); every block recomputed is its uniform method a layer at a time. Four stages
    of 2, 3, 5 and 2 are not: the middle two differ, so they are a pipeline layout (they
    were refused before it was emitted)."""
    common = ("cost", GPT2, DGX, "-p", "6", "-b", "12", "--grid", "2x1", "--mode",
              "megatron", "--pipeline", "3", "--microbatches", "4")
    plan = _plan(runner, tmp_path, *common, "--stage-starts", "h.2.attn.ln_1,h.7.attn.ln_1",
                 "--recompute", "blocks")
    args, _ = _args(runner, plan)
    assert args[:4] == ["--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 3",
                        "--decoder-first-pipeline-num-layers 2",
                        "--decoder-last-pipeline-num-layers 5"]
    assert "--micro-batch-size 3" in args  # 12 / (4 microbatches · 1 replica)
    assert args[-4:] == ["--recompute-granularity full", "--recompute-method uniform",
                         "--recompute-num-layers 1", "--optimizer sgd"]
    bad = _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "8", "-b", "16", "--grid",
                "2x1", "--mode", "megatron", "--pipeline", "4", "--microbatches", "4",
                "--stage-starts", "h.2.attn.ln_1,h.5.attn.ln_1,h.10.attn.ln_1",
                name="bad.yaml")
    args, _ = _args(runner, bad)
    assert "--pipeline-model-parallel-layout 'Et*2|t*3|t*5|t*2,L'" in args


def test_precision_and_overlap_as_megatron_runs_them(runner, tmp_path):
    """Megatron-LM reduces a bf16 model's gradients in fp32 unless told
    --grad-reduce-in-bf16, and an fp16 model's in fp16 unless told
    --accumulate-allreduce-grads-in-fp32 (its arguments.py); fp32 runs need no dtype
    flag. --tp-comm-overlap overlaps sequence parallelism's collectives only, and
    Megatron-LM refuses it without --sequence-parallel: a plan without sequence-parallel
    layers priced no overlap, so the flag is left out."""
    common = ("cost", GPT2, DGX, "-p", "16", "-b", "64", "--grid", "2x8")
    cases = [
        (("--mode", "megatron", "--precision", "bf16"), ["--bf16", "--grad-reduce-in-bf16"]),
        (("--mode", "megatron", "--precision", "bf16", "--grad-precision", "fp32"),
         ["--bf16", "--accumulate-allreduce-grads-in-fp32"]),
        (("--mode", "megatron", "--precision", "fp16"), ["--fp16"]),
        (("--mode", "megatron", "--precision", "fp16", "--grad-precision", "fp32"),
         ["--fp16", "--accumulate-allreduce-grads-in-fp32"]),
        (("--mode", "megatron", "--precision", "fp32"), []),
    ]
    for i, (extra, want) in enumerate(cases):
        args, _ = _args(runner, _plan(runner, tmp_path, *common, *extra, name=f"p{i}.yaml"))
        flags = [a for a in args if a.startswith(("--bf16", "--fp16", "--grad-reduce",
                                                  "--accumulate"))]
        assert flags == want, (extra, args)
    plain = _plan(runner, tmp_path, *common, "--mode", "megatron", "--tp-comm-overlap",
                  name="tp.yaml")
    args, _ = _args(runner, plain)
    assert "--sequence-parallel" not in args and "--tp-comm-overlap" not in args
    sp = _plan(runner, tmp_path, *common, "--mode", "megatron-sp", "--tp-comm-overlap",
               name="sp.yaml")
    args, _ = _args(runner, sp)
    assert "--sequence-parallel" in args and "--tp-comm-overlap" in args


def test_what_megatron_cannot_run(runner, tmp_path):
    """Refused, each with its reason: a searched plan that splits some layers by tokens
    and others by features (and the baseline to price instead); stages that start inside
    a transformer layer; ZeRO 2; a convolution; a grid placed by columns; tensor
    parallelism with and without sequence parallelism; an odd number of recomputed
    blocks; ZB-H1; linear layers in the integrated ``model`` layout; fp64, fp32 weights
    with bf16 gradients, and half weights without fp32 master weights."""
    searched = _plan(runner, tmp_path, "plan", LLAMA, DGX, "-p", "64", "-b", "16",
                     "--optimizer", "adam", name="searched.yaml")
    doc = json.loads(invoke(runner, "plan", LLAMA, DGX, "-p", "64", "-b", "16",
                            "--optimizer", "adam", "--format", "json").stdout)
    # the hint names the fastest of Megatron-LM's baselines that fit
    # (megatron-cp, context parallel 4x16, holds every weight and its Adam state whole:
    # 130 GiB a GPU, it does not fit)
    megatron = [b for b in doc["baselines"]
                if b["name"] in ("megatron", "megatron-sp", "megatron-cp") and b["fits"]]
    assert {b["name"] for b in megatron} == {"megatron", "megatron-sp"}
    base = min(megatron, key=lambda b: b["time_s"])
    said = _refused(runner, searched, "tensor and context parallelism are separate")
    assert (f"fastest Megatron-LM baseline, {base['name']}, {base['description']}: "
            f"{format_time(base['time_s'])} a step against its "
            f"{format_time(doc['iteration']['time_s'])}"
            ) in said
    assert "--mode megatron-cp --grid CxD" in said
    cases = [
        (("cost", GPT2, DGX, "-p", "4", "-b", "8", "--grid", "2x1", "--mode", "megatron",
          "--pipeline", "2", "--microbatches", "4", "--stage-starts", "h.5.mlp.ln_2"),
         "stage 1 starts at 'h.5.mlp.ln_2', inside a transformer layer"),
        (("cost", GPT2, DGX, "-p", "8", "-b", "8", "--zero", "2"), "ZeRO stage 2"),
        (("cost", NETWORKS / "resnet50.yaml", DGX, "-p", "8", "-b", "64"), "convolution"),
        (("cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x2", "--mode", "megatron",
          "--placement", "cols"), "by columns"),
        (("cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x2", "--mode", "megatron-sp",
          "--pin", "h.0.mlp.c_fc=column:4x2"), "37 of its 38 tensor-parallel layers are "
                                                "sequence-parallel"),
        (("cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x2", "--mode", "megatron",
          "--recompute", "3"), "recomputes 3 residual blocks"),
        (("cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x1", "--mode", "megatron",
          "--pipeline", "2", "--microbatches", "4", "--schedule", "zb-h1"), "ZB-H1"),
        # the integrated algorithm's output-split linear layers (forward all-gather) are
        # not Megatron-LM's column / row pairs, though their group sizes agree
        (("cost", GPT2, DGX, "-p", "16", "-b", "64", "--grid", "2x8", "--mode", "model"),
         "its output split by features and all-gathered after it"),
        # linear layers that are not column / row pairs, whose group sizes agree
        # (found by an audit: emitted as the real pairs' arguments before)
        (("cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x2", "--mode", "megatron",
          "--pin", "*.c_proj=column:4x2:rows"),
         "layer 'h.0.mlp.c_fc' is column 4x2 but the next layer with weights, "
         "'h.0.mlp.c_proj', is column 4x2, not its row partner"),
        (("cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x2", "--mode", "megatron",
          "--pin", "*.c_fc=row:4x2:rows"),
         "layer 'h.0.mlp.c_fc' is row 4x2 with no column layer before it"),
        (("cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x2", "--mode", "megatron",
          "--precision", "fp64"), "its weights are float64"),
        (("cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x2", "--mode", "megatron",
          "--grad-precision", "bf16"), "its gradients are bfloat16 under fp32 weights"),
        (("cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x2", "--mode", "megatron",
          "--precision", "bf16", "--no-master-weights"), "keeps no fp32 master weights"),
    ]
    for i, (args, words) in enumerate(cases):
        _refused(runner, _plan(runner, tmp_path, *args, name=f"case{i}.yaml"), words)


def test_a_malformed_plan_is_an_input_error(runner, tmp_path):
    """A layer's grid or the problem's batch edited into something else: an input error
    at its line (exit 2), no traceback."""
    plan = _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x2",
                 "--mode", "megatron")
    text = plan.read_text()
    for old, new, where in (("grid: [4, 2]", "grid: four", "$.layers"),
                            ("  batch: 8\n", "  batch: many\n", "$.problem.batch")):
        bad = tmp_path / "bad.yaml"
        head, _, tail = text.rpartition(old)  # the last: a layer's, not the placement's
        bad.write_text(head + new + tail)
        out = invoke(runner, "launch", bad, "--emit", "megatron")
        assert out.exit_code == 2 and "Traceback" not in out.output, out.output
        assert "bad.yaml:" in out.stderr and where in out.stderr, out.stderr


def test_names_cannot_inject_commands(runner, tmp_path):
    """A network named with a newline and a plan path with one: the header comments
    show them escaped, so no line of the output starts a command of its own."""
    import re

    net = tmp_path / "net.yaml"
    net.write_text(re.sub(r"(?m)^name: .*$", 'name: "gpt\\\\necho INJECTED"',
                          GPT2.read_text(), count=1))
    plan = tmp_path / "plan\necho PWNED.yaml"
    r = invoke(runner, "cost", net, DGX, "-p", "8", "-b", "8", "-o", plan, "--format", "yaml")
    assert r.exit_code == 0, r.stderr
    out = invoke(runner, "launch", plan, "--emit", "megatron")
    assert out.exit_code == 0, out.stderr
    assert not [line for line in out.stdout.splitlines() if line.startswith("echo")]
    assert out.stdout.count("\n") == len(out.stdout.splitlines())


def test_a_training_configuration_may_ask_for_megatron(runner, tmp_path):
    """``launcher: megatron`` in a training configuration: ``check`` fails (exit 1) on a
    plan Megatron-LM cannot run as planned, at the key's line, with the reason; passes a
    Megatron-LM plan; and needs a plan file (an input error otherwise, exit 2)."""
    for name, pins in (("good.yaml", ()), ("bad.yaml", ("--pin", "h.0.mlp.c_fc=column:4x2"))):
        _plan(runner, tmp_path, "cost", GPT2, DGX, "-p", "8", "-b", "8", "--grid", "4x2",
              "--mode", "megatron-sp", *pins, name=name)

    def check(strategy):
        cfg = tmp_path / "t.yaml"
        cfg.write_text(f"kind: training\nnetwork: {GPT2}\ncluster: {DGX}\ngpus: 8\nbatch: 8\n"
                       f"launcher: megatron\nstrategy: {strategy}\nmax_slowdown: 100\n")
        return invoke(runner, "check", cfg)

    ok = check("{plan: good.yaml}")
    assert ok.exit_code == 0, ok.output
    assert "[launcher] Megatron-LM can run the plan as planned" in ok.stdout
    no = check("{plan: bad.yaml}")
    assert no.exit_code == 1, no.output
    assert "t.yaml:6:1: FAIL: [launcher] Megatron-LM cannot run the plan as planned: 37 of " \
        "its 38 tensor-parallel layers are sequence-parallel" in no.stdout, no.stdout
    grid = check("{grid: 4x2, mode: megatron-sp}")
    assert grid.exit_code == 2 and "t.yaml:6" in grid.stderr and "plan file" in grid.stderr


def test_a_pipelined_plans_hint_prices_stages(runner, tmp_path):
    """A refused pipelined plan's hint names the command with its stages (a stage's
    grid, whole-layer boundaries) and says its baselines were priced without them."""
    plan = _plan(runner, tmp_path, "plan", GPT2, DGX, "-p", "16", "-b", "64", "--pipeline",
                 "2", "--microbatches", "8", "--stage-boundaries", "layers")
    said = _refused(runner, plan, "--pipeline 2 --microbatches 8 --stage-boundaries layers "
                                  "--mode megatron-sp --grid TxD")
    assert "the grid is a stage's TxD" in said
    assert "fastest Megatron-LM baseline, on all its devices without stages" in said
