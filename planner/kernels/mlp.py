"""A small multilayer perceptron in numpy: the inference half of the learned model.

``z = W_L·tanh(… tanh(W_1·x̂ + b_1) …) + b_L`` with ``x̂ = (x − mean) / std``; the
kernel's time is ``t_bound · (1 + exp(−z))``, i.e. the achieved fraction of the roofline
bound is ``sigmoid(z)``, in (0, 1) by construction (NeuSight, ASPLOS'25, bounds its
utilisation MLP the same way). ``tanh`` saturates, so the prediction stays bounded far
from the training data.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Mlp:
    """Weights and input normalisation of one fitted network."""

    weights: tuple[FloatArray, ...]  #: W_1, W_2, …, W_L (``in × out``)
    biases: tuple[FloatArray, ...]
    mean: FloatArray
    std: FloatArray

    @property
    def n_params(self) -> int:
        """Number of fitted weights and biases."""
        return int(sum(w.size for w in self.weights) + sum(b.size for b in self.biases))

    @cached_property
    def first_layer(self) -> tuple[FloatArray, FloatArray]:
        """``W_1`` and ``b_1`` with the input normalisation folded in, so that
        ``x̂·W_1 + b_1 = x·(W_1 / std) + (b_1 − (mean / std)·W_1)``: one matrix product
        instead of a subtraction and a division over every feature of every row."""
        w = self.weights[0] / self.std[:, None]
        b = self.biases[0] - (self.mean / self.std) @ self.weights[0]
        return w, b

    def logit(self, x: FloatArray) -> FloatArray:
        """The network's output ``z`` for raw feature rows ``x`` (``rows × features``)."""
        w1, b1 = self.first_layer
        return self.rest(x @ w1 + b1)

    def rest(self, a1: FloatArray) -> FloatArray:
        """The output from the first layer's pre-activation ``a1`` (left unchanged)."""
        h = a1
        for w, b in zip(self.weights[1:], self.biases[1:], strict=True):
            h = tanh(h) @ w + b
        out: FloatArray = h[:, 0]
        return out


def tanh(a: FloatArray) -> FloatArray:
    """``tanh(a) = 1 − 2 / (exp(2a) + 1)``, in a new array, within 4·10⁻¹⁶ of
    ``np.tanh`` (absolute; the next layer is linear, so absolute error is what carries).

    Prediction spends most of its time here: on CPUs where numpy's ``tanh`` is a scalar
    loop and its ``exp`` a SIMD one (AVX2 without AVX-512, as on the AMD EPYC the README's
    speed figures were taken on), this is 3.4 times faster, and 6,000 kernels take
    41 ms instead of 56. Kernel times are rounded to 24 significant bits afterwards
    (:func:`~.estimator.reproducible`), so a difference of some 10⁻¹⁶ changes a time
    only where a rounding step falls between the two: none of 2,160,000 kernel times
    did (120,000 GEMM, bmm and convolution kernels on six GPUs in three dtypes). Fitting
    (:mod:`.train`) keeps ``np.tanh``; ±inf and NaN come out as ``np.tanh``'s."""
    with np.errstate(over="ignore"):  # 2a or exp(2a) = inf for a > 354: 2 / inf = 0, 1
        h: FloatArray = np.multiply(a, 2.0)
        np.exp(h, out=h)
    h += 1.0
    np.divide(2.0, h, out=h)
    np.subtract(1.0, h, out=h)
    return h


def log_slowdown(z: FloatArray) -> FloatArray:
    """``log(1 + exp(−z))``: how many e-folds above the bound (≥ 0), computed stably."""
    return np.logaddexp(0.0, -z)


def fraction(z: FloatArray) -> FloatArray:
    """Achieved fraction of the roofline bound, ``sigmoid(z)``."""
    return np.exp(-log_slowdown(z))


__all__ = ["Mlp", "fraction", "log_slowdown", "tanh"]
