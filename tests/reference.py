"""Independent float64 references (plain Python / math.fsum), written from TF's formulas, not from gradtool."""

from __future__ import annotations

import math

import numpy as np


def ref_l2(a) -> float:
    v = np.asarray(a, dtype=np.float64).ravel()
    if v.size == 0:
        return 0.0
    m = float(np.max(np.abs(v)))
    if not math.isfinite(m):
        return math.nan if np.isnan(v).any() else math.inf
    if m == 0:
        return 0.0
    return m * math.sqrt(math.fsum((x / m) ** 2 for x in v.tolist()))


def ref_global(arrays) -> float:
    norms = [ref_l2(a) for a in arrays]
    m = max(norms, default=0.0)
    if m == 0 or not math.isfinite(m):
        return m
    return m * math.sqrt(math.fsum((n / m) ** 2 for n in norms))


def ref_mean_std(a) -> tuple[float | None, float | None]:
    """Mean and population std of the finite elements, exactly: every float64 is an integer multiple of
    2^-1074, so the sums are big integers and only the final rounding is inexact (the std's square root is
    taken to 106 bits first). (None, None) when no element is finite."""
    from fractions import Fraction

    v = [x for x in np.asarray(a, dtype=np.float64).ravel().tolist() if math.isfinite(x)]
    if not v:
        return None, None
    ks = []
    for x in v:
        p, q = x.as_integer_ratio()  # q is a power of two that divides 2^1074
        ks.append(p * ((1 << 1074) // q))
    n, total, squares = len(v), sum(ks), sum(k * k for k in ks)
    mean = Fraction(total, n << 1074)
    var = Fraction(squares * n - total * total, (n * n) << 2148)  # Σ(x - mean)² / n
    if var == 0:
        return float(mean), 0.0
    k = max(0, (212 - (var.numerator.bit_length() - var.denominator.bit_length())) // 2)
    return float(mean), float(Fraction(math.isqrt(var.numerator * 4**k // var.denominator), 2**k))


def ref_clip_by_norm(a, c, axes=None) -> np.ndarray:
    """TF: t * c / max(l2norm, c) in float64, per slice over axes."""
    v = np.asarray(a, dtype=np.float64)
    m = np.max(np.abs(v), axis=axes, keepdims=True) if v.size else np.zeros((1,) * v.ndim)
    m = np.where(m > 0, m, 1.0)  # rescale so squares neither overflow nor underflow
    n = m * np.sqrt(np.sum((v / m) ** 2, axis=axes, keepdims=True))
    return np.where(n > c, v * (c / np.maximum(n, c)), v)


def ref_clip_by_global_norm(arrays, c):
    n = ref_global(arrays)
    scale = c * min(1.0 / n, 1.0 / c) if n > 0 else 1.0
    return [np.asarray(a, dtype=np.float64) * scale for a in arrays], n


RTOL = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}
