"""Training configurations (``kind: training``) and the checks ``planner check`` runs.

A configuration names the network and cluster (paths relative to the configuration
file), the question (devices, batch, optimizer, precision, overlap) and the strategy the
team chose: a plan file, one grid for every layer, or pins::

    kind: training
    name: resnet50-dgx
    network: ../networks/resnet50.yaml
    cluster: ../clusters/dgx-h100.yaml
    gpus: 64
    batch: 2048                  # samples per step (all microbatches together)
    microbatches: 1              # gradient accumulation: passes of batch / N samples a step
    pipeline: 1                  # pipeline stages (1F1B over the microbatches), each on
                                 # gpus / pipeline devices
    virtual_stages: 1            # model chunks a stage (Megatron-LM's interleaved 1F1B;
                                 # microbatches a multiple of pipeline)
    schedule: 1f1b               # 1f1b | zb-h1: 1F1B with the weight gradients deferred
                                 # into the fill and drain (one chunk a stage)
    stage_boundaries: blocks     # blocks | layers: pipeline stages start between
                                 # residual blocks, or between copies of a repeat group
    stage_starts: [...]          # optional, with a grid or pins: the layers where stages
                                 # (chunks) 1 on start, in place of the balanced ones
    optimizer: momentum          # sgd | momentum | adam
    precision: float32           # the dtype of weights and activations (default: the network's)
    grad_precision: float32      # the dtype gradients are accumulated and reduced in
                                 # (default: the weights')
    overlap: gradients           # none | gradients
    tp_comm_overlap: false       # sequence-parallel collectives overlap their GEMMs
                                 # (Megatron-LM's --tp-comm-overlap)
    overlap_param_gather: false  # with zero 1-2: the updated parameters gathered under
                                 # the next step's forward (--overlap-param-gather)
    cp_comm_type: p2p            # p2p | allgather | auto: context parallelism's keys
                                 # and values (Megatron-LM's --cp-comm-type)
    cross_entropy: fused         # fused | eager | eager-no-upcast: the loss's memory
                                 # (eager: PyTorch's cross_entropy on fp32 logits, as
                                 # torchtitan runs it; no-upcast: on 16-bit logits)
    zero: 0                      # ZeRO stage 0-3: optimizer state / + gradients / + weights sharded
    zero_shard: all              # all | node: over all replicas, or within nodes (hybrid)
    recompute: none              # none | blocks | N | auto: residual blocks (or the first N)
                                 # re-run their forward in backward; auto: as few as
                                 # memory needs, for the strategy and the optimum alike
    recompute_unit: blocks       # blocks | layers: recompute each residual block, or each
                                 # copy of a repeat group as one (a transformer layer)
    algorithm: ring              # collective algorithm (default: the cluster file's)
    strategy:
      plan: plans/resnet50.yaml  # or: grid: 8x8 (+ mode: model|domain|megatron|
                                 # megatron-sp|megatron-cp), or: pins: [...]; with a
                                 # pipeline, a grid or pin is one stage's (gpus /
                                 # pipeline devices)
    max_slowdown: 1.10           # allowed ratio to the searched optimum
    min_mfu: 0.35                # optional: the least model FLOPs utilisation allowed
    launcher: megatron           # optional, with a plan: Megatron-LM must be able to run
                                 # it as planned (`planner launch --emit megatron`)

Checks: the strategy fits in memory on every device; its predicted iteration time is
within ``max_slowdown`` of the searched optimum; with ``min_mfu``, its model FLOPs
utilisation (the network's FLOPs over the devices' peak, as plans report it) is at least
that; a referenced plan still matches its
inputs (the digests of the network and cluster files it was made from, and the question,
the collective algorithm included) and is feasible. The strategy and the optimum are
priced alike: the configuration's algorithm and ``check``'s ``--estimator``; a plan's
layouts are re-priced, its recorded times are not read. With ``pipeline: S`` the
strategy's stages are a pipelined plan's own (its layers' ``stage``), or, for a grid or
pins, balanced as ``planner plan --pipeline S`` balances them; the optimum is the
search's with the same number of stages and microbatches (and, with ``virtual_stages:
V``, the same interleaving: a plan's chunks are its layers' ``stage`` and ``chunk``;
with ``schedule: zb-h1``, the same schedule).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .cluster import ALGORITHMS, Cluster
from .costs import COST_MODELS, OVERLAPS
from .costs.layer import CP_COMM_TYPES, RECOMPUTE, canonical_recompute, recompute_error
from .costs.memory import OPTIMIZERS
from .errors import InputError, Issue, NoFeasiblePlan, PlannerError, printable
from .evaluate import (
    CROSS_ENTROPY,
    DEFAULT_BUCKET_BYTES,
    ZERO_SHARDS,
    Evaluation,
    Options,
    evaluate,
    make_context,
    master_weights_error,
)
from .fields import (
    Fields,
    Invalid,
    boolean,
    bucket_size,
    choice,
    integer,
    number,
    show,
    string,
)
from .inputs import cluster_from_document, network_from_document
from .layout import (
    MODES,
    PIN_FORM,
    PLACEMENTS,
    Layout,
    holds_alike,
    make_layout,
    parse_grid,
    parse_pin,
)
from .loading import Document, Mark, load_file
from .network import BY_LAYERS, DTYPE_ALIASES, DTYPE_BYTES, Layer, Network, dtype_hint
from .plan import DEFAULT_ALGORITHM
from .schedules import SCHEDULE, SCHEDULES, ZERO_BUBBLE
from .strategies import GRID_MODES, StrategyError, fixed_assignment, why_invalid
from .units import MAX_BATCH, MAX_GPUS


@dataclass(frozen=True)
class TrainingConfig:
    """A validated training configuration."""

    name: str
    path: str
    network_path: Path
    cluster_path: Path
    gpus: int
    batch: int
    optimizer: str
    precision: str | None
    master_weights: bool | None
    grad_precision: str | None
    overlap: str
    bucket_bytes: float
    cost_model: str
    strategy: dict[str, Any]
    zero: int
    zero_shard: str
    recompute: str
    max_slowdown: float
    algorithm: str | None  #: None: the cluster's
    document: Document = field(compare=False, repr=False)
    microbatches: int = 1
    pipeline: int = 1  #: pipeline stages
    virtual_stages: int = 1  #: model chunks a stage (interleaved 1F1B)
    schedule: str = SCHEDULE  #: the pipeline schedule: 1f1b or zb-h1
    #: the layers where stages (chunks) 1 on start (None: balanced)
    stage_starts: list[str] | None = None
    #: where stages may start: between residual blocks or repeat copies (layers)
    stage_boundaries: str = "blocks"
    #: what recomputation re-runs as one: residual blocks or repeat copies (layers)
    recompute_unit: str = "blocks"
    #: the least model FLOPs utilisation the strategy may predict (None: no check)
    min_mfu: float | None = None
    #: the framework that must run the plan as planned ("megatron"; None: any)
    launcher: str | None = None
    #: sequence-parallel collectives overlap their GEMMs (``--tp-comm-overlap``)
    tp_comm_overlap: bool = False
    #: how context parallelism moves the keys and values (``--cp-comm-type``)
    cp_comm_type: str = "p2p"
    #: how the loss's cross-entropy runs (``--cross-entropy``)
    cross_entropy: str = "fused"
    #: ZeRO 1-2's gathers under the next forward (``--overlap-param-gather``)
    overlap_param_gather: bool = False
    #: the network and cluster files as the configuration names them
    named: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def stage_gpus(self) -> int:
        """The devices of one pipeline stage (all of them without a pipeline)."""
        return self.gpus // self.pipeline

    @property
    def stage_count(self) -> str:
        """How messages name the device count a grid must fill."""
        return "gpus" if self.pipeline == 1 else \
            f"a stage's devices (gpus {self.gpus} / pipeline {self.pipeline})"

    def mark(self, path: str) -> Mark:
        """Where a key of the configuration is (its key, for annotations)."""
        return self.document.find_mark(path, at_key=True)


def _schedule(value: object) -> str:
    """A configuration's ``schedule``: one the launch runs (``auto`` is the search's)."""
    if value == "auto":
        raise Invalid(f"a configuration names the schedule it runs ({', '.join(SCHEDULES)}); "
                      "`planner plan --schedule auto` finds the faster")
    return choice(SCHEDULES)(value)


def _names(value: object) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or \
            not all(isinstance(v, str) for v in value):
        raise Invalid("expected a list of layer names, the first layer of each stage after "
                      "the first")
    return list(value)


def _pins(value: object) -> list[object]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise Invalid("expected a list of pins like ['conv*=data', 'fc*=model:8x8']")
    return list(value)  # each entry is checked at its own line below


def training_from_document(doc: Document, path: str | Path) -> TrainingConfig:
    """Validate a training configuration (paths resolved against its folder)."""
    from .inputs import detect_kind

    issues: list[Issue] = []
    base = Path(path).resolve().parent
    # where its paths are relative to, as messages say it (standard input has no folder:
    # the current one; found by an audit)
    folder = (f"the current folder, {base}" if str(path) == "-" else
              f"the configuration's folder, {base}")
    kind = detect_kind(doc.data)
    if kind == "plan":
        raise doc.error([Issue("$", "this is a plan, not a training configuration; name it "
                                    "in one as 'strategy: {plan: FILE}'")])
    if kind in ("network", "cluster"):
        raise doc.error([Issue("$.kind" if isinstance(doc.data, dict) and "kind" in doc.data
                               else "$",
                               f"this is a {kind} file, not a training configuration; a "
                               f"configuration names it as '{kind}: FILE', with "
                               f"'{'cluster' if kind == 'network' else 'network'}', 'gpus' "
                               "and 'batch'")])
    if doc.data is None:  # as the network and cluster loaders say it
        raise doc.error([Issue("$", f"{doc.nothing()}: expected a YAML mapping with 'kind: "
                                    "training', 'network', 'cluster', 'gpus', 'batch' and "
                                    "'strategy'")])
    f = Fields(doc.data, "$", issues, "a training configuration")
    if not f.ok:
        raise doc.error(issues)
    kind = f.opt("kind", string, "training")
    if kind != "training":
        f.error("kind", f"expected 'kind: training', got {kind!r}")
    stdin = str(path) == "-"
    name = f.opt("name", string, "stdin" if stdin else Path(path).stem)
    f.opt_none("description", string)
    paths: dict[str, Path] = {}
    named: dict[str, str] = {}
    for key in ("network", "cluster"):
        rel = f.req(key, string)
        if rel is not None:
            named[key] = rel
            p = (base / rel).resolve()
            if p.is_dir():
                f.error(key, f"{key} '{rel}' is a directory; name the {key} YAML file in it "
                             f"(paths are relative to {folder})")
            elif p.exists() and not p.is_file():  # /dev/null, a named pipe
                f.error(key, f"{key} file '{rel}' is not a regular file; name the {key} "
                             "YAML file")
            elif not p.is_file():
                f.error(key, f"{key} file '{rel}' not found (paths are relative to "
                             f"{folder})")
            paths[key] = p
    gpus = f.req("gpus", integer(1, MAX_GPUS))
    batch = f.req("batch", integer(1, MAX_BATCH))
    microbatches = f.opt("microbatches", integer(1, MAX_BATCH), 1)
    if batch is not None and microbatches is not None and batch % microbatches:
        f.error("microbatches", f"batch {batch} does not split into {microbatches} equal "
                                "microbatches; use a divisor of the batch")
    pipeline: int | None = f.opt("pipeline", integer(1, MAX_GPUS), 1)
    if gpus is not None and pipeline is not None and gpus % pipeline:
        f.error("pipeline", f"{pipeline} stages do not split gpus {gpus} into equal "
                            f"stages; use a divisor of {gpus}")
        pipeline = None
    stage_gpus = gpus // pipeline if gpus is not None and pipeline else None
    virtual: int | None = f.opt("virtual_stages", integer(1, MAX_GPUS), 1)
    if virtual is not None and virtual > 1:
        if pipeline == 1:
            f.error("virtual_stages", f"virtual_stages {virtual} interleaves the stages of a "
                                      "pipeline; set 'pipeline' to 2 or more")
        elif pipeline and microbatches and microbatches % pipeline:
            f.error("virtual_stages", f"the interleaved schedule runs the microbatches "
                                      f"{pipeline} at a time through each stage's chunks, so "
                                      f"'microbatches' ({microbatches}) must be a multiple "
                                      f"of the {pipeline} stages")
    schedule = f.opt("schedule", _schedule, SCHEDULE)
    if schedule == ZERO_BUBBLE:
        if pipeline == 1:
            f.error("schedule", f"schedule {schedule} schedules the stages of a pipeline; "
                                "set 'pipeline' to 2 or more")
        elif virtual is not None and virtual > 1:
            f.error("schedule", f"schedule {schedule} runs one model chunk a stage; set "
                                f"'virtual_stages' to 1 or 'schedule' to {SCHEDULE} "
                                "(interleaved)")
    stage_count = "gpus" if pipeline == 1 else \
        f"a stage's devices (gpus {gpus} / pipeline {pipeline})"
    boundaries = f.opt("stage_boundaries", choice(("blocks", "layers")), "blocks")
    starts = f.opt_none("stage_starts", _names)
    if starts is not None and pipeline == 1:
        f.error("stage_starts", "stage_starts places the stages of a pipeline; set "
                                "'pipeline' to 2 or more")
    optimizer = f.opt("optimizer", choice(OPTIMIZERS), "momentum")
    precision = f.opt_none("precision", _dtype)
    master = f.opt_none("master_weights", boolean)
    grad_precision = f.opt_none("grad_precision", _dtype)
    overlap = f.opt("overlap", choice(OVERLAPS), "gradients")
    tp_overlap = f.opt("tp_comm_overlap", boolean, False)
    cp_comm = f.opt("cp_comm_type", choice(CP_COMM_TYPES), "p2p")
    param_gather = f.opt("overlap_param_gather", boolean, False)
    cross_entropy = f.opt("cross_entropy", choice(CROSS_ENTROPY), "fused")
    bucket = f.opt("bucket_size", _bucket_size, float(DEFAULT_BUCKET_BYTES))
    cost_model = f.opt("cost_model", choice(COST_MODELS), "exact")
    # `plan --zero auto` searches the setting; a launch runs one, which CI must check
    searched = [k for k in ("zero", "zero_shard") if f.data.get(k) == "auto"]
    for key in searched:
        f.seen.add(key)
        f.error(key, f"'{key}: auto' is for `planner plan`, which searches the setting; a "
                     "training configuration names the one its launch runs "
                     + ("(0-3: `planner plan --zero auto` says which)" if key == "zero" else
                        "(all or node: `planner plan --zero-shard auto` says which)"))
    zero = 0 if "zero" in searched else f.opt("zero", integer(0, 3), 0)
    zero_shard = "all" if "zero_shard" in searched else \
        f.opt("zero_shard", choice(ZERO_SHARDS), "all")
    if zero_shard != "all" and not zero:
        f.error("zero_shard", "sharding within nodes needs ZeRO: set 'zero' to 1, 2 or 3, "
                              "or drop 'zero_shard'")
    if zero and cost_model == "gholami2018":
        f.error("zero", "ZeRO needs 'cost_model: exact': the paper's accounting (Gholami "
                        "et al. 2018) has no sharded optimizer")
    if tp_overlap and cost_model == "gholami2018":
        f.error("tp_comm_overlap", "tensor-parallel overlap needs 'cost_model: exact': the "
                                   "paper's accounting (Gholami et al. 2018) has no sequence "
                                   "parallelism")
    if param_gather and zero not in (1, 2):
        f.error("overlap_param_gather", f"overlap_param_gather overlaps ZeRO stages 1 and "
                                        f"2's gathers of the updated parameters, and zero "
                                        f"{zero} " + ("has none" if zero == 0 else
                                                      "gathers before each pass") +
                                        ": set 'zero' to 1 or 2, or drop it")
    elif param_gather and overlap != "gradients":
        f.error("overlap_param_gather", "overlap_param_gather needs 'overlap: gradients': "
                                        "the gathers fill the gradients' buckets")
    if cp_comm != "p2p" and cost_model == "gholami2018":
        f.error("cp_comm_type", f"cp_comm_type {cp_comm} needs 'cost_model: exact': the "
                                "paper's accounting (Gholami et al. 2018) splits a sequence "
                                "as an image, by halo rows")
    if grad_precision is not None and cost_model == "gholami2018":
        f.error("grad_precision", "a gradient precision needs 'cost_model: exact': the "
                                  "paper's accounting (Gholami et al. 2018) moves every word "
                                  "in the network's dtype")
    for key, value, what in (("microbatches", microbatches, "gradient accumulation"),
                             ("pipeline", pipeline, "pipeline")):
        if value not in (None, 1) and cost_model == "gholami2018":
            f.error(key, f"{key}: {value} needs 'cost_model: exact': the paper's accounting "
                         f"(Gholami et al. 2018) has no {what}")
    recompute = f.opt("recompute", _recompute_setting, "none")
    recompute_unit = f.opt("recompute_unit", choice(("blocks", "layers")), "blocks")
    if recompute != "none" and cost_model == "gholami2018":
        f.error("recompute", "recomputation needs 'cost_model: exact': the paper's accounting "
                             "(Gholami et al. 2018) keeps every activation")
    slowdown = f.opt("max_slowdown", number(1.0, 1e6), 1.10)
    min_mfu = f.opt_none("min_mfu", number(0.0, 1.0, exclusive_min=True))
    launcher = f.opt_none("launcher", choice(("megatron",)))
    algorithm = f.opt_none("algorithm", choice(ALGORITHMS))
    strategy: dict[str, Any] = {}
    if f.has("strategy"):
        sf = Fields(f.raw("strategy"), f.at("strategy"), issues, "the strategy")
        given = [k for k in ("plan", "grid", "pins") if sf.has(k)]
        if sf.ok and len(given) != 1:
            sf.error(None, "give exactly one of 'plan' (a plan file), 'grid' (e.g. 8x8, "
                           f"with 'mode'), or 'pins' (a list of '{PIN_FORM}')")
        if sf.has("plan") and starts is not None:
            f.error("stage_starts", "a plan carries its own stages (its layers' 'stage'); "
                                    "drop 'stage_starts', or give a grid or pins")
        if sf.has("plan"):
            rel = sf.req("plan", string)
            if rel is not None:
                p = (base / rel).resolve()
                if p.is_dir():
                    sf.error("plan", f"plan '{rel}' is a directory; name the plan file in it")
                elif p.exists() and not p.is_file():  # /dev/null, a named pipe
                    sf.error("plan", f"plan file '{rel}' is not a regular file; name the "
                                     "plan's YAML file")
                elif not p.is_file():
                    sf.error("plan", f"plan file '{rel}' not found (make it with `planner "
                                     "plan ... -o FILE`)")
                strategy["plan"] = p
        if sf.has("grid"):
            strategy["grid"] = sf.req("grid", string)
            if strategy["grid"] is not None and stage_gpus is not None:
                try:
                    parse_grid(strategy["grid"], stage_gpus, stage_count)
                except PlannerError as exc:
                    sf.error("grid", str(exc).removeprefix("planner: error: "))
            strategy["mode"] = sf.opt("mode", choice(GRID_MODES), "model")
            strategy["placement"] = sf.opt("placement", choice(("rows", "cols")), "rows")
        elif sf.has("pins"):
            strategy["pins"] = sf.req("pins", _pins)
            for i, text in enumerate(strategy["pins"] or []):
                if not isinstance(text, str):
                    issues.append(Issue(f"{sf.at('pins')}[{i}]", "expected a pin string "
                                        f"'{PIN_FORM}', got {show(text)}"))
                    continue
                try:  # as `check` parses them, so `validate` reports the same
                    if stage_gpus is not None:
                        parse_pin(text, stage_gpus, stage_count, "pin")
                except PlannerError as exc:
                    issues.append(Issue(f"{sf.at('pins')}[{i}]",
                                        str(exc).removeprefix("planner: error: ")))
            strategy["placement"] = sf.opt("placement", choice(("rows", "cols")), "rows")
        # a grid's companions beside a plan or pins: say what they go with (an audit
        # found 'mode' beside a plan called unknown among grid, pins and plan)
        if not sf.has("grid"):
            for key in ("mode", "placement") if "plan" in strategy else ("mode",):
                if sf.has(key):  # known here: not also "unknown"
                    own = "a plan carries its own" if "plan" in strategy else \
                        "each pin names its own"
                    with_ = "'grid' (the layout of every layer)" if key == "mode" else \
                        "'grid' or 'pins'"
                    sf.error(key, f"'{key}' goes with {with_}; {own}: drop '{key}'")
        sf.finish()
    else:
        f.missing("missing required key 'strategy' (plan, grid or pins)")
    if launcher is not None and strategy and "plan" not in strategy:
        f.error("launcher", f"launcher {launcher} checks that it can run a plan file as "
                            "planned; give 'strategy: {plan: FILE}', or drop 'launcher'")
    f.finish()
    if issues:
        raise doc.error(issues)
    assert gpus is not None and batch is not None
    assert microbatches is not None and pipeline is not None and virtual is not None
    return TrainingConfig(name=name, path="<stdin>" if stdin else str(path), named=named,
                          network_path=paths["network"], cluster_path=paths["cluster"],
                          gpus=gpus, batch=batch,
                          optimizer=optimizer, precision=precision, master_weights=master,
                          grad_precision=grad_precision,
                          overlap=overlap, bucket_bytes=bucket, cost_model=cost_model,
                          strategy=strategy, zero=zero, zero_shard=zero_shard,
                          recompute=recompute, algorithm=algorithm,
                          max_slowdown=slowdown, document=doc,
                          microbatches=microbatches, pipeline=pipeline,
                          virtual_stages=virtual, stage_starts=starts,
                          stage_boundaries=boundaries, recompute_unit=recompute_unit,
                          schedule=schedule or SCHEDULE, min_mfu=min_mfu,
                          launcher=launcher,
                          tp_comm_overlap=bool(tp_overlap), cp_comm_type=cp_comm,
                          overlap_param_gather=bool(param_gather),
                          cross_entropy=cross_entropy)


def _bucket_size(value: object) -> float:
    """``bucket_size``: :func:`~planner.fields.bucket_size`, but a negative or non-finite
    number is refused with a size that is one (an audit found ``-5`` told "such as '-5
    MiB'", itself refused)."""
    import math

    if isinstance(value, (int, float)) and not isinstance(value, bool) and (
            value < 0 or not math.isfinite(value)):
        raise Invalid(f"expected a size of 0 or more with its unit, such as '25 MiB' "
                      f"(PyTorch DDP's default), got {show(value)} (0 for one bucket per "
                      "layer)")
    return bucket_size(value)


def _dtype(value: object) -> str:
    """Converter: a dtype or its short name (bf16), as its name (bfloat16)."""
    text = string(value)
    name = DTYPE_ALIASES.get(text, text)
    if name not in DTYPE_BYTES:
        raise Invalid(f"unknown precision {text!r}; {dtype_hint(text)}")
    return name


def _recompute_setting(value: object) -> str:
    """Converter: none, blocks or a number of residual blocks (the first ones)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and (value in RECOMPUTE or value.isdigit()):
        return str(int(value)) if value.isdigit() else value  # as plans write it: '2'
    if value == "auto":
        return value
    raise Invalid(f"expected none, blocks, a number of blocks or auto, got {show(value)}")


def load_training(path: str | Path) -> TrainingConfig:
    """Load and validate a training configuration."""
    return training_from_document(load_file(path), path)


# ---------------------------------------------------------------------------------------
# Checks


@dataclass
class Finding:
    """One check's outcome."""

    check: str  #: memory | speed | efficiency | plan
    ok: bool
    message: str
    key: str = "$"  #: where in the configuration the problem lies (its key's line)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckReport:
    """Everything ``planner check`` found for one configuration."""

    config: TrainingConfig
    findings: list[Finding]
    chosen_s: float | None = None
    optimum_s: float | None = None

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return all(x.ok for x in self.findings)


#: a plan's problem keys that a configuration names otherwise
_CONFIG_KEY = {"dtype": "precision", "grad_dtype": "grad_precision",
               "bucket_bytes": "bucket_size"}


def _rel(key: str, config: TrainingConfig) -> str:
    """The network or cluster file as the configuration names it (relative to its folder,
    or absolute: ``/tmp/net.yaml``, not ``../../../../tmp/net.yaml``)."""
    import os

    path = config.network_path if key == "network" else config.cluster_path
    return printable(config.named.get(key)
                     or os.path.relpath(path, Path(config.path).resolve().parent))


def _network_for(cfg: TrainingConfig) -> tuple[Network, Cluster]:
    net = network_from_document(load_file(cfg.network_path, _display(cfg.network_path)))
    net = net.in_dtype(cfg.precision).with_cross_entropy(cfg.cross_entropy)
    for key, doing in BY_LAYERS.items():  # stage_boundaries, recompute_unit
        if getattr(cfg, key) == "layers":
            by = net.by_layers(key)
            if by is None:
                raise _config_error(cfg, f"$.{key}", f"{key} layers {doing}, and the network "
                                    "has none; use blocks")
            net = by
    cl = cluster_from_document(load_file(cfg.cluster_path, _display(cfg.cluster_path)))
    return net, cl


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _file_sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _plan_assignment(cfg: TrainingConfig, net: Network, cl: Cluster, options: Options,
                     findings: list[Finding]
                     ) -> tuple[dict[int, Layout], list[int] | None, PricedWith] | None:
    """The layouts of a plan file, a pipelined plan's stage boundaries and what priced
    it, after checking it still matches its inputs (None: it does not)."""
    path: Path = cfg.strategy["plan"]
    doc = load_file(path, _display(path))
    data = doc.data
    if not isinstance(data, dict) or "layers" not in data or "inputs" not in data:
        raise doc.error([Issue("$", "not a plan document (make one with `planner plan ... "
                                    "-o FILE --format yaml`)")])
    from .launch import launch_spec

    # a plan CI passes must be one launch can start (its layers against the placement
    # once they are read with the network, below)
    # (it refuses inputs and layers not of their kind, as validate and launch do)
    launch_spec(doc, str(path), check_layers=False)
    problems = []
    names = {"network": net.name, "cluster": cl.name}
    for key, fpath in (("network", cfg.network_path), ("cluster", cfg.cluster_path)):
        entry = data["inputs"].get(key)
        want = entry.get("sha256") if isinstance(entry, dict) else None
        made = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(made, str) and made != names[key]:
            # another network (or cluster) altogether, not this one edited
            where = entry.get("file")
            problems.append(f"the plan was made for the {key} {made!r}"
                            + (f" ({printable(where)})" if isinstance(where, str) else "")
                            + f", not {names[key]!r} ({_rel(key, cfg)})")
        elif want != _file_sha(fpath):
            where = entry.get("file") if isinstance(entry, dict) else None
            if isinstance(where, str) and where not in ("", "-") \
                    and Path(where).name != fpath.name:
                # made from another file of the same name inside: not an edit of this
                # one (an audit found a copy's plan reported as this file "changed")
                problems.append(f"the plan was made from the {key} file "
                                f"{printable(where)}, and {_rel(key, cfg)} is not its bytes")
            else:
                problems.append(f"the {key} file {_rel(key, cfg)} changed since the plan "
                                "was made")
    prob = data.get("problem") or {}
    if not isinstance(prob, dict):
        prob = {}
    from .output import rounded
    from .plan import problem_record

    # a plan without gradient accumulation records no microbatches: compare them even so
    record = {"microbatches": 1, "tp_comm_overlap": False, "cp_comm_type": "p2p",
              "overlap_param_gather": False, "cross_entropy": "fused",
              **rounded(problem_record(net, options), 4)}
    if cfg.recompute == "auto":
        # the plan's own choice stands when it was made by --recompute auto: a pipeline
        # records auto (each chunk chose), a flat plan its count and the trials
        record["recompute"] = "auto"
        if prob.get("recompute") != "auto" and data.get("recompute_auto"):
            record["recompute"] = prob.get("recompute")
    # the unit says what a count of recomputed units counts: nothing where none is
    if record.get("recompute", "none") == "none" or (
            cfg.recompute == "auto" and prob.get("recompute", "none") == "none"):
        record.pop("recompute_unit", None)
    else:
        record["recompute_unit"] = cfg.recompute_unit
    for key, value in record.items():
        # a plan made before ZeRO was modelled had none
        # (and before gradients had a dtype of their own, the weights')
        had = prob.get(key, {"zero": 0, "zero_shard": "all", "recompute": "none",
                             "grad_dtype": prob.get("dtype"), "microbatches": 1,
                             "tp_comm_overlap": False, "cp_comm_type": "p2p",
                             "overlap_param_gather": False, "cross_entropy": "fused",
                             "recompute_unit": "blocks"}.get(key))
        if key.endswith("_bytes") and _same_size(had, value):
            continue  # plans before 2026-11-23 rounded sizes to 4 digits
        if had != value:
            named = _CONFIG_KEY.get(key)  # where the configuration's key is named otherwise
            problems.append(f"the plan is for {key}={_yaml(had)}, the configuration says "
                            f"{_yaml(value)}" + (f" ({named})" if named else ""))
    pipe = prob.get("pipeline")
    had_stages = pipe.get("stages") if isinstance(pipe, dict) else 1
    if had_stages != cfg.pipeline:
        problems.append(f"the plan is for pipeline={_yaml(had_stages)}, the "
                        f"configuration says {cfg.pipeline}")
    had_chunks = pipe.get("virtual_stages", 1) if isinstance(pipe, dict) else 1
    if had_chunks != cfg.virtual_stages:
        problems.append(f"the plan is for virtual_stages={_yaml(had_chunks)}, the "
                        f"configuration says {cfg.virtual_stages}")
    had_bounds = pipe.get("boundaries", "blocks") if isinstance(pipe, dict) else "blocks"
    if cfg.pipeline > 1 and had_bounds != cfg.stage_boundaries:
        problems.append(f"the plan is for stage_boundaries={_yaml(had_bounds)}, the "
                        f"configuration says {cfg.stage_boundaries}")
    had_schedule = pipe.get("schedule", SCHEDULE) if isinstance(pipe, dict) else SCHEDULE
    if cfg.pipeline > 1 and cfg.virtual_stages == 1 and had_schedule != cfg.schedule:
        problems.append(f"the plan is for schedule={_yaml(had_schedule)}, the "
                        f"configuration says {cfg.schedule}")
    # the algorithm the plan was priced with: the cluster's unless `plan --algorithm` chose
    had = prob.get("algorithm", DEFAULT_ALGORITHM)
    made = cl.algorithm if had == DEFAULT_ALGORITHM else had
    want = cfg.algorithm or cl.algorithm
    if made != want:
        why = "" if cfg.algorithm else " (the cluster's; set 'algorithm' to choose)"
        problems.append(f"the plan is for algorithm={_yaml(made)}, the configuration says "
                        f"{_yaml(want)}{why}")
    if problems:
        findings.append(Finding("plan", False, "the plan is stale: " + "; ".join(problems) +
                                " (re-run `planner plan` and commit the new plan)",
                                "$.strategy.plan"))
        return None
    by_name = {lay.name: lay for lay in net.layers}
    assignment: dict[int, Layout] = {}
    stage_of: dict[int, int] = {}
    for i, rec in enumerate(data["layers"]):
        if not isinstance(rec, dict):
            continue
        layer = by_name.get(str(rec.get("name")))
        if cfg.pipeline > 1 and layer is not None:
            st = rec.get("stage")
            if isinstance(st, bool) or not isinstance(st, int) or not 0 <= st < cfg.pipeline:
                raise doc.error([Issue(f"$.layers[{i}].stage" if "stage" in rec else
                                       f"$.layers[{i}]",
                                       f"expected the layer's pipeline stage, 0 to "
                                       f"{cfg.pipeline - 1}, got {show(st)} (the plan was "
                                       "edited; make it again)")])
            k = rec.get("chunk", 0) if cfg.virtual_stages > 1 else 0
            if isinstance(k, bool) or not isinstance(k, int) or \
                    not 0 <= k < cfg.virtual_stages:
                raise doc.error([Issue(f"$.layers[{i}].chunk" if "chunk" in rec else
                                       f"$.layers[{i}]",
                                       f"expected the layer's model chunk, 0 to "
                                       f"{cfg.virtual_stages - 1}, got {show(k)} (the plan "
                                       "was edited; make it again)")])
            # its place in the network's order of chunks
            stage_of[layer.index] = k * cfg.pipeline + st
        if "follows" in rec:
            if layer is not None and layer.has_weights:
                raise doc.error([Issue(f"$.layers[{i}].follows",
                                       f"layer '{layer.name}' has weights of its own: the "
                                       "plan gives it a layout, not a neighbour's to "
                                       "follow (the plan was edited; make it again)")])
            continue
        if layer is None or not layer.has_weights:
            raise doc.error([Issue(f"$.layers[{i}].name", f"layer {show(rec.get('name'))} is not a "
                                                           "layer with weights of the network")])
        lay = _plan_layout(rec, f"$.layers[{i}]", layer, cfg, options.batch)
        if isinstance(lay, Issue):
            raise doc.error([lay])
        assignment[layer.index] = lay
    missing = [lay.name for lay in net.layers if lay.has_weights and
               lay.index not in assignment]
    if missing:
        findings.append(Finding("plan", False, f"the plan has no layout for {missing[0]}"
                                               f"{' and others' if len(missing) > 1 else ''}",
                                "$.strategy.plan"))
        return None
    bounds = None
    if cfg.pipeline > 1:
        cut = _plan_bounds(net, cfg, stage_of)
        if isinstance(cut, Finding):
            findings.append(cut)
            return None
        bounds = cut
    for owner, tied in net.ties.items():
        for t in tied:
            if cfg.pipeline > 1 and stage_of.get(owner) != stage_of.get(t):
                continue  # each chunk keeps its own copy of a weight tied across chunks
            if t in assignment and not holds_alike(assignment[owner], assignment[t]):
                findings.append(Finding(
                    "plan", False,
                    f"layer '{net.layers[t].name}' shares its weights with "
                    f"'{net.layers[owner].name}' (tie), so one layout serves both, but the "
                    f"plan gives it {assignment[t].label()} and '{net.layers[owner].name}' "
                    f"{assignment[owner].label()} (a plan made before ties kept one layout; "
                    "re-run `planner plan` and commit the new plan)", "$.strategy.plan"))
                return None
    launch_spec(doc, str(path))  # and its layers say what its placement says
    findings.append(Finding("plan", True, "the plan matches its network, cluster and question",
                            "$.strategy.plan"))
    if cfg.launcher == "megatron":
        from .megatron import NotMegatron, megatron_args

        try:
            megatron_args(doc, str(path))
        except NotMegatron as exc:
            why = str(exc).split("cannot run this plan as planned: ", 1)[-1]
            findings.append(Finding("launcher", False, "Megatron-LM cannot run the plan as "
                                                       f"planned: {why}", "$.launcher"))
        else:
            findings.append(Finding("launcher", True, "Megatron-LM can run the plan as "
                                                      "planned (`planner launch --emit "
                                                      "megatron`)", "$.launcher"))
    rec = data["inputs"].get("models")  # launch_spec read it: a mapping with a sha256
    prob = data["problem"]  # ... and the problem: a mapping
    return assignment, bounds, PricedWith(rec["sha256"] if isinstance(rec, dict) else None,
                                          prob.get("estimator") == "roofline")


def _plan_bounds(net: Network, cfg: TrainingConfig,
                 stage_of: dict[int, int]) -> list[int] | Finding:
    """A pipelined plan's chunk boundaries ``[0, c_1, …, n]`` from its layers' places in
    the order of chunks (their stage, with interleaving ``chunk · S + stage``), or the
    finding that the plan does not cut the network as a pipeline can."""
    from .pipeline import stage_starts

    missing = [lay.name for lay in net.layers if lay.index not in stage_of]
    if missing:
        return Finding("plan", False, f"the plan has no stage for layer '{missing[0]}'"
                                      f"{' and others' if len(missing) > 1 else ''}",
                       "$.strategy.plan")
    order = [stage_of[lay.index] for lay in net.layers]
    bounds = [0] + [i for i in range(1, len(order)) if order[i] != order[i - 1]] + \
        [len(order)]
    allowed = set(stage_starts(net))
    chunks = cfg.pipeline * cfg.virtual_stages
    if order != sorted(order) or len(bounds) != chunks + 1 or order[0] != 0 or \
            order[-1] != chunks - 1 or not set(bounds[1:-1]) <= allowed:
        what = f"{cfg.pipeline} stages" if cfg.virtual_stages == 1 else \
            f"{chunks} chunks (chunk k of stage s the (k*{cfg.pipeline} + s)-th)"
        again = f"--pipeline {cfg.pipeline}" + (f" --virtual-stages {cfg.virtual_stages}"
                                                if cfg.virtual_stages > 1 else "")
        return Finding("plan", False,
                       f"the plan's stages do not cut '{net.name}' into {what} "
                       "of consecutive layers at places a stage may start (where "
                       "one tensor alone crosses; every stage with a layer with weights); "
                       f"the plan was edited: re-run `planner plan ... {again}`",
                       "$.strategy.plan")
    return bounds


def _plan_layout(rec: dict[str, Any], where: str, layer: Layer,
                 cfg: TrainingConfig, batch: int) -> Layout | Issue:
    """A plan layer's layout, or the issue that stops it (mode, grid, placement, or a
    layout the layer cannot use at ``batch`` samples, the microbatch)."""
    gpus = cfg.stage_gpus
    mode, grid, placement = rec.get("mode"), rec.get("grid"), rec.get("placement", "rows")
    if mode not in MODES:
        return Issue(f"{where}.mode" if "mode" in rec else where,
                     f"expected mode one of {', '.join(MODES)}, got {show(mode)}")
    if (not isinstance(grid, list) or len(grid) != 2 or
            any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in grid)):
        return Issue(f"{where}.grid" if "grid" in rec else where,
                     f"expected grid: [P_r, P_c], two whole numbers >= 1, got {show(grid)}")
    pr, pc = grid
    if pr * pc != gpus:
        return Issue(f"{where}.grid", f"grid {pr}x{pc} has {pr * pc} devices; the "
                                      f"configuration has {cfg.stage_count}={gpus}"
                     if cfg.pipeline > 1 else f"grid {pr}x{pc} has {pr * pc} devices; the "
                                              f"configuration has gpus={gpus}")
    if mode == "data" and pr != 1:
        return Issue(f"{where}.grid", f"layer {layer.name} is data parallel on the grid "
                                      f"{show(grid)}, and data parallelism is the grid "
                                      f"[1, {gpus}]: the plan was edited; make it again")
    if placement not in PLACEMENTS:
        return Issue(f"{where}.placement", f"expected placement one of "
                                           f"{', '.join(PLACEMENTS)}, got {show(placement)}")
    lay = make_layout(str(mode), pr, pc, str(placement))
    why = why_invalid(layer, lay, batch, cfg.cost_model == "gholami2018",
                      cfg.microbatches > 1)
    if why is not None:
        return Issue(f"{where}.grid", f"layer {layer.name} cannot use {lay.label()}: {why}")
    return lay


