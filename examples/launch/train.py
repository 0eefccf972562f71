"""Train a network of linear layers with the layouts of a plan.

    planner plan examples/launch/mlp4.yaml examples/clusters/pcie-8gpu.yaml -p 4 -b 32 \\
        --optimizer sgd --overlap none --format yaml -o plan.yaml
    torchrun --nproc-per-node 4 examples/launch/train.py --plan plan.yaml --device cpu

Every layer with weights runs on its own P_r x P_c grid from the plan, in its mode:

* model (the integrated algorithm of Gholami et al., SPAA 2018; data is P_r = 1): the
  weight rows are split over the row group (P_r devices) and the batch over the column
  groups (P_c). Forward: each device multiplies its batch block by its rows of W and the
  row group all-gathers the output. Backward: the input gradient is all-reduced over the
  row group.
* column and row (Megatron-LM's pair, Shoeybi et al. 2019): column splits W's rows as
  model does and leaves its output split by features (backward: the input gradient is
  all-reduced over the row group); row takes its input split by features, multiplies by
  its columns of W and all-reduces the partial outputs over the row group (its input
  gradient stays split).

* column-sp and row-sp (Megatron-LM's sequence parallelism, Korthikanti et al. 2023) on
  a sequence: column-sp takes its input split by tokens over the row group, all-gathers
  the tokens forward and again backward for its weight gradient, and reduce-scatters
  its input gradient by tokens; row-sp reduce-scatters its partial outputs by tokens,
  all-gathers their gradient backward, and sums its bias's gradient over the row group.
* domain on a sequence (context parallelism): each rank works on its own tokens with
  the whole weights, whose gradient is all-reduced over all ranks.

Activations are (batch, tokens, features); a vector network has one token. In every
other mode the weight gradient is all-reduced over the column group. Between layers
the activations move as the plan's redistribution says: where the new block lies inside
the old one it is sliced; where old blocks tile it they are collected from the devices
that differ in that digit, by an all-gather where those devices share the new block;
where they do not (column 4x1 to row 2x2: each device holds a quarter of the features of
the whole batch and needs half the features of half the batch) as the plan priced it: a
personalised exchange (all_to_all), or an all-gather of the whole blocks where fewer
messages across nodes made that cheaper; gradients move back the same way.

The meshes come from torch.distributed.device_mesh.init_device_mesh, one per grid, laid
out as the plan's placement says (rank = c*P_r + r for "rows", r*P_c + c for "cols").
With --out DIR every rank records each collective it calls (layer, phase, bytes, group
size) and rank 0 writes the updated weights, so a test can compare them with the plan
and with single-process training (tests/test_launch_torch.py does).

A plan made with ``--zero`` (ZeRO, Rajbhandari et al., SC'20) is run as it says: each
weight gradient is reduce-scattered over the column group, and each rank steps its 1/P_c
of the layer's flat parameters (weights, then bias); at stages 1-2 the updated chunks are
all-gathered, at stage 3 each rank keeps only its chunk and gathers the shard before the
layer's forward and again before its backward (plain SGD has no optimizer state, so
stages 1 and 2 run alike). Made with ``--zero-shard node`` (hybrid sharding, as FSDP's
HYBRID_SHARD) a column group that spans nodes shards over its members inside each node
(``q``): the gradient is reduce-scattered over them and the chunk all-reduced with the
ranks that hold the same chunk in the other nodes (recorded as one ``hybrid_reduce``, as
the plan prices it), and the parameters are gathered inside the node.

A move whose blocks are neither nested nor tiled on some axis (tokens to samples: an
all-to-all) is refused by name, and so is a plan with pipeline stages (``--pipeline``),
which this example does not run.

A plan made with ``--recompute blocks`` is run without recomputation: it changes memory
and time, not the result, and this program runs MLPs, which have no residual blocks to
recompute.

The program keeps the backward pass explicit (no autograd) so every collective is visible.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml
from torch.distributed.device_mesh import init_device_mesh

from planner.layout import Dist, Layout, input_dist


class Recorder:
    """Every collective this rank calls: layer, phase, collective, bytes, group size."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def add(self, layer: str, phase: str, collective: str, nbytes: int, group: int,
            note: str = "") -> None:
        self.calls.append({"layer": layer, "phase": phase, "collective": collective,
                           "bytes": nbytes, "group": group, "note": note})


