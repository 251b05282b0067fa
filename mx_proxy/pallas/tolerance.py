"""How far an MX GEMM's result may lie from its reference: both add the same exact products in different
orders (:func:`accumulation_tolerance`), and Hopper's FP8 tensor cores keep fewer bits while summing a 32-deep
chunk (:func:`mma_tolerance`). Host-side float64, for the tests and the benchmark's sanity column."""

from __future__ import annotations

import numpy as np

__all__ = ["accumulation_tolerance", "mma_tolerance"]


def accumulation_tolerance(qa, qb) -> np.ndarray:
    """Elementwise bound on ``|kernel - reference|`` for ``qa (M, K) @ qb (K, N)``.

    Both sides add the same exact float32 products in different orders; each
    sum is within ``K * u * sum_k |qa[m, k] * qb[k, n]|`` (u = 2**-24) of the
    exact value, so they differ by at most twice that. ``2**-126 * K`` more
    covers products flushed to zero where float32 subnormals are (XLA CPU).
    Host-side float64 (for tests and the benchmark's sanity column).
    """
    qa = np.nan_to_num(np.abs(np.asarray(qa, np.float64)), nan=0.0)
    qb = np.nan_to_num(np.abs(np.asarray(qb, np.float64)), nan=0.0)
    k = qa.shape[1]
    return 2.0 * k * 2.0**-24 * (qa @ qb) + k * 2.0**-126


def mma_tolerance(qa, qb) -> np.ndarray:
    """:func:`accumulation_tolerance` plus ``2**-8 (|qa| @ |qb|)``: the FP8 tensor
    cores of Hopper sum the products of a 32-deep chunk in a fixed-point
    window of about 14 bits (DeepSeek-V3, sec. 3.3.2); with at least 13 bits
    each of the 32 products loses at most ``2**-13`` of the largest, i.e. at
    most ``2**-8`` of the chunk's sum of magnitudes. For compiled fp8-mode
    results on a GPU; interpreted kernels meet :func:`accumulation_tolerance`."""
    qa64 = np.nan_to_num(np.abs(np.asarray(qa, np.float64)), nan=0.0)
    qb64 = np.nan_to_num(np.abs(np.asarray(qb, np.float64)), nan=0.0)
    return accumulation_tolerance(qa, qb) + 2.0**-8 * (qa64 @ qb64)