def _strategy_assignment(cfg: TrainingConfig, net: Network) -> dict[int, Layout]:
    """The layouts of a grid or pins strategy (pins: unmatched layers data parallel), on
    a stage's devices at the microbatch size."""
    p, b = cfg.stage_gpus, cfg.batch // cfg.microbatches
    placement = cfg.strategy.get("placement", "rows")
    grid = mode = None
    pins = []
    if "grid" in cfg.strategy:
        # checked when the config was loaded
        grid = parse_grid(cfg.strategy["grid"], p, cfg.stage_count)
        mode = cfg.strategy["mode"]
    else:  # checked when the config was loaded
        pins = [parse_pin(text, p, cfg.stage_count, "pin") for text in cfg.strategy["pins"]]
    try:
        return fixed_assignment(net, p, b, cfg.cost_model == "gholami2018", grid, mode, pins,
                                placement, cfg.microbatches > 1)
    except StrategyError as exc:
        key = "$.strategy.grid" if exc.source == "grid" else f"$.strategy.pins[{exc.source}]"
        raise _config_error(cfg, key, str(exc)) from None


def _yaml(value: object) -> str:
    """A value as a configuration file spells it (true, not Python's True)."""
    return show(value) if isinstance(value, bool) or value is None else str(value)


def _as_keys(advice: str) -> str:
    """The search's advice in a configuration's terms: its keys, not the options of
    `planner plan` (``--batch 504`` is ``batch: 504``)."""
    import re

    advice = advice.replace("(--recompute auto: as few of the", "(recompute: auto: as "
                            "few of the")
    return re.sub(r"--(gpus|batch|microbatches|zero-shard|zero|optimizer|grad-precision) ",
                  lambda m: m.group(1).replace("-", "_") + ": ", advice)


