"""Layouts of a layer on a ``P_r × P_c`` grid, where their data lives, and what it takes
to move activations from one layout to another.

A **layout** is ``(mode, P_r, P_c, placement)`` with ``P_r · P_c = P`` (Gholami et al.,
SPAA 2018, REFERENCES §1):

* ``data``: ``P_r = 1``, the batch split over all ``P`` devices;
* ``model``: the layer's output features / channels / heads split over ``P_r``, the batch
  over ``P_c`` (Eq. 8; ``P_c = 1`` is pure model parallelism, Eq. 3);
* ``domain``: the image height split over ``P_r``, the batch over ``P_c`` (Eq. 7, 9);
* ``column`` and ``row``: the pair of Megatron-LM's tensor parallelism (Shoeybi et al.
  2019) for linear layers, not in the paper: ``column`` splits the output features over
  ``P_r`` as ``model`` does but leaves its output split by features (no all-gather);
  ``row`` takes its input split by features, multiplies by its ``1/P_r`` of the weight's
  rows and all-reduces the partial outputs. Between a ``column`` and a ``row`` layer
  only feature-wise layers (activations, dropout) may run.
* ``expert`` and ``expert-sp`` (a mixture of experts only): expert parallelism (GShard,
  Lepikhin et al. 2021; DeepSpeed-MoE, Rajbhandari et al. 2022): ``1/P_r`` of the
  experts on each device of a row group, whose devices send each routed token to the
  device of its expert and back with all-to-alls; ``P_c`` replicas of each expert.
  ``expert`` takes its input as data parallelism leaves it, the batch split over all
  ``P``; ``expert-sp`` as sequence parallelism leaves it, the tokens split over the row
  group and the batch over ``P_c``.
* ``column-sp``, ``row-sp`` and ``model-sp`` (attention, split by heads): the same with
  Megatron-LM's sequence parallelism (Korthikanti et al., MLSys 2023): outside them the
  activations are split by tokens over the row group, so norms, dropout and residual
  adds work on ``1/P_r`` of them; the layer all-gathers its input's tokens forward (and
  again backward, as it keeps only its own) and reduce-scatters its input gradient; a
  ``row-sp`` or ``model-sp`` layer reduce-scatters its output by tokens where ``row``
  and ``model`` all-reduce it, and all-gathers the output gradient backward.

**Placement** maps grid coordinates to devices ``k = 0 … P−1`` (device ``k`` is local GPU
``k mod g`` of node ``k div g``): with ``rows`` the row groups (the ``P_r`` devices that
share a batch block: model-parallel all-gathers, halo exchanges) are consecutive devices,
``r = k mod P_r``, ``c = k div P_r``; with ``cols`` the column groups (the ``P_c``
devices that share a weight shard: gradient all-reduces) are consecutive,
``c = k mod P_c``, ``r = k div P_c``.

An activation **distribution** follows from a layout: batch block ``c`` of ``P_c`` on
every device (model and data layouts all-gather their output, so it is replicated across
the row group), plus height block ``r`` of ``P_r`` for domain layouts, or feature block
``r`` of ``P_r`` for a ``column`` layout's output and a ``row`` layout's input. Each block
index is
a digit ``(k div stride) mod count`` of the device number, and **redistribution**
between
two distributions is the real data movement: every device receives the part of its new
block that it does not already hold.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .costs.comm import Group
from .errors import UsageError

Mode = Literal["data", "model", "domain", "column", "row", "column-sp", "row-sp", "model-sp",
               "ulysses", "expert", "expert-sp"]
MODES: tuple[str, ...] = ("data", "model", "domain", "column", "row", "column-sp", "row-sp",
                          "model-sp", "ulysses", "expert", "expert-sp")
#: expert parallelism for a mixture of experts: its experts split over the row group,
#: which exchanges the routed tokens with all-to-alls; ``expert`` on the batch split over
#: all ``P`` (as data parallelism leaves it), ``expert-sp`` on tokens split over the row
#: group (as sequence parallelism leaves them)
EXPERT_MODES: tuple[str, ...] = ("expert", "expert-sp")
#: modes that hold a layer's weights whole on every device (reduced over all ``P``)
WHOLE_MODES: tuple[str, ...] = ("data", "domain", "ulysses")
#: Megatron-LM's sequence parallelism (Korthikanti et al., MLSys 2023): the tensor-parallel
#: modes whose activations outside the split layers are split by tokens over the row group
SEQUENCE_MODES: tuple[str, ...] = ("column-sp", "row-sp", "model-sp")
#: the modes that split a layer's weight over ``P_r`` (each device holds ``1/P_r``)
SHARDED_MODES: tuple[str, ...] = ("model", "column", "row", *SEQUENCE_MODES)


def base_mode(mode: str) -> str:
    """The weight split of a mode: a sequence-parallel mode's, without ``-sp``."""
    return mode.removesuffix("-sp")