REC = Recorder()
#: how the plan moves each activation whose gather group needs different blocks:
#: (layer, note) -> "exchange" (all_to_all) or "all_gather" (of the members' whole blocks)
METHODS: dict[tuple[str, str], str] = {}
#: the layouts this example runs
MODES = ("data", "model", "column", "row", "column-sp", "row-sp", "domain")


def all_gather_cat(t: torch.Tensor, group: Any, size: int, dim: int, layer: str, phase: str,
                   note: str = "") -> torch.Tensor:
    """All-gather ``t`` over ``group`` and concatenate along ``dim`` (rank order)."""
    if size == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t.contiguous(), group=group)
    out = torch.cat(parts, dim=dim)
    REC.add(layer, phase, "all_gather", out.numel() * out.element_size(), size, note)
    return out


def reduce_scatter_dim(t: torch.Tensor, group: Any, size: int, dim: int, layer: str,
                      phase: str) -> torch.Tensor:
    """Sum ``t`` over ``group``; this rank keeps block ``group rank`` of ``size`` along
    ``dim`` (sequence parallelism's reduce-scatter by tokens)."""
    if size == 1:
        return t
    if t.shape[dim] % size:
        raise SystemExit(f"{layer}: {t.shape[dim]} tokens do not split {size} ways")
    stacked = torch.stack(t.chunk(size, dim)).contiguous()  # block i first along dim 0
    out = torch.empty(stacked[0].numel(), dtype=t.dtype, device=t.device)
    dist.reduce_scatter_tensor(out, stacked.reshape(-1), group=group)
    REC.add(layer, phase, "reduce_scatter", t.numel() * t.element_size(), size)
    return out.reshape(stacked.shape[1:])