def _config_error(cfg: TrainingConfig, path: str, message: str) -> InputError:
    return cfg.document.error([Issue(path, message)])


@dataclass(frozen=True)
class PricedWith:
    """The kernel-time estimator a plan file records: the learned models' digest
    (``inputs.models.sha256``; None: none recorded) and whether it says the roofline."""

    models: str | None
    roofline: bool


@dataclass
class Prepared:
    """A configuration with its inputs loaded and its strategy resolved: what ``check``
    prices, and all that ``validate`` checks (every input error, no search)."""

    network: Network
    cluster: Cluster
    options: Options
    #: every layer with weights's layout (with a pipeline, on its stage's devices);
    #: None: the plan file is stale
    assignment: dict[int, Layout] | None
    findings: list[Finding]
    #: the stage boundaries of a pipelined plan or of ``stage_starts`` (None: balanced,
    #: or no pipeline)
    bounds: list[int] | None = None
    #: what priced a plan file (None: the strategy is not a plan, or a stale one)
    priced: PricedWith | None = None


def prepare_config(cfg: TrainingConfig) -> Prepared:
    """Load the network and cluster a configuration names and resolve its strategy
    against them (InputError at the file and key at fault: a pin that matches no layer,
    more devices than the cluster has, a plan that is not one)."""
    from .pipeline import max_stages

    net, cl = _network_for(cfg)
    options = Options(gpus=cfg.gpus, batch=cfg.batch // cfg.microbatches,
                      microbatches=cfg.microbatches, cost_model=cfg.cost_model,
                      overlap=cfg.overlap, bucket_bytes=cfg.bucket_bytes,
                      optimizer=cfg.optimizer, master_weights=cfg.master_weights,
                      zero=cfg.zero, zero_shard=cfg.zero_shard,
                      recompute="none" if cfg.recompute == "auto" else
                      canonical_recompute(cfg.recompute, len(net.recompute_units)),
                      algorithm=cfg.algorithm, grad_dtype=cfg.grad_precision,
                      tp_comm_overlap=cfg.tp_comm_overlap, cp_comm_type=cfg.cp_comm_type,
                      overlap_param_gather=cfg.overlap_param_gather,
                      cross_entropy=cfg.cross_entropy)
    limit = cl.max_devices()
    if limit is not None and cfg.gpus > limit:
        raise _config_error(cfg, "$.gpus", f"gpus={cfg.gpus} is more than the cluster has "
                                           f"({limit})")
    wrong = None if cfg.recompute == "auto" else recompute_error(
        cfg.recompute, len(net.recompute_units), net.recompute_unit)
    if wrong:
        raise _config_error(cfg, "$.recompute", wrong)
    wrong = master_weights_error(net, options)
    if wrong:
        raise _config_error(cfg, "$.master_weights", f"{wrong}; drop 'master_weights', or "
                                                     "set 'precision: bfloat16'")
    most = max_stages(net)
    if cfg.pipeline > most:
        raise _config_error(cfg, "$.pipeline",
                            f"'{net.name}' can be cut into at most {most} stage"
                            f"{'s' if most > 1 else ''} (a stage boundary falls where one "
                            "tensor alone crosses, between residual blocks, and every stage "
                            "needs a layer with weights)")
    if cfg.pipeline * cfg.virtual_stages > most:
        raise _config_error(cfg, "$.virtual_stages",
                            f"{cfg.pipeline} stages of {cfg.virtual_stages} chunks are "
                            f"{cfg.pipeline * cfg.virtual_stages} chunks, and '{net.name}' "
                            f"can be cut into at most {most} (a boundary falls where one "
                            "tensor alone crosses, between residual blocks, and every chunk "
                            "needs a layer with weights)")
    findings: list[Finding] = []
    bounds, priced = None, None
    if "plan" in cfg.strategy:
        got = _plan_assignment(cfg, net, cl, options, findings)
        assignment, bounds, priced = got if got is not None else (None, None, None)
    else:
        assignment = _strategy_assignment(cfg, net)
        if cfg.stage_starts is not None:
            from .pipeline import given_bounds

            try:
                bounds = given_bounds(net, cfg.stage_starts,
                                      cfg.pipeline * cfg.virtual_stages)
            except ValueError as exc:
                where = "$.stage_starts" if exc.args[1] is None else \
                    f"$.stage_starts[{exc.args[1]}]"
                raise _config_error(cfg, where, exc.args[0]) from None
    return Prepared(net, cl, options, assignment, findings, bounds, priced)


