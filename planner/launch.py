"""What each node needs to start a plan: ``planner launch PLAN --emit torchrun|slurm|env``.

Ranks follow the plan's placement: rank ``k`` runs on node ``k // g``, local device
``k mod g`` (``g`` devices per node). torchrun numbers ranks the same way
(the running total of the nodes' process counts before ``node_rank``, plus
``local_rank``), and so does Slurm with block distribution
(``SLURM_PROCID``), so the row and column groups the plan lists are the groups the job
builds.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from .cluster import ALGORITHMS
from .costs import COST_MODELS, OVERLAPS
from .costs.memory import OPTIMIZERS
from .errors import Issue, UsageError, printable
from .fields import show
from .loading import Document
from .network import DTYPE_BYTES
from .plan import DEFAULT_ALGORITHM
from .schedules import INTERLEAVED, SCHEDULE, SCHEDULES, ZERO_BUBBLE
from .units import MAX_BATCH, MAX_GPUS, count

EMITTERS = ("torchrun", "slurm", "env", "megatron")  #: megatron: planner.megatron


@dataclass(frozen=True)
class LaunchSpec:
    """Node count, processes per node and the rank placement of a plan."""

    name: str
    nodes: int
    per_node: int
    world: int
    grids: list[dict[str, Any]]
    zero: int = 0  #: the plan's ZeRO stage
    zero_shard: str = "all"  #: over all replicas, or within nodes
    device_kind: str = "gpu"  #: gpu or cpu (plans before 2026-11-24 name none: gpu)
    fits: bool = True  #: the plan's memory.fits
    dtype: str = "float32"  #: the weights' and activations' dtype
    grad_dtype: str = "float32"  #: the gradients' (plans before 2026-11-24: the weights')
    stages: int = 1  #: pipeline stages, each on world / stages consecutive ranks
    microbatches: int = 1
    virtual_stages: int = 1  #: model chunks a stage (interleaved 1F1B)
    schedule: str = SCHEDULE  #: the pipeline schedule (1f1b, interleaved-1f1b, zb-h1)
    #: sequence-parallel collectives overlap their GEMMs (``--tp-comm-overlap``)
    tp_comm_overlap: bool = False
    #: ZeRO 1-2's gathers under the next step's forward (``--overlap-param-gather``)
    overlap_param_gather: bool = False
    #: how each context-parallel attention layer moves its keys and values, in layer
    #: order (p2p or allgather; Megatron-LM's ``--cp-comm-type`` p2p or all_gather)
    cp_comm_types: tuple[str, ...] = ()

    @property
    def fsdp(self) -> str | None:
        """PyTorch FSDP's sharding strategy for the plan's ZeRO setting (None: stage 0,
        or stage 1, which FSDP does not have)."""
        names = {(2, "all"): "SHARD_GRAD_OP", (3, "all"): "FULL_SHARD",
                 (2, "node"): "_HYBRID_SHARD_ZERO2", (3, "node"): "HYBRID_SHARD"}
        return names.get((self.zero, self.zero_shard))

    @property
    def last_node_procs(self) -> int:
        """Processes on the last node (fewer when P is not a multiple of g)."""
        return self.world - (self.nodes - 1) * self.per_node

    @property
    def procs(self) -> int:
        """Processes a node starts: ``g``, or all ranks when they fit on one node."""
        return min(self.per_node, self.world)

    @property
    def uneven(self) -> bool:
        """Whether the last of several nodes runs fewer processes than the others."""
        return self.nodes > 1 and self.last_node_procs != self.per_node


def launch_spec(doc: Document, plan_path: str, check_layers: bool = True) -> LaunchSpec:
    """Read the placement of a plan document (from ``planner plan`` or ``planner cost``);
    a missing, malformed or inconsistent placement is an :class:`InputError` naming
    every problem at its line. With ``check_layers`` the layers' layouts are checked
    against the placement too (``planner check`` first reads them with the network,
    whose errors say more)."""
    data = doc.data
    if isinstance(data, dict) and "plan" in data and data.get("plan") is None \
            and "placement" not in data:
        # what `planner plan --format yaml|json` prints when nothing fits (exit 1)
        why = data.get("error")
        raise doc.error([Issue("$.plan", "the document records that no plan was found"
                                         + (f" ({printable(why)})" if isinstance(why, str)
                                            else "")
                                         + "; nothing to launch until `planner plan` "
                                         "finds one")])
    if not isinstance(data, dict) or not isinstance(data.get("placement"), dict):
        raise doc.error([Issue("$", "not a plan with a placement (make one with `planner "
                                    "plan ... --format yaml -o FILE`)")])
    pl = data["placement"]
    issues: list[Issue] = []
    values: dict[str, int] = {}
    for key in ("devices", "devices_per_node", "nodes"):
        if key not in pl:
            issues.append(Issue("$.placement", f"the placement needs '{key}'"))
            continue
        value = pl[key]
        if isinstance(value, bool) or not isinstance(value, int) \
                or not 1 <= value <= MAX_GPUS:
            issues.append(Issue(f"$.placement.{key}", f"expected a whole number from 1 to "
                                                      f"2^30, got {show(value)}"))
            continue
        values[key] = value
    if issues:
        raise doc.error(issues)
    world, per_node, nodes = values["devices"], values["devices_per_node"], values["nodes"]
    if nodes != -(-world // per_node):
        issues.append(Issue("$.placement.nodes",
                            f"{world} devices at {per_node} a node take "
                            f"{count(-(-world // per_node), 'node')}, not {nodes}"))
    problem = data.get("problem")
    if not isinstance(problem, dict):
        issues.append(Issue("$.problem" if "problem" in data else "$",
                            f"expected the plan's problem (a mapping: its batch, optimizer "
                            f"and the rest), got {show(problem)}: make the plan again"))
    else:
        _problem_issues(problem, issues)
    layers = data.get("layers")
    if not isinstance(layers, list) or not layers:
        issues.append(Issue("$.layers" if "layers" in data else "$",
                            f"expected the plan's layers (a list of mappings), got "
                            f"{'an empty list' if layers == [] else show(layers)}: make the "
                            "plan again"))
    else:
        issues += [Issue(f"$.layers[{i}]", f"expected a layer (a mapping), got {show(lay)}")
                   for i, lay in enumerate(layers) if not isinstance(lay, dict)]
    inputs = data.get("inputs")
    if not isinstance(inputs, dict):
        issues.append(Issue("$.inputs" if "inputs" in data else "$",
                            f"expected the files the plan was made from (a mapping: network "
                            f"and cluster, each with its file and sha256), got "
                            f"{show(inputs)}: the plan was edited; make it again"))
    else:
        # what launch -o must not overwrite and what check compares: as the plan wrote it
        for key in ("network", "cluster"):
            entry = inputs.get(key)
            if not isinstance(entry, dict):
                issues.append(Issue(f"$.inputs.{key}" if key in inputs else "$.inputs",
                                    f"expected the {key} file the plan was made from (a "
                                    f"mapping with its file, name and sha256), got "
                                    f"{show(entry)}: the plan was edited; make it again"))
                continue
            for field in ("file", "name", "sha256"):
                value = entry.get(field)
                if field not in entry:
                    issues.append(Issue(f"$.inputs.{key}", f"the {key} entry lacks its "
                                        f"{field}: the plan was edited; make it again"))
                elif not isinstance(value, str) or not value:
                    issues.append(Issue(f"$.inputs.{key}.{field}",
                                        f"expected the {key}'s {field} as text, got "
                                        f"{show(value)}: the plan was edited; make it again"))
    models = inputs.get("models") if isinstance(inputs, dict) else None
    if models is not None and not (isinstance(models, dict) and isinstance(
            models.get("sha256"), str) and len(models["sha256"]) == 64):
        issues.append(Issue("$.inputs.models", f"expected the kernel models' digest, "
                                               f"{{sha256: <64 hex digits>}}, got "
                                               f"{show(models)}: the plan was edited; make "
                                               "it again"))
    if data.get("objective", "time") not in ("time", "comm"):
        issues.append(Issue("$.objective", f"expected time or comm (what the search "
                                           f"minimised), got {show(data['objective'])}"))
    memory = data.get("memory")
    if isinstance(memory, dict) and not isinstance(memory.get("fits", False), bool):
        issues.append(Issue("$.memory.fits", f"expected true or false, got "
                                             f"{show(memory['fits'])}"))
    zero, zero_shard = 0, "all"
    dtype, grad_dtype = "float32", None
    if isinstance(problem, dict):
        dtype, grad_dtype = problem.get("dtype", "float32"), problem.get("grad_dtype")
        for key, value in (("dtype", dtype), ("grad_dtype", grad_dtype)):
            if value is not None and (not isinstance(value, str) or value not in DTYPE_BYTES):
                issues.append(Issue(f"$.problem.{key}", f"expected one of "
                                                        f"{', '.join(DTYPE_BYTES)}, got "
                                                        f"{show(value)}"))
        zero = problem.get("zero", 0)
        zero_shard = problem.get("zero_shard", "all")
        if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
            issues.append(Issue("$.problem.zero", f"expected a ZeRO stage 0-3, got {show(zero)}"))
        if zero_shard not in ("all", "node"):
            issues.append(Issue("$.problem.zero_shard", f"expected all or node, got "
                                                        f"{show(zero_shard)}"))
    if isinstance(problem, dict) and "batch" in problem:
        batch = problem["batch"]
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            issues.append(Issue("$.problem.batch", f"expected the step's samples, a whole "
                                                   f"number >= 1, got {show(batch)}"))
    flags: dict[str, bool] = {}
    for key in ("tp_comm_overlap", "overlap_param_gather"):
        value = isinstance(problem, dict) and problem.get(key, False)
        if not isinstance(value, bool):
            issues.append(Issue(f"$.problem.{key}", f"expected true or false, got "
                                                    f"{show(value)}"))
        flags[key] = value is True
    if isinstance(problem, dict) and not issues:
        for key, mine, want in (("gpus", "devices", world), ("nodes", "nodes", nodes)):
            got = problem.get(key)
            if got is not None and (isinstance(got, bool) or not isinstance(got, int)
                                    or got < 1):
                # the problem's own value is what is wrong: said there (an audit found
                # it said at the placement's)
                issues.append(Issue(f"$.problem.{key}", f"expected a whole number >= 1, got "
                                                        f"{show(got)}: the plan was edited; "
                                                        "make it again"))
            elif got is not None and got != want:
                issues.append(Issue(f"$.placement.{mine}", f"{want} here, but the problem "
                                                           f"says {key}: {show(got)}: the plan "
                                                           "was edited; make it again"))
    stages, microbatches, virtual, schedule = 1, 1, 1, SCHEDULE
    if isinstance(problem, dict):
        microbatches = problem.get("microbatches", 1)
        if isinstance(microbatches, bool) or not isinstance(microbatches, int) \
                or microbatches < 1:
            issues.append(Issue("$.problem.microbatches", f"expected a whole number of "
                                                          f"microbatches, got "
                                                          f"{show(microbatches)}"))
            microbatches = 1
        pipe = problem.get("pipeline")
        if pipe is not None and not isinstance(pipe, dict):
            issues.append(Issue("$.problem.pipeline", f"expected the pipeline as a mapping "
                                                      f"(stages: S, ...), got {show(pipe)}"))
        elif pipe is not None:
            asked = pipe.get("stages")
            if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1 \
                    or world % asked:
                issues.append(Issue("$.problem.pipeline.stages" if "stages" in pipe else
                                    "$.problem.pipeline", f"expected the stages as a "
                                                          f"divisor of the {world} devices, "
                                                          f"got {show(asked)}"))
            else:
                stages = asked
            chunks = pipe.get("virtual_stages", 1)
            if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
                issues.append(Issue("$.problem.pipeline.virtual_stages",
                                    f"expected the model chunks a stage, a whole number "
                                    f">= 1, got {show(chunks)}"))
            else:
                virtual = chunks
            order = pipe.get("schedule", SCHEDULE)
            if order not in (*SCHEDULES, INTERLEAVED):
                issues.append(Issue("$.problem.pipeline.schedule",
                                    f"expected {', '.join(SCHEDULES)} or {INTERLEAVED}, "
                                    f"got {show(order)}"))
            else:
                schedule = order
    run = data.get("pipeline")
    if isinstance(run, dict) and "microbatches" in run and isinstance(problem, dict) \
            and run["microbatches"] != problem.get("microbatches", 1):
        # the question's count and the priced pipeline's: an edit to one launches
        # another batch split than was priced (found by an audit)
        issues.append(Issue("$.pipeline.microbatches",
                            f"{show(run['microbatches'])} here, but the problem says "
                            f"microbatches: {show(problem.get('microbatches', 1))}: the plan "
                            "was edited; make it again"))
    size = world // stages  # the devices of a stage, which its grids cover
    inputs = data.get("inputs")
    network = inputs.get("network") if isinstance(inputs, dict) else None
    name = network.get("name") if isinstance(network, dict) else None
    grids = pl.get("grids", [])
    shaped: list[dict[str, Any]] = []
    owner: dict[str, tuple[int, dict[str, Any]]] = {}  # layer name -> its placement grid
    if not isinstance(grids, list):
        issues.append(Issue("$.placement.grids", f"expected a list of grids, got "
                                                 f"{type(grids).__name__}"))
        grids = []
    for i, g in enumerate(grids):
        where = f"$.placement.grids[{i}]"
        if not isinstance(g, dict):
            issues.append(Issue(where, "expected a mapping with grid and placement"))
            continue
        grid, placement = g.get("grid"), g.get("placement")
        if not (isinstance(grid, list) and len(grid) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in grid)):
            issues.append(Issue(f"{where}.grid" if "grid" in g else where,
                                f"expected the grid as [P_r, P_c], two whole numbers >= 1, "
                                f"got {show(grid)}"))
            continue
        if grid[0] * grid[1] != size:
            issues.append(Issue(f"{where}.grid", f"grid {grid[0]}x{grid[1]} has "
                                                 f"{grid[0] * grid[1]} devices, the plan "
                                                 f"{world}" + (f" in {stages} pipeline "
                                                               f"stages of {size}"
                                                               if stages > 1 else "")))
            continue
        stage = _grid_index(g, "stage", stages, "pipeline stage", where, issues)
        if stage is None:
            continue
        if placement not in ("rows", "cols"):
            issues.append(Issue(f"{where}.placement" if "placement" in g else where,
                                f"expected placement rows or cols, got {show(placement)}"))
            continue
        chunk = _grid_index(g, "chunk", virtual, "model chunk", where, issues)
        if chunk is None:
            continue
        listed = g.get("layers", [])  # absent: no layer is checked against this grid
        if "layers" in g and not (isinstance(listed, list) and listed and all(
                isinstance(n, str) for n in listed)):
            issues.append(Issue(f"{where}.layers",
                                "expected the names of the grid's layers, got "
                                f"{'none' if listed == [] else show(listed)}: the plan was "
                                "edited; make it again"))
            continue
        bad_group = _group_issue(g, grid, where, per_node, (stage * size) % per_node)
        if bad_group is not None:
            issues.append(bad_group)
            continue
        listed_ranks = _ranks_issue(g, grid, placement, stage * size, where)
        if listed_ranks is not None:
            issues.append(listed_ranks)
            continue
        first = g.get("first_rank", stage * size)
        if first != stage * size:
            issues.append(Issue(f"{where}.first_rank", f"stage {stage} starts at rank "
                                                       f"{stage * size} ({size} ranks a "
                                                       f"stage), not {show(first)}: the plan "
                                                       "was edited; make it again"))
            continue
        shaped.append({"grid": [grid[0], grid[1]], "placement": placement,
                       **({"stage": stage} if stages > 1 else {}),
                       **({"chunk": chunk} if virtual > 1 else {})})
        for member in listed:
            owner.setdefault(member, (i, shaped[-1]))
    _names_issues(layers, owner, issues)
    if not issues:
        missing = sorted(set(range(stages)) - {s.get("stage", 0) for s in shaped})
        if missing:
            issues.append(Issue("$.placement.grids", f"no grid for pipeline stage "
                                                     f"{missing[0]} of {stages}: the plan was "
                                                     "edited; make it again"))
        chunks = sorted(set(range(virtual)) - {s.get("chunk", 0) for s in shaped})
        if virtual > 1 and chunks and not missing:
            issues.append(Issue("$.placement.grids", f"no grid for model chunk {chunks[0]} of "
                                                     f"the {virtual} a stage: the plan was "
                                                     "edited; make it again"))
        if check_layers:
            _check_layers(data.get("layers"), owner, size, stages, virtual, issues)
    kind = pl.get("device_kind", "gpu")
    if kind not in ("gpu", "cpu"):
        issues.append(Issue("$.placement.device_kind", f"expected gpu or cpu, got "
                                                       f"{show(kind)}"))
    if issues:
        raise doc.error(issues)
    fits = not (isinstance(memory, dict) and memory.get("fits") is False)
    return LaunchSpec(printable(name) if isinstance(name, str) and name else "plan",
                      nodes, per_node, world, shaped, int(zero), str(zero_shard), kind, fits,
                      str(dtype), str(grad_dtype or dtype), stages, microbatches, virtual,
                      schedule, flags["tp_comm_overlap"], flags["overlap_param_gather"],
                      _cp_comm_types(data.get("layers")))


#: what a plan's ``problem`` records for these settings (the command line's choices)
_PROBLEM_CHOICES = {"optimizer": OPTIMIZERS, "overlap": OVERLAPS, "cost_model": COST_MODELS}


def _problem_issues(problem: dict[str, Any], issues: list[Issue]) -> None:
    """The settings of a plan's ``problem`` that launch, check and the Megatron-LM
    arguments read, each of its kind (an edited value is an input error at its line, not
    a stale plan or a different launch)."""
    for key, options in _PROBLEM_CHOICES.items():
        if key in problem and problem[key] not in options:
            issues.append(Issue(f"$.problem.{key}", f"expected one of {', '.join(options)}, "
                                                    f"got {show(problem[key])}"))
    # found by an audit: edited to anything, these were called a stale plan by check
    # (exit 1) or printed into Megatron-LM's refusal
    recompute = problem.get("recompute", "none")
    if not ((isinstance(recompute, str) and (recompute in ("none", "auto", "blocks")
                                             or recompute.isdigit()))
            or (isinstance(recompute, int) and not isinstance(recompute, bool)
                and recompute >= 0)):
        issues.append(Issue("$.problem.recompute", f"expected none, auto, blocks or a number "
                                                   f"of blocks, got {show(recompute)}"))
    algorithm = problem.get("algorithm", DEFAULT_ALGORITHM)
    if algorithm != DEFAULT_ALGORITHM and algorithm not in ALGORITHMS:
        issues.append(Issue("$.problem.algorithm", f"expected {DEFAULT_ALGORITHM} or one of "
                                                   f"{', '.join(ALGORITHMS)}, got "
                                                   f"{show(algorithm)}"))
    if "estimator" in problem and problem["estimator"] not in ("mlp", "roofline"):
        issues.append(Issue("$.problem.estimator", f"expected mlp or roofline (what timed "
                                                   f"the kernels), got "
                                                   f"{show(problem['estimator'])}"))
    if "master_weights" in problem and not isinstance(problem["master_weights"], bool):
        issues.append(Issue("$.problem.master_weights", f"expected true or false, got "
                                                        f"{show(problem['master_weights'])}"))
    size = problem.get("bucket_bytes", 0)
    if isinstance(size, bool) or not isinstance(size, int | float) or not 0 <= size < 2**60:
        issues.append(Issue("$.problem.bucket_bytes", f"expected a size in bytes, got "
                                                      f"{show(size)}"))
    batch, micro = problem.get("batch"), problem.get("microbatches", 1)
    if isinstance(batch, int) and not isinstance(batch, bool) and batch > MAX_BATCH:
        issues.append(Issue("$.problem.batch", f"expected at most 2^40 samples, got {batch}"))
    elif isinstance(batch, int) and isinstance(micro, int) and batch >= 1 and micro >= 1 \
            and not isinstance(micro, bool) and batch % micro:
        issues.append(Issue("$.problem.microbatches", f"{micro} microbatches do not divide "
                                                      f"the batch of {batch}: the plan was "
                                                      "edited; make it again"))


def _names_issues(layers: object, owner: dict[str, tuple[int, dict[str, Any]]],
                  issues: list[Issue]) -> None:
    """A layer listed twice, and a placement grid listing a layer the plan lacks (launch
    would start groups for layers nobody priced)."""
    records = layers if isinstance(layers, list) else []
    names = [(i, lay.get("name")) for i, lay in enumerate(records) if isinstance(lay, dict)]
    seen: set[str] = set()
    for i, n in names:
        if not isinstance(n, str) or not n:
            # a list or a mapping is no name (and no key of a set: found by an audit,
            # which crashed validate, launch and check with exit 3)
            issues.append(Issue(f"$.layers[{i}].name" if "name" in records[i] else
                                f"$.layers[{i}]", f"expected the layer's name as text, got "
                                                  f"{show(n)}: the plan was edited; make it "
                                                  "again"))
            return
        if n in seen:
            issues.append(Issue(f"$.layers[{i}].name", f"layer {show(n)} is listed twice: "
                                                       "the plan was edited; make it again"))
            break
        seen.add(n)
    stray = sorted(n for n in owner if n not in seen)
    if names and stray:
        issues.append(Issue(f"$.placement.grids[{owner[stray[0]][0]}].layers",
                            f"lists {show(stray[0])}, which is not among the plan's layers: "
                            "the plan was edited; make it again"))


def _ranks_issue(g: dict[str, Any], grid: list[int], placement: str, first: int,
                 where: str) -> Issue | None:
    """``--expand-ranks``' lists against the grid's rule (launch starts the rule's groups,
    so an edited list would be ignored without a word)."""
    if not any(isinstance(g.get(k), dict) and "ranks" in g[k]
               for k in ("row_groups", "col_groups")):
        return None
    from .plan import group_ranks

    for key, want in zip(("row_groups", "col_groups"), group_ranks(grid[0], grid[1],
                                                                     placement), strict=True):
        group = g.get(key)
        if isinstance(group, dict) and "ranks" in group and \
                group["ranks"] != [[first + r for r in ranks] for ranks in want]:
            return Issue(f"{where}.{key}.ranks",
                         f"these are not the {key.replace('_', ' ')} of grid {grid[0]}x"
                         f"{grid[1]} placed by {placement}"
                         + (f" from rank {first}" if first else "")
                         + ": the plan was edited; make it again (launch starts the "
                           "groups of the grid's rule)")
    return None


def _group_issue(g: dict[str, Any], grid: list[int], where: str, per_node: int,
                 offset: int) -> Issue | None:
    """A placement grid's ``row_groups`` / ``col_groups`` against its grid: ``P_c``
    row groups of ``P_r`` devices and ``P_r`` column groups of ``P_c``, and where they
    sit on nodes of ``per_node`` devices from ``offset`` in the first (``per_node``,
    ``nodes``, ``spans_nodes``: what the plan priced each group's collectives on). The
    launched ranks build the groups from the grid, so an edit to one says another
    layout; an edited ``devices_per_node`` says another cluster (found by an audit)."""
    from .layout import make_layout

    placement = g.get("placement")
    lay = make_layout("model" if grid[0] > 1 else "data", grid[0], grid[1],
                      placement if placement in ("rows", "cols") else "rows")
    for key, size, many, made in (
            ("row_groups", grid[0], grid[1], lay.row_group(per_node, offset)),
            ("col_groups", grid[1], grid[0], lay.col_group(per_node, offset))):
        group = g.get(key)
        if group is None:
            continue
        if not isinstance(group, dict):
            return Issue(f"{where}.{key}", f"expected a mapping, got {show(group)}")
        for field, want in (("size", size), ("count", many)):
            if field in group and group[field] != want:
                return Issue(f"{where}.{key}.{field}",
                             f"grid {grid[0]}x{grid[1]} has {want} for {key}.{field}, not "
                             f"{show(group[field])}: the plan was edited; make it again")
        for field, want2 in (("per_node", made.per_node), ("nodes", made.nodes),
                             ("spans_nodes", made.spans_nodes)):
            if field in group and (group[field] != want2
                                   or isinstance(group[field], bool) != isinstance(want2,
                                                                                   bool)):
                return Issue(f"{where}.{key}.{field}",
                             f"grid {grid[0]}x{grid[1]} ({placement}) on nodes of "
                             f"{per_node} devices has {show(want2)} for {key}.{field}, not "
                             f"{show(group[field])}: the plan was edited (or its "
                             "devices_per_node); make it again")
    return None


def _check_layers(layers: object, owner: dict[str, tuple[int, dict[str, Any]]], size: int,
                  stages: int, virtual: int, issues: list[Issue]) -> None:
    """Each layer's layout against the placement: a known mode, a grid of the stage's
    ``size`` devices in a stage (and chunk) of the pipeline, and for the layers a
    placement grid lists, that grid, placement, stage and chunk (what the launched
    ranks build their groups from). An edited plan would launch one thing and price
    another."""
    found: list[Issue] = []
    _layer_issues(layers, owner, size, stages, virtual, found)
    issues += found[:SHOWN_LAYER_ISSUES]
    if len(found) > SHOWN_LAYER_ISSUES:
        rest = len(found) - SHOWN_LAYER_ISSUES
        issues.append(Issue(found[SHOWN_LAYER_ISSUES].path,
                            f"and {rest} more layer{'s' if rest > 1 else ''} like these, "
                            "from this one on"))


#: the layers :func:`_check_layers` reports one by one (an edit to every layer's grid
#: would otherwise print one error a layer)
SHOWN_LAYER_ISSUES = 5


def _layer_issues(layers: object, owner: dict[str, tuple[int, dict[str, Any]]], size: int,
                  stages: int, virtual: int, issues: list[Issue]) -> None:
    from .layout import MODES

    for i, lay in enumerate(layers if isinstance(layers, list) else []):
        if not isinstance(lay, dict):
            continue
        where, name = f"$.layers[{i}]", lay.get("name")
        # every layer's stage and chunk, those that follow another's layout too (they
        # are on no grid's list: an audit found `stage: banana` passed)
        bad = [Issue(f"{where}.{key}", f"layer {show(name)}: expected its {what}, "
                                       + (f"a whole number 0 to {many - 1}" if many > 1
                                          else f"0 (the plan has no {none})")
                                       + f", got {show(lay[key])}")
               for key, many, what, none in (
                   ("stage", stages, "pipeline stage", "pipeline"),
                   ("chunk", virtual, "model chunk", "model chunks"))
               if key in lay and (isinstance(lay[key], bool) or not isinstance(lay[key], int)
                                  or not 0 <= lay[key] < many)]
        if bad:
            issues += bad
            continue
        if "grid" not in lay:
            # a layer a placement grid lists runs on it: the plan wrote its grid
            if isinstance(name, str) and name in owner:
                issues.append(Issue(where, f"layer {show(name)} has no grid, where "
                                           f"$.placement.grids[{owner[name][0]}] lists it: "
                                           "the plan was edited; make it again"))
            continue
        grid, mode = lay["grid"], lay.get("mode")
        if not (isinstance(grid, list) and len(grid) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in grid)):
            issues.append(Issue(f"{where}.grid", f"expected the grid as [P_r, P_c], two "
                                                 f"whole numbers >= 1, got {show(grid)}"))
            continue
        if mode not in MODES:
            issues.append(Issue(f"{where}.mode", f"expected one of {', '.join(MODES)}, got "
                                                 f"{show(mode)}"))
            continue
        if "placement" in lay and lay["placement"] not in ("rows", "cols"):
            issues.append(Issue(f"{where}.placement", f"layer {show(name)}: unknown "
                                                      f"placement {show(lay['placement'])}; "
                                                      "expected rows or cols"))
            continue
        if grid[0] * grid[1] != size:
            issues.append(Issue(f"{where}.grid", f"layer {show(name)}: grid {grid[0]}x"
                                                 f"{grid[1]} has {grid[0] * grid[1]} "
                                                 f"devices, a stage {size}: the plan was "
                                                 "edited; make it again"))
            continue
        mine = {"grid": grid, "placement": lay.get("placement"),
                **({"stage": lay.get("stage", 0)} if stages > 1 else {}),
                **({"chunk": lay.get("chunk", 0)} if virtual > 1 else {})}
        if not isinstance(name, str) or name not in owner:
            continue
        at, theirs = owner[name]
        if mine != theirs:
            def says(d: dict[str, Any]) -> str:
                how = d["placement"]
                return (f"{d['grid'][0]}x{d['grid'][1]} "
                        f"{how if isinstance(how, str) else show(how)}"
                        + (f", stage {d['stage']}" if "stage" in d else "")
                        + (f", chunk {d['chunk']}" if "chunk" in d else ""))
            issues.append(Issue(f"{where}.grid", f"layer {show(name)} is {says(mine)} here "
                                                 f"but {says(theirs)} in "
                                                 f"$.placement.grids[{at}]: the plan was "
                                                 "edited; make it again"))


def _cp_comm_types(layers: object) -> tuple[str, ...]:
    """How each attention layer split by tokens (``domain``) moves its keys and values:
    ``p2p`` where its terms went around the ring of sends, else ``allgather``. Layers
    the plan does not describe as such are skipped (the placement is what launch
    checks)."""
    out = []
    for layer in layers if isinstance(layers, list) else []:
        if not (isinstance(layer, dict) and layer.get("type") == "attention"
                and layer.get("mode") == "domain" and isinstance(layer.get("comm"), dict)):
            continue
        out.append(cp_method(layer))
    return tuple(out)


def cp_method(layer: dict[str, Any]) -> str:
    """How a plan's context-parallel attention layer moves its keys and values: ``p2p``
    where its terms went around the ring of sends, else ``allgather``."""
    comm = layer.get("comm")
    terms = comm.get("terms") if isinstance(comm, dict) else None
    ring = isinstance(terms, list) and any(
        isinstance(t, dict) and t.get("algorithm") == "p2p"
        and str(t.get("note", "")).startswith("key") for t in terms)
    return "p2p" if ring else "allgather"


def _grid_index(g: dict[str, Any], key: str, count: int, what: str, where: str,
                issues: list[Issue]) -> int | None:
    """A grid's ``stage`` or ``chunk``: 0 to ``count − 1`` (0 when there is one; None,
    with the issue added, when it is not one)."""
    value = g.get(key, 0)
    if count > 1 and (isinstance(value, bool) or not isinstance(value, int)
                      or not 0 <= value < count):
        issues.append(Issue(f"{where}.{key}" if key in g else where,
                            f"expected the grid's {what}, 0 to {count - 1}, got "
                            f"{show(value)}"))
        return None
    return int(value)


def _job_name(name: str) -> str:
    """A Slurm job name: letters, digits, ``.``, ``_``, ``-``; others become ``_``."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)