def reduce_scatter(t: torch.Tensor, group: Any, size: int, layer: str) -> torch.Tensor:
    """Sum the flat ``t`` over ``group``; this rank keeps its 1/size of the sum (chunk
    ``group rank``), as ZeRO does with weight gradients."""
    if size == 1:
        return t
    if t.numel() % size:
        raise SystemExit(f"{layer}: {t.numel()} parameters do not split {size} ways")
    out = torch.empty(t.numel() // size, dtype=t.dtype, device=t.device)
    dist.reduce_scatter_tensor(out, t.contiguous(), group=group)
    REC.add(layer, "weight_grad", "reduce_scatter", t.numel() * t.element_size(), size)
    return out


def gather_flat(chunk: torch.Tensor, group: Any, size: int, layer: str,
                note: str) -> torch.Tensor:
    """All-gather the flat parameter chunks of ``group`` (ZeRO's parameter gather)."""
    if size == 1:
        return chunk
    out = torch.empty(chunk.numel() * size, dtype=chunk.dtype, device=chunk.device)
    dist.all_gather_into_tensor(out, chunk.contiguous(), group=group)
    REC.add(layer, "parameters", "all_gather", out.numel() * out.element_size(), size, note)
    return out


def my_chunk(flat: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    """This rank's 1/size of a flat vector (its place in ``group``)."""
    if size == 1:
        return flat
    k = flat.numel() // size
    i = dist.get_group_rank(group, dist.get_rank())
    return flat[i * k:(i + 1) * k].clone()


def all_reduce(t: torch.Tensor, group: Any, size: int, layer: str, phase: str) -> torch.Tensor:
    """Sum ``t`` over ``group`` in place."""
    if size > 1:
        dist.all_reduce(t, group=group)
        REC.add(layer, phase, "all_reduce", t.numel() * t.element_size(), size)
    return t


def hybrid_reduce(t: torch.Tensor, shard: Shard, layer: str) -> torch.Tensor:
    """Hybrid sharding's gradient: reduce-scatter the flat ``t`` over the ranks of the
    column group in this node, then all-reduce this rank's chunk over the ranks holding
    the same chunk in the other nodes; returns the chunk (one call recorded, as the plan
    has one term)."""
    q = shard.size
    if t.numel() % q:
        raise SystemExit(f"{layer}: {t.numel()} parameters do not split {q} ways")
    out = t.contiguous()
    if q > 1:
        out = torch.empty(t.numel() // q, dtype=t.dtype, device=t.device)
        dist.reduce_scatter_tensor(out, t.contiguous(), group=shard.group)
    dist.all_reduce(out, group=shard.across)
    REC.add(layer, "weight_grad", "hybrid_reduce", t.numel() * t.element_size(),
            shard.replicas)
    return out


class Shard:
    """Over whom ZeRO shards a column group: all of it, or (hybrid, the group spanning
    nodes) its members in this rank's node, with ``across`` the ranks of the other
    nodes that hold the same chunk."""

    def __init__(self, members: list[int], per_node: int, hybrid: bool) -> None:
        rank = dist.get_rank()
        self.replicas = len(members)
        nodes: dict[int, list[int]] = {}
        for k in members:
            nodes.setdefault(k // per_node, []).append(k)
        self.hybrid = hybrid and len(nodes) > 1
        if not self.hybrid:
            self.group, self.size, self.across = None, len(members), None
            return
        local = list(nodes.values())
        q = len(local[0])
        if any(len(x) != q for x in local):
            raise SystemExit("hybrid sharding needs the same number of replicas in each node")
        # every rank creates every group, in the same order
        for x in local:
            g = _group(tuple(x))
            if rank in x:
                self.group = g
        for i in range(q):
            same = tuple(x[i] for x in local)
            g = _group(same)
            if rank in same:
                self.across = g
        self.size = q


class Grid:
    """A P_r x P_c grid laid out as the plan's placement says."""

    def __init__(self, pr: int, pc: int, placement: str, device: str) -> None:
        self.pr, self.pc, self.placement = pr, pc, placement
        rank = dist.get_rank()
        if placement == "rows":  # rank = c * pr + r
            self.mesh = init_device_mesh(device, (pc, pr), mesh_dim_names=("col", "row"))
            self.r, self.c = rank % pr, rank // pr
        else:  # rank = r * pc + c
            self.mesh = init_device_mesh(device, (pr, pc), mesh_dim_names=("row", "col"))
            self.r, self.c = rank // pc, rank % pc
        # the row group: the P_r devices of one batch block; the column group: the P_c
        # devices of one weight shard
        self.row = self.mesh.get_group("row")
        self.col = self.mesh.get_group("col")


_GROUPS: dict[tuple[int, ...], Any] = {}


def _group(members: tuple[int, ...]) -> Any:
    """One process group per member list (created once, by every rank)."""
    if members not in _GROUPS:
        _GROUPS[members] = dist.new_group(list(members))
    return _GROUPS[members]


def _range(k: int, digit: tuple[int, int] | None, size: int) -> tuple[int, int]:
    """The block of an axis of ``size`` that device ``k`` holds under a digit
    ``(stride, count)`` (block ``(k // stride) % count``; None: the whole axis)."""
    if digit is None or digit[1] == 1:
        return 0, size
    stride, count = digit
    if size % count:
        raise SystemExit(f"an axis of {size} does not split {count} ways")
    i = (k // stride) % count
    return i * size // count, (i + 1) * size // count


def move(x: torch.Tensor, src: Dist, dst: Dist, batch: int, tokens: int, features: int,
         layer: str, phase: str, note: str) -> torch.Tensor:
    """Redistribute this device's block of a (batch x tokens x features) activation from the
    distribution ``src`` to ``dst`` (the plan's: planner.layout.Dist). On an axis where the
    new block lies inside the old one, slice; where the old blocks tile the new one, collect
    them from the devices that differ only in that axis's digit: an all-gather when those
    devices share the new block (sliced first, so only what it needs travels), else as the
    plan prices it (METHODS): a personalised exchange (all_to_all), each device sending
    each other the part of its block the other needs, or, where the plan found it cheaper
    (fewer messages across nodes), an all-gather of the members' whole blocks of which
    each device keeps its part."""
    if src == dst:
        return x
    k, world = dist.get_rank(), dist.get_world_size()
    axes = [(src.batch, dst.batch, batch), (src.height, dst.height, tokens),
            (src.feature, dst.feature, features)]
    gathers: list[tuple[int, int]] = []
    for a, z, size in axes:
        s_lo, s_hi = _range(k, a, size)
        d_lo, d_hi = _range(k, z, size)
        if s_lo <= d_lo and d_hi <= s_hi:
            continue  # the new block lies inside: slice
        if d_lo <= s_lo and s_hi <= d_hi and a is not None:  # old blocks tile it
            parts = 1 if z is None else z[1]
            gathers.append((a[0], a[1] // parts))
        else:
            raise SystemExit(f"{layer}: misaligned blocks ({src} -> {dst}): this example "
                             "moves aligned blocks only")

    def src_of(j: int) -> list[tuple[int, int]]:
        return [_range(j, a, size) for a, _, size in axes]

    def dst_of(j: int) -> list[tuple[int, int]]:
        return [_range(j, z, size) for _, z, size in axes]

    def cut(t: torch.Tensor, held: list[tuple[int, int]], want: list[tuple[int, int]]
            ) -> torch.Tensor:
        """The part of ``t`` (holding ``held``) inside ``want``."""
        for dim, ((h_lo, h_hi), (w_lo, w_hi)) in enumerate(zip(held, want, strict=True)):
            lo, hi = max(h_lo, w_lo), min(h_hi, w_hi)
            t = t.narrow(dim, lo - h_lo, max(0, hi - lo))
        return t.contiguous()

    mine = dst_of(k)
    if not gathers:
        return cut(x, src_of(k), mine)

    def members_of(j: int) -> tuple[int, ...]:
        base = j - sum(((j // st) % n) * st for st, n in gathers)
        out = [base]
        for st, n in gathers:
            out = [m + i * st for m in out for i in range(n)]
        return tuple(sorted(out))

    for members in sorted({members_of(j) for j in range(world)}):
        _group(members)  # every rank creates every group, in the same order
    members = members_of(k)
    group = _group(members)
    order = [dist.get_global_rank(group, i) for i in range(len(members))]
    out = torch.empty(*[hi - lo for lo, hi in mine], dtype=x.dtype, device=x.device)
    incoming = [torch.empty_like(cut(out, mine, src_of(j))) for j in order]
    if all(dst_of(j) == mine for j in order):
        kind = "all_gather"
        dist.all_gather(incoming, cut(x, src_of(k), mine), group=group)
    elif METHODS.get((layer, note)) == "all_gather":
        # gather the members' whole blocks, then keep this device's part of each
        whole = [torch.empty_like(x) for _ in order]
        dist.all_gather(whole, x.contiguous(), group=group)
        incoming = [cut(w, src_of(j), mine) for j, w in zip(order, whole, strict=True)]
        REC.add(layer, phase, "all_gather", sum(w.numel() for w in whole) * x.element_size(),
                len(members), note)
        kind = ""
    else:
        dist.all_to_all(incoming, [cut(x, src_of(k), dst_of(j)) for j in order], group=group)
        own = incoming[order.index(k)].numel()  # what this device already held
        REC.add(layer, phase, "exchange", (out.numel() - own) * out.element_size(),
                len(members), note)
        kind = ""
    covered = 0
    for j, part in zip(order, incoming, strict=True):
        lo = [max(s_lo, m_lo) - m_lo for (s_lo, _), (m_lo, _) in zip(src_of(j), mine, strict=True)]
        out[tuple(slice(a, a + n) for a, n in zip(lo, part.shape, strict=True))] = part
        covered += part.numel()
    assert covered == out.numel(), "the collected blocks tile the new block"
    if kind:
        REC.add(layer, phase, kind, out.numel() * out.element_size(), len(members), note)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", default=os.environ.get("PLANNER_PLAN"), required=False)
    ap.add_argument("--network", default=None, help="the network file (default: the plan's)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backend", default=None, help="default: nccl on cuda, gloo on cpu")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write collective logs and weights here")
    args = ap.parse_args()
    if not args.plan:
        raise SystemExit("give --plan PLAN (or set PLANNER_PLAN)")
    plan = yaml.safe_load(Path(args.plan).read_text())
    for rec in plan["layers"]:
        for t in rec["comm"]["terms"]:
            if t["phase"] == "redistribute":
                METHODS[(rec["name"], t.get("note", ""))] = t["collective"]
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    dist.init_process_group(backend)
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != plan["problem"]["gpus"]:
        raise SystemExit(f"the plan is for {plan['problem']['gpus']} ranks, not {world}")
    stages = int((plan.get("pipeline") or {}).get("stages", 1))
    if stages > 1:  # its ranks would each train the whole network on one stage's grids
        raise SystemExit(f"this example runs no pipeline stages; the plan has {stages} "
                         "(make it without --pipeline)")
    from planner import load_network

    net_file = args.network or plan["inputs"]["network"]["file"]
    if not Path(net_file).is_file():
        raise SystemExit(f"the network file {net_file} is not found from here (a plan names "
                         "it as given to `planner plan`, relative to where that ran); give "
                         "--network FILE")
    net = load_network(net_file)
    batch = int(plan["problem"]["batch"])
    if plan["problem"].get("dtype", "float32") != "float32":
        raise SystemExit(f"this example trains in float32; the plan is for "
                         f"{plan['problem']['dtype']} (make it without --precision)")
    grad_dtype = {"float32": torch.float32, "float64": torch.float64,
                  "bfloat16": torch.bfloat16, "float16": torch.float16}[
        plan["problem"].get("grad_dtype", "float32")]
    zero = int(plan["problem"].get("zero", 0))
    hybrid = zero > 0 and plan["problem"].get("zero_shard", "all") == "node"
    per_node = int(plan["placement"]["devices_per_node"])
    layouts = {rec["name"]: rec for rec in plan["layers"]}
    dev = torch.device(args.device)

    grids: dict[tuple[int, int, str], Grid] = {}
    shardings: dict[tuple[int, int, str], Shard] = {}

    def grid_of(name: str) -> Grid:
        rec = layouts[name]
        key = (int(rec["grid"][0]), int(rec["grid"][1]), str(rec["placement"]))
        if key not in grids:
            grids[key] = gr = Grid(*key, device=args.device)
            members = [c * gr.pr + gr.r if gr.placement == "rows" else gr.r * gr.pc + c
                       for c in range(gr.pc)]
            # the same group shapes on every rank: build each row's sharding in turn
            for r in range(gr.pr):
                rows = [c * gr.pr + r if gr.placement == "rows" else r * gr.pc + c
                        for c in range(gr.pc)]
                sh = Shard(rows, per_node, hybrid)
                if rows == members:
                    shardings[key] = sh
        return grids[key]

    def shard_of(name: str) -> tuple[Any, int]:
        """The group ZeRO shards a layer over and its size."""
        gr = grid_of(name)
        sh = shardings[(gr.pr, gr.pc, gr.placement)]
        return (sh.group, sh.size) if sh.hybrid else (gr.col, gr.pc)

    # every rank draws the same full weights and data, then keeps its shard and block
    g = torch.Generator().manual_seed(args.seed)
    linears = [lay for lay in net.layers if lay.type == "linear"]
    if any(lay.type not in ("linear", "relu") for lay in net.layers):
        raise SystemExit("this example trains networks of linear and relu layers")
    full_w = {lay.name: torch.randn(lay.linear.out_features, lay.linear.in_features,
                                    generator=g) * 0.2 for lay in linears}
    full_b = {lay.name: torch.randn(lay.linear.out_features, generator=g) * 0.1
              for lay in linears}
    # a vector is a sequence of one token: activations are (batch, tokens, features)
    tokens = net.input_shape[0] if len(net.input_shape) == 2 else 1
    x_all = torch.randn(batch, *net.input_shape, generator=g).reshape(batch, tokens, -1)
    t_all = torch.randn(batch, *linears[-1].output_shape, generator=g).reshape(
        batch, tokens, -1)
    layout: dict[str, Layout] = {}
    for lay in linears:  # create every mesh up front, in the same order on every rank
        rec = layouts[lay.name]
        if rec["mode"] not in MODES:
            raise SystemExit(f"{lay.name}: this example runs {', '.join(MODES)} layouts, "
                             f"not {rec['mode']}")
        layout[lay.name] = Layout(str(rec["mode"]), int(rec["grid"][0]), int(rec["grid"][1]),
                                  str(rec["placement"]))
        mode = rec["mode"]
        if mode == "domain" and zero:
            raise SystemExit(f"{lay.name}: this example shards ZeRO over the column group; "
                             "a domain layout reduces its gradient over all ranks")
        split = lay.linear.in_features if mode in ("row", "row-sp") else \
            lay.linear.out_features
        what = "features"
        if mode in ("column-sp", "row-sp", "domain") and tokens % layout[lay.name].pr:
            split, what = tokens, "tokens"
        if split % layout[lay.name].pr:
            # the planner prices uneven blocks by the busiest; this example holds equal
            # ones, and slicing features // P_r would silently drop the rest
            raise SystemExit(f"{lay.name}: {split} {what} do not split "
                             f"{layout[lay.name].pr} ways; this example needs equal blocks "
                             "(pin a grid whose P_r divides them)")
        grid_of(lay.name)
    shards: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for lay in linears:
        gr = grid_of(lay.name)
        w, b = full_w[lay.name], full_b[lay.name]
        if layout[lay.name].mode in ("row", "row-sp"):  # 1/P_r of the inputs; all the bias
            cols = lay.linear.in_features // gr.pr
            shards[lay.name] = (w[:, gr.r * cols:(gr.r + 1) * cols].clone().to(dev),
                                b.clone().to(dev))
        elif layout[lay.name].mode == "domain":  # whole, as data parallelism holds them
            shards[lay.name] = (w.clone().to(dev), b.clone().to(dev))
        else:  # data, model, column, column-sp: its 1/P_r of the output features
            rows = lay.linear.out_features // gr.pr
            sl = slice(gr.r * rows, (gr.r + 1) * rows)
            shards[lay.name] = (w[sl].clone().to(dev), b[sl].clone().to(dev))
    # ZeRO stage 3 keeps only this rank's 1/P_c of its shard, flat (weights, then bias)
    owned: dict[str, torch.Tensor] = {}
    if zero >= 3:
        for lay in linears:
            w, b = shards[lay.name]
            owned[lay.name] = my_chunk(torch.cat([w.reshape(-1), b]), *shard_of(lay.name))

    def weights(name: str, note: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's shard (at stage 3 gathered from the column group first)."""
        if zero < 3:
            return shards[name]
        w_shape = shards[name][0].shape
        flat = gather_flat(owned[name], *shard_of(name), name, note)
        n_w = w_shape[0] * w_shape[1]
        return flat[:n_w].reshape(w_shape), flat[n_w:]

    def block_of(full: torch.Tensor, where: Dist) -> torch.Tensor:
        """This rank's block of a whole (batch x tokens x features) tensor."""
        b_lo, b_hi = _range(rank, where.batch, full.shape[0])
        t_lo, t_hi = _range(rank, where.height, full.shape[1])
        f_lo, f_hi = _range(rank, where.feature, full.shape[2])
        return full[b_lo:b_hi, t_lo:t_hi, f_lo:f_hi]

    for _ in range(args.steps):
        REC.calls.clear()
        here = input_dist(layout[linears[0].name])
        h = block_of(x_all, here).to(dev)
        saved: list[tuple[Any, ...]] = []
        for lay in net.layers:
            if lay.type == "relu":  # feature-wise: runs on any block
                saved.append(("relu", h > 0))
                h = torch.relu(h)
                continue
            lo, gr = layout[lay.name], grid_of(lay.name)
            need = input_dist(lo)
            h = move(h, here, need, batch, tokens, lay.linear.in_features, lay.name,
                     "redistribute", "input (forward)")
            w, b = weights(lay.name, "gather (forward)")
            if lo.mode == "row":  # partial sums over the row group's input features
                y = all_reduce(h @ w.T, gr.row, gr.pr, lay.name, "forward") + b
            elif lo.mode == "row-sp":  # the partial sums reduce-scattered by tokens
                y = reduce_scatter_dim(h @ w.T, gr.row, gr.pr, 1, lay.name, "forward") + b
            elif lo.mode == "column-sp":  # the tokens gathered; keeps its own only
                y = all_gather_cat(h, gr.row, gr.pr, 1, lay.name, "forward") @ w.T + b
            else:
                y = h @ w.T + b  # this device's output features (domain: its tokens)
                if lo.mode in ("data", "model"):  # the row group gathers them
                    y = all_gather_cat(y, gr.row, gr.pr, 2, lay.name, "forward")
            saved.append(("linear", lay, h, here))
            h, here = y, lo.output_dist()
        target = block_of(t_all, here).to(dev)
        grad = 2.0 * (h - target) / t_all.numel()  # d(mean squared error)
        updates: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        grad_chunks: dict[str, torch.Tensor] = {}
        for item in reversed(saved):
            if item[0] == "relu":
                grad = grad * item[1]
                continue
            _, lay, x_in, before = item
            lo, gr = layout[lay.name], grid_of(lay.name)
            w, b = weights(lay.name, "gather (backward)")
            if lo.mode in ("data", "model"):  # the gradient of this device's outputs
                rows = w.shape[0]
                grad = grad[..., gr.r * rows:(gr.r + 1) * rows]
            db = grad.sum((0, 1))
            if lo.mode == "row-sp":
                # the bias was added to this device's tokens: its gradient summed over the
                # row group (in the gradients' dtype); the output gradient gathered
                db = all_reduce(db.to(grad_dtype), gr.row, gr.pr, lay.name,
                                "backward_data").to(db.dtype)
                grad = all_gather_cat(grad, gr.row, gr.pr, 1, lay.name, "backward_data")
            if lo.mode == "column-sp":  # its input's tokens gathered again
                x_in = all_gather_cat(x_in, gr.row, gr.pr, 1, lay.name, "backward_data")
            dw = grad.reshape(-1, grad.shape[-1]).T @ x_in.reshape(-1, x_in.shape[-1])
            # gradients are reduced in the plan's gradient dtype (problem.grad_dtype)
            flat = torch.cat([dw.reshape(-1), db]).to(grad_dtype)
            sh = shardings[(gr.pr, gr.pc, gr.placement)]
            if zero and sh.hybrid:
                # hybrid: its 1/q of the gradient summed over the whole column group
                grad_chunks[lay.name] = hybrid_reduce(flat, sh, lay.name)
            elif zero:
                # ZeRO: this rank keeps (and updates) its 1/P_c of the summed gradient
                grad_chunks[lay.name] = reduce_scatter(flat, gr.col, gr.pc, lay.name)
            else:  # domain: whole weights on every rank, reduced over all of them
                all_reduce(flat, *((dist.group.WORLD, world) if lo.mode == "domain" else
                                   (gr.col, gr.pc)), lay.name, "weight_grad")
                flat = flat.to(dw.dtype)
                updates[lay.name] = (flat[:dw.numel()].reshape(dw.shape), flat[dw.numel():])
            if lay.inputs == (-1,):
                continue  # the network input needs no gradient
            grad = grad @ w
            if lo.mode == "column-sp":  # summed and split by tokens again
                grad = reduce_scatter_dim(grad, gr.row, gr.pr, 1, lay.name, "backward_data")
            elif lo.mode in ("data", "model", "column"):  # partial sums over the features
                grad = all_reduce(grad, gr.row, gr.pr, lay.name, "backward_data")
            # row, row-sp: split by features as the input is; domain: its own tokens
            grad = move(grad, input_dist(lo), before, batch, tokens, lay.linear.in_features,
                        lay.name, "redistribute", "input (backward)")
        for name, (dw, db) in updates.items():
            w, b = shards[name]
            w -= args.lr * dw
            b -= args.lr * db
        for name, g_chunk in grad_chunks.items():  # ZeRO: step on the owned chunk
            g_chunk = g_chunk.to(torch.float32)  # the weights' dtype: gathers move it
            if zero >= 3:
                owned[name] -= args.lr * g_chunk
                continue
            w, b = shards[name]
            mine = my_chunk(torch.cat([w.reshape(-1), b]), *shard_of(name)) - args.lr * g_chunk
            flat = gather_flat(mine, *shard_of(name), name, "gather (update)")
            w.copy_(flat[:w.numel()].reshape(w.shape))
            b.copy_(flat[w.numel():])

    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{rank}.json").write_text(json.dumps(REC.calls))
        full: dict[str, Any] = {}
        for lay in linears:  # reassemble each layer's weights on rank 0 (not recorded)
            gr = grid_of(lay.name)
            if zero >= 3:
                w, b = weights(lay.name, "")
            else:
                w, b = shards[lay.name]
            if layout[lay.name].mode == "domain":  # whole on every rank
                full[lay.name] = {"weight": w.cpu().tolist(), "bias": b.cpu().tolist()}
                continue
            ws = [torch.empty_like(w) for _ in range(gr.pr)]
            bs = [torch.empty_like(b) for _ in range(gr.pr)]
            dist.all_gather(ws, w.contiguous(), group=gr.row)
            dist.all_gather(bs, b.contiguous(), group=gr.row)
            # row: split by input features, the bias whole
            row = layout[lay.name].mode in ("row", "row-sp")
            full[lay.name] = {"weight": torch.cat(ws, dim=1 if row else 0).cpu().tolist(),
                              "bias": (b if row else torch.cat(bs)).cpu().tolist()}
        if rank == 0:
            (out / "weights.json").write_text(json.dumps(full))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
