"""Clipping ops with TensorFlow's names, argument order and formulas, and gradtool's stricter stance.

Reference: TensorFlow ``tensorflow/python/ops/clip_ops.py``. Differences (see README "Deviations"):
norms are computed in float64 (never overflow), the clip scale is computed in float64 and applied in the
tensor's dtype (see :func:`scale_tensor`), a tensor that is not clipped is returned unchanged
(bit-identical, the same object),
non-float tensors pass through untouched, nonsense thresholds raise :class:`UsageError`, and NaN/Inf is
handled by an explicit ``nonfinite`` policy:

* ``"error"`` (default): raise :class:`NonFiniteError` naming the tensors (list indices) that hold NaN/Inf;
* ``"propagate"``: do what TensorFlow does (NaN/Inf flow through the formula; for the global norm, every
  element of every float tensor becomes NaN);
* ``"zero"``: replace NaN/±Inf elements by 0 first, then clip as usual.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..backend import asarray, is_floating, is_numpy_namespace, namespace_of
from ..errors import NonFiniteError, UsageError
from .norms import combine_norms, parse_norm_type, slice_l2_norms, tensor_norm

NONFINITE_POLICIES = ("error", "propagate", "zero")


# ----------------------------------------------------------------------------------------------- checks
def check_nonfinite_policy(nonfinite: str) -> str:
    if nonfinite not in NONFINITE_POLICIES:
        raise UsageError(f"nonfinite must be one of {', '.join(NONFINITE_POLICIES)}, not {nonfinite!r}")
    return nonfinite


def check_clip_norm(clip_norm: Any, what: str = "clip_norm") -> float:
    """A norm threshold must be a finite number > 0."""
    try:
        value = float(clip_norm)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a number, not {clip_norm!r}") from None
    if not math.isfinite(value) or value <= 0.0:
        raise UsageError(f"{what} must be finite and > 0, got {value!r}; pass a positive threshold")
    return value


def normalize_axes(axes: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """TF-style axes (negatives allowed) as sorted non-negative ints; None = all dimensions."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = (axes,)
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < ndim:
            raise UsageError(f"axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise UsageError(f"axes {tuple(axes)} repeat a dimension")
    return tuple(sorted(out))


def has_nonfinite(x: Any, /, *, xp: ModuleType | None = None) -> bool:
    """True when a float tensor holds any NaN or ±Inf."""
    xp = namespace_of(x, xp=xp)
    if not is_floating(x) or math.prod(x.shape) == 0:
        return False
    return not bool(xp.all(xp.isfinite(x)))


def zero_nonfinite(x: Any, /, *, xp: ModuleType | None = None) -> Any:
    """x with NaN/±Inf elements replaced by 0 (x itself when it has none)."""
    xp = namespace_of(x, xp=xp)
    if not has_nonfinite(x, xp=xp):
        return x
    return xp.where(xp.isfinite(x), x, xp.zeros_like(x))


def zero_nonfinite_in_place(x: np.ndarray, *, bfloat16_bits: bool = False) -> int:
    """In place: the NaN and ±inf of NumPy float array ``x`` set to +0.0, as :func:`zero_nonfinite` replaces
    them; with ``bfloat16_bits``, of bfloat16 values held as their bits (uint16: exponent all ones, ``x &
    0x7F80 == 0x7F80``; without ml_dtypes), set to +0.0's (0). Returns how many."""
    mask = (x & 0x7F80) == 0x7F80 if bfloat16_bits else ~np.isfinite(x)
    n = int(np.count_nonzero(mask))
    if n:
        x[mask] = 0
    return n


def _apply_policy(t: Any, nonfinite: str, xp: ModuleType, label: Any = 0) -> Any:
    if nonfinite == "propagate":
        return t
    if nonfinite == "zero":
        return zero_nonfinite(t, xp=xp)
    if has_nonfinite(t, xp=xp):
        raise NonFiniteError(f"tensor {label} holds NaN/Inf values (nonfinite='error')", [label])
    return t


def scale_tensor(t: Any, scale: Any, xp: ModuleType, *, out: Any = None) -> Any:
    """fl(t · fl(scale)): the scale (computed in float64, a scalar or an array) is rounded to t's dtype and
    multiplied in that dtype, as TensorFlow does (one pass, no float64 copy of t); float16, bfloat16 and
    other narrow floats are multiplied in float32 and rounded once. Elementwise, so scaling a tensor chunk
    by chunk gives the same bits as scaling it whole. ``out`` (NumPy only) receives the result, which
    saves an allocation per chunk when streaming."""
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):  # inf·0 -> NaN is TF's result
        if t.dtype == xp.float64 or (t.dtype == xp.float32 and not _subnormal_in_float32(scale, xp)):
            s = xp.asarray(scale, dtype=t.dtype)
            return t * s if out is None else np.multiply(t, s, out=out)
        if t.dtype == xp.float32:  # a scale below float32's normal range would lose its digits: float64
            return xp.astype(xp.astype(t, xp.float64) * scale, t.dtype)
        wide = xp.astype(t, xp.float32) * xp.asarray(scale, dtype=xp.float32)
        return xp.astype(wide, t.dtype)


