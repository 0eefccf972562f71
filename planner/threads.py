"""The environment variables BLAS libraries read for their thread count when loaded (no
numpy here: the command line sets them before numpy loads)."""

from __future__ import annotations

BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

__all__ = ["BLAS_THREAD_VARS"]