def _grid_lines(spec: LaunchSpec) -> list[str]:
    from .plan import group_rules

    out = []
    size = spec.world // spec.stages
    if spec.stages > 1:
        v = spec.virtual_stages
        schedule = ("ZB-H1 (zero-bubble 1F1B, the weight gradients deferred)"
                    if spec.schedule == ZERO_BUBBLE else "1F1B") if v == 1 else \
            f"interleaved 1F1B with {v} model chunks a stage (chunk k of stage s is the " \
            f"network's (k*{spec.stages} + s)-th)"
        micro = count(spec.microbatches, "microbatch", "microbatches")
        out.append(f"# pipeline: {spec.stages} stages of {size} ranks (stage s on ranks "
                   f"s*{size} .. s*{size} + {size - 1}), {micro}, "
                   f"{schedule}; a stage's grid rules number its ranks from the stage's "
                   "first")
    for g in spec.grids:
        pr, pc = g["grid"]
        rows, cols = group_rules(pr, pc, g["placement"])
        where = (f"stage {g['stage']} " if "stage" in g else "") + \
            (f"chunk {g['chunk']} " if "chunk" in g else "")
        out.append(f"#   {where}grid {pr}x{pc} ({g['placement']}): {rows}; {cols}")
    return out


def emit(kind: str, spec: LaunchSpec, plan_path: str, script: str, port: int,
         fixed_port: bool = False, cpus_per_task: int | None = None,
         plan_arg: bool = True) -> str:
    """The launch text for one emitter. The rendezvous port is ``port`` unless
    ``MASTER_PORT`` is set where the script runs; with ``fixed_port`` (the user named
    it), ``port`` always. ``cpus_per_task`` (Slurm only) asks sbatch and srun for that
    many CPUs a task; left out, a job of whole nodes shares the node's CPUs equally and
    a job of part of a node takes Slurm's default. ``plan_arg``: the training program
    is given ``--plan PLAN`` (without, it finds the plan in ``PLANNER_PLAN`` alone, as a
    program that refuses arguments it does not know, Megatron-LM's, must)."""
    q = shlex.quote
    if plan_path.startswith("-"):
        # the training program's parser would read "--plan -x.yaml" as an option
        plan_path = f"./{plan_path}"
    given = f" --plan {q(plan_path)}" if plan_arg else ""
    head = [
        f"# planner launch: {count(spec.nodes, 'node')} x "
        f"{count(spec.procs, 'process', 'processes')} "
        f"({count(spec.world, 'rank')}) for {printable(plan_path)} ({spec.name})",
        f"# rank k runs on node k // {spec.per_node}, local device k % {spec.per_node}",
        *_grid_lines(spec),
    ]
    if spec.uneven:
        head.append(f"# the last node runs {count(spec.last_node_procs, 'process', 'processes')}")
    if spec.zero:
        where = "within each node" if spec.zero_shard == "node" else "over all replicas"
        head.append(f"# ZeRO stage {spec.zero} {where}"
                    + (f" (PyTorch FSDP: ShardingStrategy.{spec.fsdp})" if spec.fsdp else ""))
    if spec.grad_dtype != spec.dtype:
        head.append(f"# {spec.dtype} weights, gradients accumulated and reduced in "
                    f"{spec.grad_dtype} (PyTorch FSDP: MixedPrecision(reduce_dtype="
                    f"torch.{spec.grad_dtype}))")
    if spec.tp_comm_overlap:
        head.append("# sequence-parallel collectives overlap their GEMMs (Megatron-LM: "
                    "--tp-comm-overlap, with Transformer Engine)")
    if spec.overlap_param_gather:
        head.append("# the updated parameters gathered under the next step's forward pass "
                    "(Megatron-LM: --overlap-param-gather)")
    cp = spec.cp_comm_types
    if cp:
        value = cp[0] if len(set(cp)) == 1 else ",".join(cp)
        head.append(f"# context parallelism in {len(cp)} attention layer"
                    f"{'s' if len(cp) > 1 else ''}: "
                    + ("keys and values around a ring of sends overlapped with attention"
                       if set(cp) == {"p2p"} else "keys and values all-gathered"
                       if set(cp) == {"allgather"} else "one method a layer, in order")
                    + " (Megatron-LM: --cp-comm-type "
                    + (value if len(set(cp)) == 1 else " ".join(cp)).replace(
                        "allgather", "all_gather") + ")")
    if kind == "env":
        lines = [
            f"PLANNER_PLAN={q(plan_path)}",
            f"MASTER_PORT={port}" if fixed_port else f'MASTER_PORT="${{MASTER_PORT:-{port}}}"',
            f"PLANNER_NODES={spec.nodes}",
            f"PLANNER_PROCS_PER_NODE={spec.procs}",
            f"PLANNER_WORLD_SIZE={spec.world}",
            f"PLANNER_LAST_NODE_PROCS={spec.last_node_procs}",
            f"PLANNER_RANK_RULE={q(f'node=rank//{spec.per_node},local=rank%{spec.per_node}')}",
            f"PLANNER_ZERO={spec.zero}",
            f"PLANNER_ZERO_SHARD={spec.zero_shard}",
            f"PLANNER_DTYPE={spec.dtype}",
            f"PLANNER_GRAD_DTYPE={spec.grad_dtype}",
        ]
        if spec.stages > 1 or spec.microbatches > 1:
            lines += [f"PLANNER_PIPELINE_STAGES={spec.stages}",
                      f"PLANNER_MICROBATCHES={spec.microbatches}"]
            if spec.virtual_stages > 1:
                lines.append(f"PLANNER_VIRTUAL_STAGES={spec.virtual_stages}")
            if spec.stages > 1:
                lines.append(f"PLANNER_PIPELINE_SCHEDULE={spec.schedule}")
        if spec.tp_comm_overlap:
            lines.append("PLANNER_TP_COMM_OVERLAP=1")
        if spec.overlap_param_gather:
            lines.append("PLANNER_OVERLAP_PARAM_GATHER=1")
        if cp:
            lines.append(f"PLANNER_CP_COMM_TYPE={value}")
        return "\n".join(head + lines) + "\n"
    if kind == "torchrun":
        port_value = str(port) if fixed_port else f"${{MASTER_PORT:-{port}}}"
        if spec.nodes == 1:
            note = ["# Run on the node; paths are as given, relative to where this runs."]
            # torchrun's own rendezvous on a free port, or the port asked for
            start = [f"exec torchrun --standalone --nnodes=1 --nproc-per-node={spec.procs} \\"
                     ] if not fixed_port else [
                f"exec torchrun --nnodes=1 --nproc-per-node={spec.procs} --node-rank=0 \\",
                f"  --master-addr=localhost --master-port={port} \\"]
            procs: list[str] = []
        else:
            note = [
                f"# Run on every node with NODE_RANK set (0..{spec.nodes - 1}) and "
                "MASTER_ADDR set to node 0's address; paths are as given, relative to where "
                "this runs."]
            nproc = '"$NPROC"' if spec.uneven else str(spec.procs)
            start = [
                f"exec torchrun --nnodes={spec.nodes} --nproc-per-node={nproc} "
                '--node-rank="$NODE_RANK" \\',
                f'  --master-addr="$MASTER_ADDR" --master-port="{port_value}" \\']
            # torchrun numbers ranks by the running total of the nodes' process counts
            # in node-rank order (its elastic agent's rank assignment), so the last node
            # may run fewer; the identical-workers shortcut, which assumes equal counts,
            # must be off
            procs = [] if not spec.uneven else [
                f'if [ "$NODE_RANK" -eq {spec.nodes - 1} ]; then NPROC={spec.last_node_procs}; '
                f"else NPROC={spec.procs}; fi",
                "unset TORCH_ELASTIC_WORKER_IDENTICAL"]
        last = spec.nodes - 1
        checks = [] if spec.nodes == 1 else [
            f': "${{NODE_RANK:?set NODE_RANK to the index of this node, 0..{last}}}"',
            # a node rank that is not 0..last would start torchrun on a wrong rank range
            # (more than 9 digits would overflow test's integers, which then reads false)
            'case "$NODE_RANK" in *[!0-9]*|??????????*) NODE_RANK_OK=0 ;; '
            '*) NODE_RANK_OK=1 ;; esac',
            f'if [ "$NODE_RANK_OK" = 0 ] || [ "$NODE_RANK" -gt {last} ]; then',
            f'  echo "NODE_RANK must be a node index, 0..{last}; got $NODE_RANK" >&2; exit 2',
            "fi",
            ': "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"']
        body = ["#!/usr/bin/env bash", *head, *note,
                "# Arguments given to this script are passed on to the training program.",
                "set -euo pipefail", *checks, *procs,
                f"export PLANNER_PLAN={q(plan_path)}", *start,
                f'  {q(script)}{given} "$@"']
        return "\n".join(body) + "\n"
    if kind == "slurm":
        # Slurm's block distribution balances the task counts over the nodes (12 tasks on
        # two nodes are 6 + 6), so an uneven plan starts a full node's tasks everywhere
        # and the surplus ranks of the last node exit at once: rank k stays on node k // g
        tasks = spec.nodes * spec.procs
        guard = (f'[ "$SLURM_PROCID" -lt {spec.world} ] || exit 0; ' if spec.uneven else "")
        # whole nodes: the node's CPUs too, shared by its tasks (srun gives a task one
        # CPU unless told, which starves data loading and NCCL's threads)
        whole = spec.procs == spec.per_node
        if cpus_per_task is not None:
            cpus = [f"CPUS={cpus_per_task}"]
        else:
            # SLURM_CPUS_ON_NODE: the CPUs the job holds on this node (all of them with
            # --exclusive; a partial node's default is one a task)
            cpus = [f"CPUS=$(( ${{SLURM_CPUS_ON_NODE:-{spec.procs}}} / {spec.procs} ))",
                    '[ "$CPUS" -ge 1 ] || CPUS=1']
        body = [
            "#!/bin/bash",
            f"#SBATCH --job-name=planner-{_job_name(spec.name)}",
            f"#SBATCH --nodes={spec.nodes}",
            f"#SBATCH --ntasks={tasks}",
            f"#SBATCH --ntasks-per-node={spec.procs}",
            *([f"#SBATCH --gpus-per-node={spec.procs}"] if spec.device_kind == "gpu" else []),
            *(["#SBATCH --exclusive"] if whole else []),
            *([f"#SBATCH --cpus-per-task={cpus_per_task}"] if cpus_per_task else []),
            "#SBATCH --distribution=block:block",
            *head,
            *(["# part of a node: each task gets Slurm's default CPUs (often one); "
               "`planner launch",
               "# --cpus-per-task N` asks for N"]
              if not whole and cpus_per_task is None else []),
            *([f"# {tasks - spec.world} surplus tasks on the last node exit at once"]
              if spec.uneven else []),
            *(["# Each task sees all of its node's GPUs and takes LOCAL_RANK's."]
              if spec.device_kind == "gpu" else []),
            "# Arguments given to this script are passed on to the training program, which",
            "# runs as ${PYTHON:-python}.",
            "set -euo pipefail",
            # sed reads every line (head would leave scontrol a broken pipe, which
            # pipefail makes an error)
            'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"',
            ': "${MASTER_ADDR:?scontrol gave no host for the job}"',
            "export MASTER_ADDR",
            f'export MASTER_PORT={port}' if fixed_port else
            f'export MASTER_PORT="${{MASTER_PORT:-{port}}}"' if whole else
            # a job of part of a node shares it with other jobs, whose rank 0 would
            # listen on the same default port: one from the job's id, below Linux's
            # ephemeral ports (32768 and up), which connections take at random
            'export MASTER_PORT="${MASTER_PORT:-$(( 15000 + SLURM_JOB_ID % 17000 ))}"',
            f"export PLANNER_PLAN={q(plan_path)}",
            *cpus,
            # --wait=0: a site's WaitTime would end the job that long after the first
            # task exits, and an uneven plan's surplus tasks exit at once
            ("srun --kill-on-bad-exit=1 --wait=0 " if spec.uneven else
             "srun --kill-on-bad-exit=1 ") + '--cpus-per-task="$CPUS" bash -c '
            + q(f'{guard}RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID '
                f'WORLD_SIZE={spec.world} exec "${{PYTHON:-python}}" {q(script)}{given} '
                '"$@"') + ' planner-task "$@"',
        ]
        return "\n".join(body) + "\n"
    raise UsageError(f"planner: error: unknown emitter {kind!r}")