def _subnormal_in_float32(scale: Any, xp: ModuleType) -> bool:
    tiny = 1.1754943508222875e-38
    if isinstance(scale, float):
        return 0.0 < abs(scale) < tiny
    return bool(xp.any((xp.abs(scale) > 0) & (xp.abs(scale) < tiny)))


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, d) for s, d in zip(reversed(shape), reversed(target)))


# ------------------------------------------------------------------------------------------------- ops
def round_to_odd_float32(x: Any) -> np.ndarray:
    """float64 ``x`` rounded to float32 "to odd": toward zero, the last significand bit then set if that
    lost anything (finite ``x``; ±inf and NaN as they are). Rounding the result again to nearest-even in
    any binary format at least two bits narrower (bfloat16's 8, float16's 11, float8's) gives ``x``
    rounded there once (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved
    algorithms using rounding to odd", 2008): float32 shares bfloat16's exponent range, and its
    subnormals are 2^-149 apart, 16 bits finer than bfloat16's. Returns a float32 array of x's shape."""
    shape = np.shape(x)
    x = np.array(x, dtype=np.float64, ndmin=1)  # (1-D at least, so that the bits below are a view)
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
        wide = f.astype(np.float64)
    inexact = np.isfinite(x) & (wide != x)
    bits = f.view(np.uint32)
    bits -= (inexact & (np.abs(wide) > np.abs(x))).astype(np.uint32)  # (one step toward zero in
    bits |= inexact.astype(np.uint32)  # sign-magnitude: inf -> float32's largest, 1 -> 0.99999994)
    return f.reshape(shape)


def bfloat16_bits_of(x: float) -> int:
    """The bits (uint16) of float64 ``x`` rounded once to bfloat16, to nearest with ties to even, past
    bfloat16's largest finite value (3.3895e38) to ±inf, as IEEE 754 rounds: ``b = bits(round_to_odd_float32
    (x))``, ``(b + 0x7fff + (b >> 16 & 1)) >> 16`` (no ml_dtypes). Not for NaN."""
    b = int(round_to_odd_float32(x).view(np.uint32))
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16


def bound_in_dtype(bound: Any, dtype: Any, xp: ModuleType) -> Any:
    """A clip bound (float64 scalar or array) rounded once to a tensor's floating ``dtype``, to nearest
    with ties to even (±inf past its range, without NumPy's overflow warning). NumPy rounds float64 to
    float16 and float32 once; ml_dtypes 0.7 rounds to bfloat16 once too, but its earlier releases go
    through float32 first, so a bound within 2^-24 of a midpoint of two bfloat16 values rounded the
    other way: narrow NumPy dtypes go by :func:`round_to_odd_float32` first, which gives the single
    rounding from every release (and for float8's)."""
    with np.errstate(over="ignore"):
        if is_numpy_namespace(xp) and dtype.itemsize < 4:
            return np.asarray(round_to_odd_float32(bound).astype(dtype))
        return xp.astype(xp.asarray(bound), dtype)


