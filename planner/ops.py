"""Kernel problems: the shapes a kernel-time estimator is asked about.

Three kinds cover the work of training:

* :class:`Gemm`: ``C[m, n] = A[m, k] · B[k, n]``, ``batch`` independent products
  (``batch > 1`` is a batched GEMM, ``torch.bmm``);
* :class:`Conv`: a 2-D convolution in NCHW layout and one of its three training passes
  (forward, backward-data, backward-filter), as cuDNN sees it;
* :class:`Elementwise`: a memory-bound pass over tensors (activations, norms, pooling,
  softmax, residual adds, optimizer updates).

Each knows its FLOPs and the fewest bytes it must move (every input read once, every
output written once), which is what the roofline needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ConvPhase = Literal["fwd", "bwd_data", "bwd_filter"]


@dataclass(frozen=True)
class Gemm:
    """``batch`` products ``C[m, n] = A[m, k] · B[k, n]`` in one kernel."""

    m: int
    n: int
    k: int
    batch: int = 1
    #: what the product is to a layer whose tensor-parallel collectives overlap it
    #: (``fprop``, ``dgrad``, ``wgrad`` of a linear layer or of attention's input
    #: projection; with ``-out``, of attention's output projection); not part of the
    #: problem, so equal shapes are equal kernels
    role: str = field(default="", compare=False)

    @property
    def flops(self) -> float:
        """2 FLOPs per multiply-accumulate."""
        return 2.0 * self.m * self.n * self.k * self.batch

    def bytes_moved(self, elem_bytes: int) -> float:
        """Read A and B once, write C once."""
        return float(elem_bytes) * self.batch * (self.m * self.k + self.k * self.n
                                                 + self.m * self.n)

    @property
    def op(self) -> str:
        """``gemm`` or ``bmm``."""
        return "bmm" if self.batch > 1 else "gemm"


@dataclass(frozen=True)
class Conv:
    """A 2-D convolution problem (NCHW), with the training pass it stands for."""

    n: int  # batch
    c: int  # input channels
    h: int  # input height
    w: int  # input width
    k: int  # output channels
    r: int  # filter height
    s: int  # filter width
    stride_h: int = 1
    stride_w: int = 1
    pad_h: int = 0
    pad_w: int = 0
    dil_h: int = 1
    dil_w: int = 1
    groups: int = 1
    phase: ConvPhase = "fwd"
    #: a band of output rows of an image cut by height (domain parallelism) into this
    #: many: the whole image is ``full_h`` rows with padding ``full_pad_h``
    #: (:meth:`batch_split`); 1: the whole image
    bands: int = 1
    full_h: int = 0
    full_pad_h: int = 0

    def batch_split(self) -> tuple[Conv, float] | None:
        """A band's counterpart with the same work split by samples instead (``ceil(n /
        bands)`` whole images; None for a whole image), and the band's work over its
        counterpart's (output rows × images; less than 1 where the images do not divide).
        The two run the same implicit GEMM, ``M = N·P·Q`` rows, so a spatial split
        computes no faster than a batch split of the same work (Gholami et al.'s model,
        compute ``FLOPs / P`` either way): estimators hold the band to it, where kernel
        models would otherwise time two shapes of one GEMM apart and a search choose
        domain parallelism for that (VGG-16 on 8 A100s at batch 256: a height split of
        every convolution came out 13% faster than data parallelism, from compute)."""
        if self.bands <= 1:
            return None
        n = -(-self.n // self.bands)
        whole = Conv(n, self.c, self.full_h, self.w, self.k, self.r, self.s, self.stride_h,
                     self.stride_w, self.full_pad_h, self.pad_w, self.dil_h, self.dil_w,
                     self.groups, self.phase)
        work = (self.n * self.out_h) / (n * whole.out_h) if whole.out_h > 0 else 1.0
        return whole, work

    @property
    def out_h(self) -> int:
        """Output height."""
        return (self.h + 2 * self.pad_h - self.dil_h * (self.r - 1) - 1) // self.stride_h + 1

    @property
    def out_w(self) -> int:
        """Output width."""
        return (self.w + 2 * self.pad_w - self.dil_w * (self.s - 1) - 1) // self.stride_w + 1

    @property
    def macs(self) -> float:
        """Multiply-accumulates of direct convolution (the same for all three passes)."""
        return float(self.n) * self.k * self.out_h * self.out_w * (self.c // self.groups) \
            * self.r * self.s

    @property
    def flops(self) -> float:
        """2 FLOPs per multiply-accumulate of direct convolution."""
        return 2.0 * self.macs

    def bytes_moved(self, elem_bytes: int) -> float:
        """Input, filter and output each touched once (which is read or written depends
        on the pass; the sum is the same)."""
        x = self.n * self.c * self.h * self.w
        f = self.k * (self.c // self.groups) * self.r * self.s
        y = self.n * self.k * self.out_h * self.out_w
        return float(elem_bytes) * (x + f + y)

    def implicit_gemm(self) -> Gemm:
        """The GEMM this pass maps to (per group; ``batch`` = groups)."""
        g = self.groups
        npq = self.n * self.out_h * self.out_w
        crs = (self.c // g) * self.r * self.s
        if self.phase == "fwd":
            return Gemm(npq, self.k // g, crs, g)
        if self.phase == "bwd_data":
            return Gemm(self.n * self.h * self.w, self.c // g, (self.k // g) * self.r * self.s, g)
        return Gemm(self.k // g, crs, npq, g)

    @property
    def op(self) -> str:
        """``conv_fwd``, ``conv_bwd_data`` or ``conv_bwd_filter``."""
        return f"conv_{self.phase}"


@dataclass(frozen=True)
class Elementwise:
    """A memory-bound pass: ``bytes`` moved and ``flops`` of simple arithmetic."""

    bytes: float
    flops: float = 0.0
    label: str = "elementwise"

    @property
    def op(self) -> str:
        """Always ``elementwise``."""
        return "elementwise"

    def bytes_moved(self, elem_bytes: int) -> float:
        """Bytes were counted when the op was built."""
        return self.bytes


Kernel = Gemm | Conv | Elementwise
