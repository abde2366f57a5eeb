"""``clip --nonfinite zero``: NaN and ±inf set to 0 before anything else. Pass 1 finds the tensors that hold
any (clip_dump._zeroed_norms); the others are left as they are by zeroing, so they take the paths of finite
tensors (runs, in place, copies), and those that hold some are zeroed in place before they are scaled or
clipped (clip_dump._zeroed_in_place), or in a copy where their bytes are not at a file offset. Whatever the
path, the result must be that of clipping the zeroed dump."""

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool import open_dump, save_dump
from gradtool.core import clipping
from gradtool.core.stats import STREAM_CHUNK
from tests.reference import ref_l2

_DTYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "bf16": ml_dtypes.bfloat16}
_KINDS = ["plain", "plain", "plain", "nan", "inf", "all_nan", "zeros"]
_tensor = st.tuples(st.sampled_from(list(_DTYPES)),
                    st.one_of(st.integers(0, 300), st.integers(0, 300), st.sampled_from([STREAM_CHUNK + 9])),
                    st.sampled_from(_KINDS), st.booleans())
_SPECS = [("global-norm", 1e-2, None, None, 2), ("global-norm", 1e30, None, None, 2),
          ("global-norm", 1e-2, None, None, math.inf), ("global-norm", 1e-2, None, None, 1),
          ("norm", 0.5, None, None, 2), ("average-norm", 1e-3, None, None, 2), ("value", 0.5, None, None, 2),
          ("value", 0.5, 0.25, None, 2), ("norm", 0.5, None, (-1,), 2), ("norm", 0.5, None, (0,), 2)]