def clip_by_value(t: Any, clip_value_min: Any, clip_value_max: Any, *, nonfinite: str = "error",
                  xp: ModuleType | None = None) -> Any:
    """TF ``clip_by_value``: min(max(t, lo), hi), element-wise.

    Bounds are scalars or arrays that broadcast to t's shape (they never grow t). NaN elements stay NaN
    under "propagate" (as in TF); ±inf are clipped. Unclipped elements are bit-identical; a tensor with
    nothing to clip is returned as is. Non-float tensors are returned untouched.
    Raises UsageError for NaN bounds or clip_value_min > clip_value_max.
    """
    xp = namespace_of(t, xp=xp)
    check_nonfinite_policy(nonfinite)
    t = asarray(t, xp)
    if not is_floating(t):
        return t
    if type(clip_value_min) is float and type(clip_value_max) is float:  # the usual bounds: checked as
        # Python floats (the array checks below cost ~20 us a call: 20,000 small tensors, 0.4 s)
        if math.isnan(clip_value_min) or math.isnan(clip_value_max):
            raise UsageError("clip_value_min and clip_value_max must not be NaN")
        if clip_value_min > clip_value_max:
            raise UsageError("clip_value_min must be <= clip_value_max; swap them or fix the bounds")
        lo, hi = xp.asarray(clip_value_min), xp.asarray(clip_value_max)
    else:
        lo = asarray(clip_value_min, xp)
        hi = asarray(clip_value_max, xp)
        if bool(xp.any(xp.isnan(xp.astype(lo, xp.float64)))) or \
                bool(xp.any(xp.isnan(xp.astype(hi, xp.float64)))):
            raise UsageError("clip_value_min and clip_value_max must not be NaN")
        if bool(xp.any(xp.astype(lo, xp.float64) > xp.astype(hi, xp.float64))):
            raise UsageError("clip_value_min must be <= clip_value_max; swap them or fix the bounds")
        for bound in (lo, hi):
            if not _broadcasts_to(tuple(bound.shape), tuple(t.shape)):
                raise UsageError(f"a clip bound of shape {tuple(bound.shape)} does not broadcast to the "
                                 f"tensor's shape {tuple(t.shape)} (bounds never grow a tensor)")
    t = _apply_policy(t, nonfinite, xp)
    lo_t = bound_in_dtype(lo, t.dtype, xp)
    hi_t = bound_in_dtype(hi, t.dtype, xp)
    too_high = t > hi_t
    too_low = t < lo_t
    if not bool(xp.any(too_high | too_low)):
        return t
    out = xp.where(too_high, xp.broadcast_to(hi_t, t.shape), t)
    return xp.where(too_low, xp.broadcast_to(lo_t, t.shape), out)


def clip_by_norm(t: Any, clip_norm: Any, axes: int | Sequence[int] | None = None, *,
                 nonfinite: str = "error", xp: ModuleType | None = None) -> Any:
    """TF ``clip_by_norm``: t · c / max(‖t‖₂, c), the L2 norm taken over ``axes`` (keepdims).

    ``axes=None`` uses the whole tensor; negative axes are allowed; a zero slice keeps norm 0 and is left
    alone. Slices with ‖t‖ ≤ c are bit-identical; clipped slices get fl(t · (c/‖t‖)) with c/‖t‖ in float64.
    Under "propagate", a non-finite norm gives TF's result: finite elements → ±0, ±inf → NaN, NaN → NaN.
    """
    xp = namespace_of(t, xp=xp)
    c = check_clip_norm(clip_norm)
    check_nonfinite_policy(nonfinite)
    t = asarray(t, xp)
    if not is_floating(t):
        return t
    ax = normalize_axes(axes, t.ndim)
    if math.prod(t.shape) == 0:
        return t
    t = _apply_policy(t, nonfinite, xp)
    if axes is None or len(ax) == t.ndim:
        n = tensor_norm(t, 2, xp=xp)
        if n <= c:  # False for NaN
            return t
        return scale_tensor(t, c / n, xp)
    clipped, scale = slice_clip_scales(slice_l2_norms(t, ax, xp), c, xp)
    if not bool(xp.any(clipped)):
        return t
    scaled = scale_tensor(t, scale, xp)
    return xp.where(xp.broadcast_to(clipped, t.shape), scaled, t)


def scale_slices(t: Any, clipped: Any, scale: Any, xp: ModuleType) -> Any:
    """The rows of ``t`` (slices × elements) as :func:`clip_by_norm` over axes leaves them: row i
    multiplied by ``scale[i]`` (:func:`scale_tensor`) where ``clipped[i]``, as it was elsewhere."""
    return xp.where(clipped[:, None], scale_tensor(t, scale[:, None], xp), t)