@dataclass
class _StageQuestion:
    """What the pipeline planner asks of a question (the CLI's has more)."""

    network: Network
    cluster: Cluster
    options: Options
    ctx: Any


def _price_auto(ctx: Any, options: Options, assignment: dict[int, Layout]
                ) -> tuple[Evaluation, Any, Options]:
    """A strategy under ``recompute: auto``, as ``planner cost --recompute auto`` prices
    it (:func:`~planner.search.price_least_recomputed`), with the context and options
    of the count taken."""
    from .search import price_least_recomputed

    return price_least_recomputed(ctx, options,
                                  lambda c, o: (evaluate(c, o, assignment), c, o),
                                  lambda p: bool(p[0].memory.fits))[0]


def _search_auto(ctx: Any, options: Options, auto: bool) -> tuple[Any, Any, Options]:
    """The searched optimum, with ``auto`` recomputing as few blocks as its memory
    needs (:func:`~planner.search.search_recompute`, as ``planner plan --recompute
    auto``)."""
    from .search import search, search_recompute

    if not auto:
        return search(ctx, options), ctx, options
    return search_recompute(ctx, options, lambda c, o, *_: (search(c, o), c, o))


def _pipeline_check(prep: Prepared, cfg: TrainingConfig, ctx: Any
                    ) -> tuple[Any, Any, NoFeasiblePlan | None]:
    """The strategy's pipeline priced, and the searched optimum with as many stages
    (None, and why, when nothing fits); under ``recompute: auto`` each chunk
    recomputes as its memory needs, in both."""
    from .pipeline import price_pipeline, search_pipeline

    q = _StageQuestion(prep.network, prep.cluster, prep.options, ctx)
    auto = cfg.recompute == "auto"

    def context(net: Network, options: Options) -> Any:
        return make_context(net, prep.cluster, options, ctx.estimator)

    def price(sq: _StageQuestion, assignment: dict[int, Layout]) -> Evaluation:
        if not auto:
            return evaluate(sq.ctx, sq.options, assignment)
        ev, sq.ctx, sq.options = _price_auto(sq.ctx, sq.options, assignment)
        return ev

    def run(sq: _StageQuestion, objective: str, pins: Any) -> Any:
        result, sq.ctx, sq.options = _search_auto(sq.ctx, sq.options, auto)
        return result

    assert prep.assignment is not None
    chosen = price_pipeline(q, cfg.pipeline, prep.assignment, price, context,
                            prep.bounds, cfg.virtual_stages, cfg.schedule)
    try:
        best = search_pipeline(q, cfg.pipeline, "time", (), run, context,
                               cfg.virtual_stages, cfg.schedule)
    except NoFeasiblePlan as exc:
        return chosen, None, exc
    return chosen, best, None