PLACEMENTS: tuple[str, ...] = ("rows", "cols")
BRUTE_FORCE_MAX_P = 65536


@dataclass(frozen=True, order=True)
class Layout:
    """A layer's parallel layout; construct with :func:`make_layout` to canonicalise."""

    mode: str
    pr: int
    pc: int
    placement: str = "rows"

    @property
    def p(self) -> int:
        """Devices."""
        return self.pr * self.pc

    @property
    def grid(self) -> tuple[int, int]:
        """``(P_r, P_c)``."""
        return (self.pr, self.pc)

    def label(self) -> str:
        """``model 32x16`` / ``data 1x512`` / ``domain 16x32 (cols)``."""
        extra = " (cols)" if self.placement == "cols" else ""
        return f"{self.mode} {self.pr}x{self.pc}{extra}"

    # Grid digits of device k: (stride, count) with index = (k div stride) mod count.
    @property
    def r_digit(self) -> tuple[int, int]:
        """The row index digit."""
        return (1, self.pr) if self.placement == "rows" else (self.pc, self.pr)

    @property
    def c_digit(self) -> tuple[int, int]:
        """The column (batch block) digit."""
        return (self.pr, self.pc) if self.placement == "rows" else (1, self.pc)

    def row_group(self, per_node_devices: int, offset: int = 0) -> Group:
        """The ``P_r`` devices that share a batch block (``offset``: see
        :func:`node_group`)."""
        return node_group((self.r_digit,), self.p, per_node_devices, offset)

    def col_group(self, per_node_devices: int, offset: int = 0) -> Group:
        """The ``P_c`` devices that share a weight shard (or a height block)."""
        return node_group((self.c_digit,), self.p, per_node_devices, offset)

    def all_group(self, per_node_devices: int, offset: int = 0) -> Group:
        """All ``P`` devices (as the other groups, the worst-placed: 12 devices on 8-GPU
        nodes are 8 + 4, priced by the thinner node's 4, whose NICs carry the most
        across nodes: ``Group(12, 4, 2)``)."""
        return node_group(((1, self.p),), self.p, per_node_devices, offset)

    def output_dist(self) -> Dist:
        """Where the layer's output lives (model/data: replicated over the row group).
        Kept on the instance: the search asks for it for every layer of every plan."""
        dist: Dist | None = self.__dict__.get("_dist")
        if dist is None:
            dist = _output_dist(self)
            object.__setattr__(self, "_dist", dist)  # not a field: equality is unchanged
        return dist


@functools.lru_cache(maxsize=4096)
def _output_dist(layout: Layout) -> Dist:
    # a sequence's tokens split over the row group are its "height" blocks
    if layout.mode in ("domain", "row-sp", "model-sp", "ulysses", "expert-sp"):
        return Dist(layout.p, layout.c_digit, layout.r_digit,
                    tensor=layout.mode in ("row-sp", "model-sp", "expert-sp"))
    if layout.mode == "expert":  # every device its own samples, as under data parallelism
        return Dist(layout.p, (1, layout.p), None)
    if layout.mode in ("column", "column-sp"):
        return Dist(layout.p, layout.c_digit, None, layout.r_digit)
    return Dist(layout.p, layout.c_digit, None)