def slice_clip_scales(norms: Any, clip_norm: float, xp: ModuleType) -> tuple[Any, Any]:
    """What :func:`clip_by_norm` over axes does to each slice, from the slices' L2 norms ‖tᵢ‖:
    (clipped = not ‖tᵢ‖ ≤ c, so a NaN norm counts as clipped: TF's formula makes the slice NaN;
    scale = c / ‖tᵢ‖ where clipped, 1 elsewhere), both in the norms' shape and dtype (float64)."""
    clipped = ~(norms <= clip_norm)
    safe = xp.where(clipped, norms, xp.full_like(norms, clip_norm))
    return clipped, xp.where(clipped, clip_norm / safe, xp.ones_like(norms))


def clip_by_average_norm(t: Any, clip_norm: Any, *, nonfinite: str = "error", xp: ModuleType | None = None) -> Any:
    """TF ``clip_by_average_norm``: clips when ‖t‖₂ / size(t) > c, to exactly that.

    Equivalent to ``clip_by_norm(t, c · size(t))``. Note: "average norm" is the L2 norm divided by the
    element count, not the RMS ‖t‖/√size (Optax's ``clip_by_block_rms``). Empty tensors are unchanged.
    """
    c = check_clip_norm(clip_norm)
    size = math.prod(t.shape) if hasattr(t, "shape") else 1
    if size == 0:
        return t
    return clip_by_norm(t, c * size, nonfinite=nonfinite, xp=xp)


def global_clip_scale(norm: float, clip_norm: float) -> float:
    """The factor TF's ``clip_by_global_norm`` applies: c · min(1/n, 1/c) = c / max(n, c) (1.0 when n ≤ c).

    NaN when n is NaN or inf (TF then makes every element NaN).
    """
    if math.isnan(norm) or math.isinf(norm):
        return math.nan
    if norm <= clip_norm:
        return 1.0
    return clip_norm / norm


def clip_by_global_norm(t_list: Sequence[Any], clip_norm: Any, use_norm: Any = None, nonfinite: str = "error", *,
                        norm_type: float | int | str = 2, xp: ModuleType | None = None) -> tuple[list[Any], float]:
    """TF ``clip_by_global_norm``: every tensor × c / max(n, c), n = the global norm (or ``use_norm``).

    Returns ``(clipped_list, n)``. ``None`` entries stay ``None``; non-float tensors pass through and do
    not count towards n. When n ≤ c every tensor is returned unchanged (bit-identical). ``norm_type`` 1, 2
    or inf chooses PyTorch's total-norm definition (TF: 2 only). With nonfinite="propagate" and a
    non-finite n, every element of every float tensor becomes NaN, as in TF.
    """
    c = check_clip_norm(clip_norm)
    check_nonfinite_policy(nonfinite)
    p = parse_norm_type(norm_type)
    if use_norm is not None:
        try:
            use_norm = float(use_norm)
        except (TypeError, ValueError):
            raise UsageError(f"use_norm must be a number, not {use_norm!r}") from None
        if use_norm < 0:
            raise UsageError(f"use_norm must be >= 0, got {use_norm!r}")
    items = list(t_list)
    work: list[Any] = []
    for i, t in enumerate(items):
        if t is None:
            work.append(None)
            continue
        txp = namespace_of(t, xp=xp)
        t = asarray(t, txp)
        if is_floating(t):
            t = _apply_policy(t, nonfinite, txp, label=i)
        work.append(t)
    if use_norm is None:
        n = combine_norms((tensor_norm(t, p, xp=xp) for t in work if t is not None and is_floating(t)), p)
    else:
        n = use_norm
    if nonfinite == "error" and not math.isfinite(n):
        raise NonFiniteError(f"use_norm is {n!r} (nonfinite='error')", [])
    scale = global_clip_scale(n, c)
    if scale == 1.0:
        return work, n
    out: list[Any] = []
    for t in work:
        if t is None or not is_floating(t):
            out.append(t)
        else:
            out.append(scale_tensor(t, scale, namespace_of(t, xp=xp)))
    return out, n