def _other_models(priced: PricedWith | None, estimator: Any) -> str | None:
    """Why a plan file was priced with other kernel models than ``estimator`` times
    kernels with, or None (the same models, the roofline both ways, or a plan from before
    plans recorded their models, whose models cannot be told)."""
    from .cli_plan import models_digest

    if priced is None:
        return None
    made, now = priced.models, models_digest(estimator)
    if made is None and (not priced.roofline or now is None):
        return None
    if made == now:
        return None

    def which(d: object) -> str:
        return f"the kernel models {str(d)[:12]}..." if d else "the roofline"

    return (f"the plan was priced with {which(made)} and check prices with {which(now)}: "
            "give check the plan's models (--models-dir DIR or PLANNER_MODELS; "
            "--estimator roofline for the roofline), or re-run `planner plan` with these "
            "and commit the new plan")


def check_config(cfg: TrainingConfig, estimator: Any = None) -> CheckReport:
    """Run every check on one configuration (input errors raise InputError)."""

    prep = prepare_config(cfg)
    net, cl, options, findings = prep.network, prep.cluster, prep.options, prep.findings
    ctx = make_context(net, cl, options, estimator)
    assignment = prep.assignment
    other = _other_models(prep.priced, estimator)
    if other is not None:  # the plan's own finding said it matched
        findings[:] = [f for f in findings if f.check != "plan"]
        findings.append(Finding("plan", False, other, "$.strategy.plan"))
        return CheckReport(cfg, findings)
    if assignment is None:
        return CheckReport(cfg, findings)
    key = "$.strategy"
    from .units import format_bytes, format_time

    failure: NoFeasiblePlan | None = None
    if cfg.pipeline > 1:
        res, best_res, failure = _pipeline_check(prep, cfg, ctx)
        chosen_s = float(res.time_s)
        mem = res.memories[res.fullest]
        where = f" (in pipeline stage {res.fullest}, the fullest of stages " \
                f"0-{cfg.pipeline - 1})"
        best_s = None if best_res is None else float(best_res.time_s)
    else:
        auto = cfg.recompute == "auto"
        chosen: Evaluation = _price_auto(ctx, options, assignment)[0] if auto else \
            evaluate(ctx, options, assignment)
        chosen_s = chosen.time_s
        mem = chosen.memory
        where = ""
        try:
            best_s = _search_auto(ctx, options, auto)[0].best.evaluation.time_s
        except NoFeasiblePlan as exc:
            from .search import leanest_fits, more_devices_checked

            def search_at(n: int) -> None:
                at_ctx, at_options = replace(ctx, gpus=n), replace(options, gpus=n)
                if not leanest_fits(at_ctx, at_options):  # fits: a plan does
                    _search_auto(at_ctx, at_options, auto)

            failure = more_devices_checked(exc, options.gpus, options.batch,
                                           cl.max_devices(), search_at)
            best_s = None
    peak_text, cap_text = format_bytes(mem.peak), format_bytes(mem.capacity)
    if peak_text == cap_text and mem.peak != mem.capacity:  # a few bytes apart: say so
        peak_text, cap_text = f"{mem.peak:,.0f} bytes", f"{mem.capacity:,.0f}"
    findings.append(Finding(
        "memory", mem.fits,
        f"the strategy {'fits' if mem.fits else 'does not fit'} in memory: "
        f"{peak_text} per device of {cap_text}{where}",
        key, {"peak_bytes": mem.peak, "capacity_bytes": mem.capacity}))
    if cfg.min_mfu is not None:
        from .plan import utilisation

        use = utilisation(net, cl.device, options.gpus, options.step_batch, chosen_s)
        enough = use["mfu"] >= cfg.min_mfu * (1 - 1e-9)
        findings.append(Finding(
            "efficiency", enough,
            f"predicted MFU {_apart(use['mfu'] * 100, cfg.min_mfu * 100, 1)[0]}% "
            f"({use['tflops_per_device']:.4g} TFLOP/s a "
            f"device of the network's FLOPs) is {'at least' if enough else 'under'} the "
            f"{_apart(use['mfu'] * 100, cfg.min_mfu * 100, 1)[1]}% required (min_mfu)",
            "$.min_mfu", {"mfu": use["mfu"], "min_mfu": cfg.min_mfu}))
    if best_s is None:
        assert failure is not None
        why = _as_keys(str(failure).removeprefix("planner: "))
        # the keys of every speed finding, null where nothing fits (a reader indexing
        # "ratio" met a KeyError: an audit)
        findings.append(Finding("speed", False, f"no plan fits at all: {why}", key,
                                {"time_s": chosen_s, "optimum_s": None, "ratio": None,
                                 "max_slowdown": cfg.max_slowdown}))
        return CheckReport(cfg, findings, chosen_s, None)
    ratio = chosen_s / best_s if best_s > 0 else 1.0
    ok = ratio <= cfg.max_slowdown * (1 + 1e-9)
    stages = f" with {cfg.pipeline} pipeline stages" if cfg.pipeline > 1 else ""
    if cfg.virtual_stages > 1:
        stages += f" of {cfg.virtual_stages} model chunks"
    if cfg.pipeline > 1 and cfg.schedule != SCHEDULE:
        stages += f" under {cfg.schedule}"
    findings.append(Finding(
        "speed", ok,
        f"predicted iteration {format_time(chosen_s)} is "
        f"{_apart(ratio, cfg.max_slowdown, 3)[0]}x the searched optimum{stages} "
        f"{format_time(best_s)} (allowed: {cfg.max_slowdown:g}x)",
        key, {"time_s": chosen_s, "optimum_s": best_s, "ratio": ratio,
              "max_slowdown": cfg.max_slowdown}))
    return CheckReport(cfg, findings, chosen_s, best_s)