def input_dist(layout: Layout) -> Dist:
    """The distribution a layer with weights needs its input in: a ``row`` layout's split
    by features, a ``column`` layout's replicated over the row group, a
    ``column-sp`` or ``model-sp`` layout's split by tokens over the row group (it
    all-gathers them itself), the others' where their output lives."""
    if layout.mode in ("row", "row-sp"):
        return Dist(layout.p, layout.c_digit, None, layout.r_digit)
    if layout.mode == "column":
        return Dist(layout.p, layout.c_digit, None)
    if layout.mode in ("column-sp", "model-sp"):
        return Dist(layout.p, layout.c_digit, layout.r_digit, tensor=True)
    return layout.output_dist()


def holds_alike(a: Layout, b: Layout) -> bool:
    """Whether an embedding in layout ``a`` and the output head that shares its table in
    ``b`` hold the table alike: the same layout, or the embedding split by vocabulary
    rows (``model``, or ``model-sp``: its output reduce-scattered by tokens) and the head
    split by output features, which are those rows (``model``, or ``column`` or
    ``column-sp`` with its logits left split: Megatron's vocabulary-parallel embedding,
    head and cross-entropy), on the same grid."""
    if a == b:
        return True
    return a.mode in ("model", "model-sp") and b.mode in ("model", "column", "column-sp") \
        and (a.pr, a.pc, a.placement) == (b.pr, b.pc, b.placement)


def make_layout(mode: str, pr: int, pc: int, placement: str = "rows") -> Layout:
    """A canonical layout: ``P_r = 1`` is ``data``; a one-dimensional grid has no
    placement choice (``rows``)."""
    if pr == 1:
        mode = "data"
    if pr == 1 or pc == 1:
        placement = "rows"
    return Layout(mode, pr, pc, placement)


#: beyond this many (group, member) pairs to inspect, :func:`node_group` uses the
#: closed form of the group at device 0
NODE_GROUP_MAX_PAIRS = 1 << 22