def _arrays(tensors, seed):
    rng = np.random.default_rng(seed)
    arrays = {}
    for k, (dtype, size, kind, wide) in enumerate(tensors):
        shape = (size // 3, 3) if wide and size >= 6 else (size,)
        a = (rng.standard_normal(math.prod(shape)) * 2).astype(np.float32).astype(_DTYPES[dtype]).reshape(shape)
        flat = a.reshape(-1)
        if kind == "zeros":
            flat[:] = 0
        elif flat.size and kind == "all_nan":
            flat[:] = np.nan
        elif flat.size and kind in ("nan", "inf"):
            at = rng.integers(0, flat.size, 1 + flat.size // 1000)
            flat[at] = np.nan if kind == "nan" else -np.inf
            flat[rng.integers(0, flat.size)] = np.inf
        arrays[f"t{k}"] = a
    return arrays


def _zeroed(a):
    return np.where(np.isfinite(a.astype(np.float64)), a, np.zeros_like(a))


def _clipped(src, out, spec, fmt):
    from gradtool.clip_dump import clip_dump
    from gradtool.io.dump import make_writer

    with open_dump(src) as r, make_writer(out, fmt, r.metadata) as w:
        rep = clip_dump(r, w, spec)
    with open_dump(out) as r:
        return rep, {n: r.read(n) for n in r.names}


@settings(max_examples=60, deadline=None)
@given(st.lists(_tensor, min_size=1, max_size=8), st.sampled_from(["safetensors", "npz", "h5", "npz-deflated"]),
       st.sampled_from(range(len(_SPECS))), st.booleans(), st.integers(0, 2**16))
@example([("bf16", STREAM_CHUNK + 9, "nan", False), ("f32", 200, "plain", False), ("f16", 7, "inf", False)],
         "safetensors", 0, True, 1)
@example([("f32", STREAM_CHUNK + 9, "inf", True), ("f64", STREAM_CHUNK + 9, "nan", False)], "npz", 7, True, 2)
@example([("f16", STREAM_CHUNK + 9, "plain", False), ("f32", 50, "nan", False), ("f32", 60, "plain", False)],
         "safetensors", 2, True, 3)
def test_clip_under_zero_is_the_clip_of_the_zeroed_dump(tmp_path_factory, tensors, fmt, which, two_cores, seed):
    """Output bytes, norms before and after (to the bit) and scale of ``clip --nonfinite zero`` are those of
    clipping the dump with its NaN and ±inf zeroed beforehand (by NumPy, here) under the "error" policy;
    the changed elements are those whose value differs from the input (NaN -> 0 counts), counted here;
    the norms before are the float64 reference's of the zeroed tensors. For every mode, float32, float16,
    float64 and bfloat16 tensors of one chunk or more, in runs or alone, on two cores (pass 1 in pieces)
    or one, read at a file offset or inflated; the global norm as L2, L1 and max."""
    from gradtool import summarize
    from gradtool.clip_dump import ClipSpec

    mode, max_, min_, axes, norm_type = _SPECS[which]
    arrays = _arrays(tensors, seed)
    deflated = fmt == "npz-deflated"
    ext = "npz" if deflated else fmt
    if ext != "safetensors":
        arrays = {n: a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a for n, a in arrays.items()}
    if axes is not None:
        arrays = {n: a for n, a in arrays.items() if a.size}  # (an empty tensor has no slices to clip)
        if not arrays:
            return
    d = tmp_path_factory.mktemp("zero")
    src, zeroed_src = str(d / f"in.{ext}"), str(d / f"zeroed.{ext}")
    save_dump(src, arrays, compress=deflated)
    save_dump(zeroed_src, {n: _zeroed(a) for n, a in arrays.items()}, compress=deflated)
    writer_fmt = "hdf5" if ext == "h5" else ext
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(summarize, "PARALLEL_MIN_BYTES", 0 if two_cores else 1 << 40)
        spec = ClipSpec(mode, max=max_, min=min_, axes=axes, norm_type=norm_type, nonfinite="zero")
        rep, got = _clipped(src, str(d / f"out.{ext}"), spec, writer_fmt)
        ref_rep, ref = _clipped(zeroed_src, str(d / f"ref.{ext}"), dataclasses.replace(spec, nonfinite="error"),
                                writer_fmt)
    assert rep.scale == ref_rep.scale and repr(rep.global_norm_before) == repr(ref_rep.global_norm_before)
    assert repr(rep.global_norm_after) == repr(ref_rep.global_norm_after)
    for t, r in zip(rep.tensors, ref_rep.tensors):
        a, out = arrays[t.name], got[t.name]
        assert out.tobytes() == ref[t.name].tobytes(), t.name
        assert (repr(t.norm_before), repr(t.norm_after)) == (repr(r.norm_before), repr(r.norm_after)), t.name
        before, after = a.astype(np.float64), out.astype(np.float64)
        assert t.clipped_elements == int(np.count_nonzero(before != after)), t.name  # (NaN != 0: counted)
        assert t.clipped == (t.clipped_elements > 0)
        z = np.abs(_zeroed(a).astype(np.float64)).reshape(-1)
        ref_norm = {2: ref_l2(z), 1: math.fsum(z.tolist()), math.inf: float(z.max(initial=0.0))}[norm_type]
        assert math.isclose(t.norm_before, ref_norm, rel_tol=1e-6, abs_tol=1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_zeroing_in_place_is_zero_nonfinite(dtype):
    """Every NaN (any sign) and ±inf set to +0.0, every other value (subnormals, -0.0) kept; the count."""
    a = np.array([1.0, np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -3.5, 6e4], np.float64).astype(dtype)
    want = clipping.zero_nonfinite(a)
    got = a.copy()
    assert clipping.zero_nonfinite_in_place(got) == 4
    assert got.tobytes() == want.tobytes() and np.signbit(got[5]) and not np.signbit(got[1])


def test_zeroing_bfloat16_bits_in_place_is_zero_nonfinite_on_every_value():
    """All 65,536 bfloat16 bit patterns: as bits, without ml_dtypes, the result of zero_nonfinite on the
    bfloat16 values (which NumPy takes through ml_dtypes), and the number of NaN and ±inf among them."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(ml_dtypes.bfloat16)
    want = clipping.zero_nonfinite(values)
    got = bits.copy()
    n = clipping.zero_nonfinite_in_place(got, bfloat16_bits=True)
    assert n == int(np.count_nonzero(~np.isfinite(values.astype(np.float32)))) == 256  # (2 x 128 mantissas)
    assert got.tobytes() == want.view(np.uint16).tobytes()