def _apart(value: float, limit: float, digits: int) -> tuple[str, str]:
    """``value`` and ``limit`` with ``digits`` decimals, or as many more as it takes to
    show them apart where they differ: a ratio of 1.08105 against an allowed 1.081 read
    "1.081x (allowed: 1.081x)" and failed (an audit)."""
    d = digits
    while d < 12 and value != limit and f"{value:.{d}f}" == f"{limit:.{d}f}":
        d += 1
    return f"{value:.{d}f}", f"{limit:.{d}f}"


def report_data(reports: list[CheckReport], errors: list[InputError]) -> dict[str, Any]:
    """Plain data for ``--format json``."""
    from .output import rounded

    out: dict[str, Any] = {"ok": all(r.ok for r in reports) and not errors, "configs": []}
    for r in reports:
        out["configs"].append({
            "config": r.config.path, "name": r.config.name, "ok": r.ok,
            "checks": [{"check": x.check, "ok": x.ok, "message": x.message,
                        "line": r.config.mark(x.key).line + 1,
                        "column": r.config.mark(x.key).column + 1, **x.data}
                       for x in r.findings]})
    # line and column null: about the file itself (missing, unreadable, empty)
    out["errors"] = [{"file": p.file, "line": p.line or None, "column": p.column or None,
                      "message": p.message, "path": p.path}
                     for e in errors for p in e.problems]
    return rounded(out, 4)  # type: ignore[no-any-return]