def _groups(digits: tuple[tuple[int, int], ...], span: int) -> np.ndarray:
    """The groups of devices below ``span`` that differ only in ``digits``: one row per
    group, its members ``base + Σ j_i·stride_i``."""
    offsets = np.zeros(1, dtype=np.int64)
    for stride, count in digits:
        offsets = (offsets[:, None] + np.arange(count, dtype=np.int64) * stride).ravel()
    k = np.arange(span, dtype=np.int64)
    is_base = np.ones(span, dtype=bool)
    for stride, count in digits:
        is_base &= (k // stride) % count == 0
    members: np.ndarray = k[is_base][:, None] + offsets[None, :]
    return members


def _one_digit_group(stride: int, count: int, p: int, g: int, offset: int) -> Group:
    """:func:`node_group` of one digit whose stride divides a node, in closed form: a
    group whose first member sits at ``o`` in its node has ``⌈(g − o) / stride⌉`` members
    there, ``g / stride`` in each full node after, and the rest in its last; the groups
    start at every ``offset + r + k·stride·count`` (``r < stride``), whose places in a
    node repeat within ``g`` values of ``k`` (2,052 consecutive ranks on 8-GPU nodes:
    256 nodes of 8 and one of 4; 1,455 on 8-GPU nodes: the second group begins at the
    node's last device, one member there, and spans 183 nodes; audits found both
    priced as the first group's)."""
    per = g // stride
    worst: tuple[float, int, int] | None = None  # (load, nodes, thinnest)
    groups = p // (stride * count)
    for k in range(min(groups, g)):
        for r in range(stride):
            o = (offset + r + k * stride * count) % g
            first = min(count, (g - o + stride - 1) // stride)
            if first == count:
                m, q = 1, count
            else:
                full, last = divmod(count - first, per)
                m = 1 + full + (1 if last else 0)
                q = min(first, per if full else count, last if last else count)
            load = (m - 1) / (m * q)
            if worst is None or (load, m) > worst[:2]:
                worst = (load, m, q)
    assert worst is not None
    _, m, q = worst
    size = count
    return Group(size, q) if q * m == size else Group(size, q, m)


@functools.lru_cache(maxsize=8192)
def node_group(digits: tuple[tuple[int, int], ...], p: int, per_node_devices: int,
               offset: int = 0) -> Group:
    """The worst of the groups of devices that differ only in ``digits`` (each
    ``(stride, count)``: the members are ``base + Σ j_i·stride_i``), as the two-tier
    network sees it. All such groups run their collective at once and the layer waits
    for the slowest: a group of 6 consecutive devices on 8-GPU nodes lies in one node
    for devices 0-5 but spans two for 6-11 (2 + 4). The slowest is the one whose
    thinnest node's NICs carry the most across nodes, ``(m − 1) / (m · q)`` of the
    data for ``m`` nodes with ``q`` members on the thinnest (the inter-node share of a
    hierarchical all-reduce; ties: the most nodes). Returned as ``Group(size, q, m)``
    (``Group(size, size / m)`` where the members fill their nodes evenly).
    ``offset``: device 0's position in its node, for devices that do not begin a node
    (a pipeline stage on ranks 6-11 of 8-GPU nodes has offset 6: its device k is rank
    6 + k, on node (6 + k) // 8)."""
    digits = tuple(d for d in digits if d[1] > 1)
    size = math.prod(c for _, c in digits)
    g = per_node_devices
    offset %= g
    if size <= 1:
        return Group(1, 1)
    # groups repeat their node pattern every lcm(g, stride·count) devices (shifting
    # every device by a multiple of g moves every group by whole nodes)
    period = math.lcm(g, *(s * c for s, c in digits))
    span = min(p, period)
    if span * size > NODE_GROUP_MAX_PAIRS and len(digits) == 1 \
            and digits[0][0] < g and g % digits[0][0] == 0:
        return _one_digit_group(*digits[0], p, g, offset)
    if span * size > NODE_GROUP_MAX_PAIRS:
        inside = 1
        for stride, count in digits:
            inside *= 1 if stride >= g else min(count, max(1, g // stride))
        if offset:  # a group that began a node now straddles two: at worst half as many
            inside = max(1, inside // 2)
        return Group(size, max(1, min(size, inside)))
    nodes = np.sort((_groups(digits, span) + offset) // g, axis=1)
    rows = nodes.shape[0]
    # runs of one node in each sorted row: their lengths are the members per node
    flat = (nodes + np.arange(rows, dtype=np.int64)[:, None] * (nodes.max() + 1)).ravel()
    starts = np.flatnonzero(np.diff(flat, prepend=-1) != 0)
    lengths = np.diff(np.append(starts, flat.size))
    first = np.searchsorted(starts, np.arange(rows, dtype=np.int64) * size)
    thinnest = np.minimum.reduceat(lengths, first)
    touched = np.diff(np.append(first, starts.size))
    load = (touched - 1) / (touched * thinnest)
    worst = int(np.lexsort((-touched, -load))[0])
    m, q = int(touched[worst]), int(thinnest[worst])
    if q * m == size:
        return Group(size, q)
    return Group(size, q, m)


@dataclass(frozen=True)
class Dist:
    """An activation distribution over ``p`` devices: batch digit, optional height digit
    and optional feature digit (each ``(stride, count)``); replicated over the remaining
    digits."""

    p: int
    batch: tuple[int, int]
    height: tuple[int, int] | None
    feature: tuple[int, int] | None = None
    #: the height digit splits a sequence over the tensor-parallel group of the layers
    #: around it (sequence parallelism, Korthikanti et al. 2022), whose weights are split
    #: over it and replicated over the batch digit: a norm's scale there reduces its
    #: gradient as Megatron-LM does (:func:`planner.costs.layer._params_terms`)
    tensor: bool = False

    @property
    def split(self) -> int:
        """Blocks of one sample's activation: the height or feature split (1: whole)."""
        return (self.height[1] if self.height else 1) * (
            self.feature[1] if self.feature else 1)

    @property
    def fraction(self) -> float:
        """The fraction of the whole activation (batch × features) one device holds."""
        return 1.0 / (self.batch[1] * self.split)


@dataclass(frozen=True)
class Redistribution:
    """What moving from one distribution to another costs one device, at worst.

    ``received`` is the fraction of the whole activation (``B × d``) the busiest device
    receives; ``kind`` is ``none``, ``gather`` (an all-gather over ``group``: every
    member's new block is the same union of old blocks held by ``group``) or
    ``exchange``: a personalised exchange with ``sources`` peers over ``group``. An
    exchange is ``tiered`` where the blocks are aligned but the members of ``group``
    need different parts of one another's blocks (data → domain: device ``k`` needs
    height block ``k`` of every batch block), so that each peer sends an equal part and
    only the peers on other nodes cross the inter-node tier; otherwise (misaligned
    blocks) all of it is priced on the slowest tier the group crosses. A tiered
    exchange may instead all-gather the members' whole blocks, ``whole`` of the
    activation, and keep what the device needs: more bytes, but across nodes in
    ``m − 1`` hierarchical steps rather than one message per peer (the cost model
    takes the cheaper).
    """

    kind: str
    received: float
    need: float
    group: Group | None = None
    sources: int = 0
    tiered: bool = False
    whole: float = 0.0


def _nested(src: tuple[int, int], dst: tuple[int, int]) -> bool:
    """Whether the dst block of every device lies inside its src block."""
    (s1, n1), (s2, n2) = src, dst
    if n1 == 1:
        return True
    return n2 % n1 == 0 and s1 == s2 * (n2 // n1)


def _axis_overlap(k: np.ndarray, src: tuple[int, int] | None, dst: tuple[int, int] | None,
                  ) -> np.ndarray:
    """Per device: |dst block ∩ src block| as a fraction of the axis."""
    if dst is None:
        n2, lo2 = 1, np.zeros_like(k, dtype=np.float64)
    else:
        n2 = dst[1]
        lo2 = ((k // dst[0]) % dst[1]) / dst[1]
    if src is None:
        return np.full(k.shape, 1.0 / n2)
    n1 = src[1]
    lo1 = ((k // src[0]) % src[1]) / src[1]
    hi = np.minimum(lo1 + 1.0 / n1, lo2 + 1.0 / n2)
    lo = np.maximum(lo1, lo2)
    overlap: np.ndarray = np.maximum(0.0, hi - lo)
    return overlap


def _pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def _axis_min_overlap_pow2(src: tuple[int, int] | None, dst: tuple[int, int] | None) -> float:
    """Minimum over devices of the axis overlap when every stride and count is a power of
    two: block indices are bit fields of the device number, and two blocks overlap iff
    the bits of the coarser index appear at the same positions in both."""
    n2 = 1 if dst is None else dst[1]
    if src is None or src[1] == 1:
        return 1.0 / n2
    if dst is None or n2 == 1:
        return 1.0 / src[1]
    (s1, n1), (s2, n2) = src, dst
    t = min(n1, n2).bit_length() - 1
    top1 = (s1.bit_length() - 1) + (n1.bit_length() - 1)
    top2 = (s2.bit_length() - 1) + (n2.bit_length() - 1)
    if t == 0 or top1 == top2:
        return 1.0 / max(n1, n2)
    return 0.0


def _axis(src: tuple[int, int] | None, dst: tuple[int, int] | None,
          ) -> tuple[float, tuple[int, int] | None] | None:
    """One axis of a redistribution: (the overlap every device has, the gather digit or
    None), or None when the blocks are misaligned."""
    n_dst = 1 if dst is None else dst[1]
    if src is None or src[1] == 1:
        return 1.0 / n_dst, None  # the device holds the whole axis
    if dst is None or dst[1] == 1:
        return 1.0 / src[1], src  # gather every block of the axis
    if _nested(src, dst):
        return 1.0 / dst[1], None  # the new block lies inside the old one
    if _nested(dst, src):
        return 1.0 / src[1], (src[0], src[1] // dst[1])  # gather the old blocks
    return None


def _shared_target(dst: Dist, strides: tuple[tuple[int, int], ...]) -> bool:
    """Whether all devices that differ only in the digits ``strides`` have the same
    block of ``dst`` (then gathering over them is an all-gather). Checked on every such
    group, each device in one, up to :data:`BRUTE_FORCE_MAX_P` devices; beyond, by the
    digits' place values: a gather digit ``(s, c)`` leaves a block digit ``(t, n)``
    alone when ``[s, s·c)`` and ``[t, t·n)`` do not overlap (exact where the digits
    are those of one mixed radix, as a grid's are)."""
    digits = tuple(sorted(d for d in (dst.batch, dst.height, dst.feature)
                          if d is not None and d[1] > 1))
    if dst.p > BRUTE_FORCE_MAX_P:
        return all(s * c <= t or t * n <= s for s, c in strides for t, n in digits)
    return _digits_shared(dst.p, digits, strides)


@functools.lru_cache(maxsize=8192)
def _digits_shared(p: int, digits: tuple[tuple[int, int], ...],
                   strides: tuple[tuple[int, int], ...]) -> bool:
    """:func:`_shared_target` on every group of ``p`` devices (memoised: distributions
    of many layouts share their block digits)."""
    members = _groups(strides, p)
    for digit in digits:
        index = (members // digit[0]) % digit[1]
        if np.any(index != index[:, :1]):
            return False
    return True


@functools.lru_cache(maxsize=65536)
def redistribution(src: Dist, dst: Dist, per_node_devices: int,
                   offset: int = 0) -> Redistribution:
    """The worst device's data movement from ``src`` to ``dst`` (see :class:`Dist`;
    ``offset``: see :func:`node_group`)."""
    need = dst.fraction
    if src == dst:
        return Redistribution("none", 0.0, need)
    axes = [(src.batch, dst.batch), (src.height, dst.height), (src.feature, dst.feature)]
    found = [_axis(a, z) for a, z in axes]
    if all(ax is not None for ax in found):
        aligned = [ax for ax in found if ax is not None]
        overlap = math.prod(ov for ov, _ in aligned)
        strides = tuple(d for _, d in aligned if d is not None)
        if not strides:
            return Redistribution("none", 0.0, need)
        group = node_group(strides, src.p, per_node_devices, offset)
        if _shared_target(dst, strides):
            return Redistribution("gather", max(0.0, need - overlap), need, group)
        # the members need different parts of one another's blocks: not an all-gather,
        # whose hierarchical form sends each byte across nodes once for the whole node
        return Redistribution("exchange", max(0.0, need - overlap), need, group,
                              group.size - 1, tiered=True,
                              whole=min(1.0, group.size * src.fraction))
    # Misaligned blocks: the worst device's overlap, exactly where we can.
    p = src.p
    if all(_pow2(x) for a, z in axes for d in (a or (1, 1), z or (1, 1)) for x in d):
        ov = math.prod(_axis_min_overlap_pow2(a, z) for a, z in axes)
    elif p <= BRUTE_FORCE_MAX_P:
        k = np.arange(p)
        ov = float(np.min(math.prod(_axis_overlap(k, a, z) for a, z in axes)))
    else:
        ov = 0.0  # conservative: the whole new block may have to arrive
    sources = -(-src.batch[1] // dst.batch[1]) + 1
    for a, z in axes[1:]:
        if a is not None:
            sources *= -(-a[1] // (z[1] if z else 1)) + 1
    sources = max(1, min(sources, p - 1))
    group = node_group(((1, p),), p, per_node_devices, offset) if offset else \
        Group(p, min(p, per_node_devices))
    return Redistribution("exchange", max(0.0, need - ov), need, group, sources)


# ---------------------------------------------------------------------------------------
# Parsing layouts from the command line


_GRID = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


def parse_grid(text: str, gpus: int, count: str = "--gpus") -> tuple[int, int]:
    """``'32x16'`` → ``(32, 16)``, checked against the device count.

    ``count`` names where the device count came from in messages (``--gpus`` on the
    command line, ``gpus`` in a training configuration).
    """
    m = _GRID.match(text)
    if m is None:
        raise UsageError(f"planner: error: invalid grid {text[:40]!r}: expected PRxPC, e.g. "
                         "32x16")
    if max(len(m.group(1)), len(m.group(2))) > 100:  # int() refuses 4,300 digits
        raise UsageError(f"planner: error: invalid grid {text[:40]!r}: more devices than "
                         f"{count} {gpus}")
    pr, pc = int(m.group(1)), int(m.group(2))
    if pr < 1 or pc < 1:
        raise UsageError(f"planner: error: invalid grid {text!r}: both sides must be ≥ 1")
    if pr * pc != gpus:
        raise UsageError(f"planner: error: grid {pr}x{pc} has {pr * pc} devices but {count} "
                         f"is {gpus}; P_r × P_c must equal the device count")
    return pr, pc


@dataclass(frozen=True)
class Pin:
    """``GLOB=MODE[:PRxPC[:rows|cols]]`` from ``--pin``."""

    pattern: str
    mode: str
    grid: tuple[int, int] | None
    text: str
    #: rows or cols for this pin's layers (None: the command's --placement, or, in the
    #: search, either)
    placement: str | None = None


PIN_FORM = "GLOB=MODE[:PRxPC[:rows|cols]]"


def parse_pin(text: str, gpus: int, count: str = "--gpus", what: str = "--pin") -> Pin:
    """Parse one ``--pin`` value (``what`` and ``count`` name its source in messages)."""
    if "=" not in text:
        raise UsageError(f"planner: error: invalid {what} {text!r}: expected {PIN_FORM}, "
                         "e.g. 'conv*=data' or 'fc*=model:32x16:cols'")
    pattern, _, rhs = text.partition("=")
    pattern = pattern.strip()
    mode, _, rest = rhs.partition(":")
    grid_text, _, placement = rest.partition(":")
    mode, placement = mode.strip(), placement.strip()
    if not pattern:
        raise UsageError(f"planner: error: invalid {what} {text!r}: the layer pattern is empty")
    if mode not in MODES:
        raise UsageError(f"planner: error: invalid {what} {text!r}: mode must be one of "
                         f"{', '.join(MODES)}")
    if ":" in rest and not grid_text.strip():
        raise UsageError(f"planner: error: invalid {what} {text!r}: a placement needs the "
                         f"grid it places, e.g. '{pattern}={mode}:4x2:cols' ({PIN_FORM})")
    if placement and placement not in PLACEMENTS:
        raise UsageError(f"planner: error: invalid {what} {text!r}: placement "
                         f"{placement[:20]!r} must be rows or cols ({PIN_FORM})")
    grid = parse_grid(grid_text, gpus, count) if grid_text.strip() else None
    if mode == "data" and grid is not None and grid[0] != 1:
        raise UsageError(f"planner: error: invalid {what} {text!r}: data parallelism is the "
                         f"grid 1x{gpus}")
    if placement and grid is not None and 1 in grid:
        # a grid of one dimension places one way whatever it is called: the plan writes
        # `placement: rows` for it, and a pin copied from a plan must read back (found
        # by an audit: `--pin wte=data:1x8:rows` exited 2)
        placement = ""
    return Pin(pattern, mode, grid, text, placement or None)


def pin_grid_devices(text: str) -> int | None:
    """The devices of a ``--pin``'s grid, ``P_r × P_c`` (None without a grid, or where it
    does not parse: :func:`parse_pin` says why), before it is checked against a device
    count: with pipeline stages a pin's grid is one stage's."""
    grid_text = text.partition("=")[2].partition(":")[2].partition(":")[0]
    m = _GRID.match(grid_text)
    if m is None or max(len(m.group(1)), len(m.group(2))) > 100:
        return None
    return int(m.group(1)) * int(m.group(2))


def pin_layout(pin: Pin, gpus: int, placement: str = "rows") -> Layout:
    """The layout a pin asks for (model/domain without a grid: all devices on P_r; the
    pin's own placement before the command's)."""
    if pin.mode == "data":
        return make_layout("data", 1, gpus)
    pr, pc = pin.grid if pin.grid is not None else (gpus, 1)
    return make_layout(pin.mode, pr, pc, pin.placement or placement)


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order."""
    return list(_divisors(n))


@functools.lru_cache(maxsize=256)
def _divisors(n: int) -> tuple[int, ...]:
    # every layer asks; for P near 2^30 the scan takes milliseconds
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return tuple(small + large[::-1])
