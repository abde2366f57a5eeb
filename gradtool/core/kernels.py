"""The optional compiled chunk kernel (``_kernels.c``), or None.

``compiled_f32_summary(chunk) -> (min, max, Σx, Σx², #zeros)`` of a C-contiguous float32 chunk in one
pass, GIL released (see the C file for the exact arithmetic); ``compiled_f32_summaries(window, k)`` the
same for every k-element chunk of a window in one call (one GIL round trip per window);
``compiled_f32_summaries_fd(fd, offset, count, k)`` the same for float32 values read from a file with
``pread`` into a cache-resident buffer inside that call; ``compiled_f32_sumsq_each(arrays)`` Σx² of each
float32 array of a list, with no Python per array; ``compiled_f32_scale(src, scale, out) -> (Σout²,
#changed)`` writes out = src · float32(scale) and measures it in the same pass (clipping);
``compiled_half_summaries(window_u16, k, kind)`` is ``compiled_f32_summaries`` of float16 (kind
``HALF_F16``) or bfloat16 (``HALF_BF16``) values widened to float32 chunk by chunk inside the call (the
bits of summarising ``chunk.astype(float32)``); ``compiled_tensor_summaries_fd(fd, items, out)`` the
one-chunk summary of each of many small tensors (rows of ``items``: byte offset, element count, kind) in
one call, into the rows of ``out``; both take the CRC-32 of the bytes they read, continued from a seed,
when asked (``crc=seed``; ``crcs=`` a uint32 array of seeds), and ``compiled_crc32_combine(c1, c2, len2)``
joins the CRCs of consecutive pieces (zlib's ``crc32_combine``);
``compiled_half_scale(src_u16, scale, out_u16, kind) -> (Σout², #changed)`` is ``compiled_f32_scale`` for
float16/bfloat16 (multiplied in float32, rounded once, as ``clipping.scale_tensor`` does), and
``compiled_half_scale_slices(src_u16, scales_f32, out_u16, kind, by_row) -> #changed`` the same with a
scale per column of rows of ``len(scales)`` elements, or per row (``by_row``) of ``len(src) / len(scales)``
(negative: the slice kept, bits and all), ``compiled_f32_scale_slices(src, scales, out, by_row)`` the
same for float32 values (float32 products); ``compiled_column_sumsq(src, acc, kind)`` adds each column's
squares, row after row, in float64 into ``acc`` (float32 rows, kind -1, or float16/bfloat16 ones as
uint16: NumPy's sum over the leading axis, the same bits); ``compiled_clip_values(src, lo, hi, out, kind) -> (#changed,
#non-finite)`` ``clipping.clip_by_value`` of float32 (kind -1), float64 (kind -2) or float16/bfloat16
values in one pass; ``compiled_f64_summary(chunk) -> (max |x|, Σx²)`` of float64 values in a fixed order
(max |x| NaN when one is NaN), and ``compiled_f64_scale(src, scale, out) -> (max |out|, Σout², #changed)``
out = src · scale in float64, measured with ``compiled_f64_summary(out)``'s bits. Each is None when the
extension was not built (no C compiler at install time) or when ``GRADTOOL_NO_KERNELS=1``; the callers in
:mod:`.norms`, :mod:`.stats` and :mod:`gradtool.clip_dump` then use NumPy passes. They look it up here at
call time, so tests can switch it off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..kernel_switch import kernels_turned_off

compiled_f32_summary: Callable[[Any], tuple[float, float, float, float, int]] | None
compiled_f32_summaries: Callable[[Any, int], list[tuple[float, float, float, float, int]]] | None
compiled_f32_summaries_fd: Callable[[int, int, int, int], list[tuple[float, float, float, float, int]]] | None
try:
    from ._kernels import f32_summaries as compiled_f32_summaries
    from ._kernels import f32_summary as compiled_f32_summary
except ImportError:  # built without a C compiler
    compiled_f32_summary = compiled_f32_summaries = None
compiled_f32_sumsq_each: Callable[[Any], list[float]] | None
try:
    from ._kernels import f32_sumsq_each as compiled_f32_sumsq_each
except ImportError:
    compiled_f32_sumsq_each = None
compiled_f32_scale: Callable[[Any, float, Any], tuple[float, int]] | None
try:
    from ._kernels import f32_scale as compiled_f32_scale
except ImportError:
    compiled_f32_scale = None
compiled_half_summaries: Callable[[Any, int, int], list[tuple[float, float, float, float, int]]] | None
compiled_half_scale: Callable[[Any, float, Any, int], tuple[float, int]] | None
compiled_half_scale_slices: Callable[[Any, Any, Any, int, bool], int] | None
compiled_clip_values: Callable[[Any, Any, Any, Any, int], tuple[int, int]] | None
try:
    from ._kernels import half_scale as compiled_half_scale
    from ._kernels import clip_values as compiled_clip_values
    from ._kernels import half_scale_slices as compiled_half_scale_slices
    from ._kernels import half_summaries as compiled_half_summaries
except ImportError:
    compiled_half_summaries = compiled_half_scale = compiled_half_scale_slices = compiled_clip_values = None
compiled_column_sumsq: Callable[[Any, Any, int], None] | None
compiled_f32_scale_slices: Callable[[Any, Any, Any, bool], int] | None
try:
    from ._kernels import column_sumsq as compiled_column_sumsq
    from ._kernels import f32_scale_slices as compiled_f32_scale_slices
except ImportError:
    compiled_column_sumsq = compiled_f32_scale_slices = None
compiled_f64_summary: Callable[[Any], tuple[float, float]] | None
compiled_f64_scale: Callable[[Any, float, Any], tuple[float, float, int]] | None
try:
    from ._kernels import f64_scale as compiled_f64_scale
    from ._kernels import f64_summary as compiled_f64_summary
except ImportError:
    compiled_f64_summary = compiled_f64_scale = None
HALF_F16, HALF_BF16 = 0, 1  # the kernels' ``kind`` argument
compiled_tensor_summaries_fd: Callable[[int, Any, Any], int] | None
try:  # not on Windows (no pread)
    from ._kernels import f32_summaries_fd as compiled_f32_summaries_fd
except ImportError:
    compiled_f32_summaries_fd = None
try:
    from ._kernels import tensor_summaries_fd as compiled_tensor_summaries_fd
except ImportError:
    compiled_tensor_summaries_fd = None
compiled_crc32_combine: Callable[[int, int, int], int] | None
try:  # (with it, the two _fd functions take a crc argument: a build older than both has neither)
    from ._kernels import crc32_combine as compiled_crc32_combine
except ImportError:
    compiled_crc32_combine = None
COMPILED = ("compiled_f32_summary", "compiled_f32_summaries", "compiled_f32_summaries_fd",
            "compiled_f32_sumsq_each", "compiled_f32_scale", "compiled_half_summaries", "compiled_half_scale",
            "compiled_half_scale_slices", "compiled_clip_values", "compiled_f64_summary", "compiled_f64_scale",
            "compiled_tensor_summaries_fd", "compiled_crc32_combine", "compiled_column_sumsq",
            "compiled_f32_scale_slices")  # every entry point above, None without the kernel
if kernels_turned_off():
    globals().update(dict.fromkeys(COMPILED))

BUILT = compiled_f32_summary is not None


@contextmanager
def disabled() -> Iterator[None]:
    """Within the block, the NumPy paths run as if the extension were not built (tests, benchmarks)."""
    saved = {name: globals()[name] for name in COMPILED}
    globals().update(dict.fromkeys(COMPILED))
    try:
        yield
    finally:
        globals().update(saved)


def half_kind(dtype: Any) -> int | None:
    """The compiled kernels' ``kind`` for native float16 (``HALF_F16``) and bfloat16 (``HALF_BF16``) NumPy
    dtypes; None for every other dtype (a big-endian float16 among them)."""
    if dtype == _F16:
        return HALF_F16
    if getattr(dtype, "name", None) == "bfloat16" and dtype.itemsize == 2 and dtype.byteorder in "=|":
        return HALF_BF16
    return None


def kernel_kind(dtype: Any) -> int | None:
    """The ``kind`` the kernels' readers take for a NumPy dtype: -1 for native float32, ``half_kind`` for
    float16 and bfloat16; None for a dtype they do not read."""
    return -1 if dtype == _F32 else half_kind(dtype)


_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