def github_lines(reports: list[CheckReport], errors: list[InputError]) -> list[str]:
    """GitHub Actions workflow commands: ``::error file=F,line=L::message``."""
    lines: list[str] = []

    def where(file: str, line: int, column: int) -> str:
        # standard input is no file of the repository: an annotation without a place
        if file == "<stdin>":
            return ""
        if line == 0:  # the file itself: an annotation on the file, not a line
            return f"file={prop(file)},"
        return f"file={prop(file)},line={line},col={column},"

    def esc(text: str) -> str:
        return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    def prop(text: str) -> str:
        return esc(text).replace(":", "%3A").replace(",", "%2C")

    for r in reports:
        for x in r.findings:
            m = r.config.mark(x.key)
            level = "error" if not x.ok else "notice"
            lines.append(f"::{level} {where(r.config.path, m.line + 1, m.column + 1)}"
                         f"title={prop('planner check: ' + x.check)}::{esc(x.message)}")
    for e in errors:
        for p in e.problems:
            lines.append(f"::error {where(p.file, p.line, p.column)}"
                         f"title={prop('planner: invalid input')}::{esc(p.message)}")
    return lines


def text_lines(reports: list[CheckReport]) -> list[str]:
    """A person's view: one line per check."""
    lines = []
    for r in reports:
        for x in r.findings:
            m = r.config.mark(x.key)
            status = "ok" if x.ok else "FAIL"
            lines.append(f"{r.config.path}:{m.line + 1}:{m.column + 1}: {status}: "
                         f"[{x.check}] {x.message}")
    return lines


__all__ = ["CheckReport", "TrainingConfig", "check_config", "load_training"]


def _same_size(had: object, value: object) -> bool:
    """Whether a size recorded in a plan is ``value`` bytes, to the 4 significant digits
    older plans kept."""
    from .output import round_sig

    numbers = (int, float)
    return (isinstance(had, numbers) and not isinstance(had, bool)
            and isinstance(value, numbers) and round_sig(float(had)) == round_sig(float(value)))
