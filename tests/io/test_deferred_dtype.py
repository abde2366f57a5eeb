"""safetensors' BF16 and F8 tensors are indexed with a DeferredDtype: ml_dtypes (~0.5 s to import in
0.7) is imported only when a NumPy array of the type is made, and the deferred dtype answers as NumPy's."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.io import safetensors
from gradtool.io.base import DeferredDtype
from gradtool.io.safetensors import ML_DTYPES, ML_ITEMSIZES

CODES = sorted(ML_DTYPES)


def _deferred(code: str) -> tuple[DeferredDtype, np.dtype]:
    name = ML_DTYPES[code]
    return DeferredDtype(name, ML_ITEMSIZES[code]), np.dtype(getattr(ml_dtypes, name))


@pytest.mark.parametrize("code", CODES)
def test_what_it_answers_without_ml_dtypes_is_what_the_dtype_answers(code):
    d, real = _deferred(code)
    for attribute in ("name", "itemsize", "byteorder", "isnative", "hasobject"):
        assert getattr(d, attribute) == getattr(real, attribute), attribute
    assert d._dtype is None  # none of them imported ml_dtypes (made NumPy's dtype)
    assert str(d) == str(real) and repr(d) == repr(real)
    assert d._dtype is None
    assert d.alignment == real.alignment and d.str == real.str and d.kind == real.kind  # others: NumPy's
    assert d._dtype is real


@pytest.mark.parametrize("copied", [copy.copy, copy.deepcopy, lambda d: pickle.loads(pickle.dumps(d))])
def test_copies_stay_deferred(copied):
    d = DeferredDtype("bfloat16", 2)
    c = copied(d)
    assert type(c) is DeferredDtype and (c.name, c.itemsize, c._dtype) == ("bfloat16", 2, None) and c == d
    with pytest.raises(AttributeError):
        DeferredDtype.__new__(DeferredDtype).name  # (a slot not yet set: no recursion into the dtype)


@pytest.mark.parametrize("code", CODES)
def test_numpy_takes_it_as_the_dtype(code):
    d, real = _deferred(code)
    raw = bytes(range(256)) * 4
    assert np.dtype(d) is real
    a = np.frombuffer(raw, d)
    assert a.dtype == real and a.tobytes() == raw
    assert np.frombuffer(raw, np.uint8).view(d).dtype == real
    assert np.array_equal(np.zeros(3, d).view(np.uint8), np.zeros(3 * real.itemsize, np.uint8))


@pytest.mark.parametrize("code", CODES)
def test_equality_and_hash_are_the_dtypes(code):
    d, real = _deferred(code)
    assert d == real and real == d and not d != real
    assert d == DeferredDtype(real.name, real.itemsize) and hash(d) == hash(real)
    assert {real: 1}[d] == 1 and {d: 1}[real] == 1
    assert d == getattr(ml_dtypes, real.name) and d == real.name
    for other in (np.float32, np.dtype(np.float16), "f8", np.uint16, np.uint8, np.int8, None, 3, "nonsense"):
        assert (d == other) is False and d != other
    for other_code in CODES:
        if other_code != code:
            assert d != _deferred(other_code)[0] and d != _deferred(other_code)[1]


def test_other_dtypes_are_numpys_and_ml_dtypes_are_once_imported():
    assert safetensors.dtype_of("F32") is np.dtype("<f4")
    assert safetensors.dtype_of("XX") is None
    for code in CODES:  # (this process imported ml_dtypes: the dtypes are NumPy's)
        assert safetensors.dtype_of(code) is np.dtype(getattr(ml_dtypes, ML_DTYPES[code]))
        assert safetensors.code_of(_deferred(code)[0]) == code == safetensors.code_of(_deferred(code)[1])


_PROBE = """
import io, json, sys, contextlib
if sys.argv[1] in ("import", "i"):
    import ml_dtypes
from gradtool.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(sys.argv[2:])
    except SystemExit as e:
        assert e.code in (0, None), e.code
sys.__stdout__.write(json.dumps({"out": out.getvalue(), "ml_dtypes": "ml_dtypes" in sys.modules}))
"""


def _run(args: list[str], first: str, cwd: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    r = subprocess.run([sys.executable, "-c", _PROBE, first, *args], cwd=cwd, capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_stats_of_bfloat16_and_float8_read_by_the_kernel_does_not_import_ml_dtypes(tmp_path):
    """``gradtool stats`` of a dump of bfloat16 (and float8) tensors, read by the compiled kernel (their
    bits), gives what it gives with ml_dtypes imported first (NumPy's dtypes), without importing it."""
    from gradtool import save_dump
    from gradtool.core import kernels

    rng = np.random.default_rng(0)
    tensors = {"w": rng.standard_normal((300, 70)).astype(ml_dtypes.bfloat16),
               "b": rng.standard_normal(5000).astype(ml_dtypes.bfloat16),
               "nan": np.array([1.0, np.nan, -np.inf, 2.0], np.float32).astype(ml_dtypes.bfloat16),
               "f8a": rng.standard_normal(100).astype(ml_dtypes.float8_e4m3fn),
               "f8b": rng.standard_normal(100).astype(ml_dtypes.float8_e5m2),
               "f32": rng.standard_normal(100).astype(np.float32), "empty": np.zeros(0, ml_dtypes.bfloat16)}
    path = str(tmp_path / "d.safetensors")
    save_dump(path, tensors)
    for args in (["stats", path, "--format", "json"], ["stats", path], ["stats", path, "--format", "csv"]):
        deferred, real = _run(args, "-", str(tmp_path)), _run(args, "import", str(tmp_path))
        assert deferred["out"] == real["out"] and real["ml_dtypes"]
        if args[-1] == "json":
            got = {t["name"]: t for t in json.loads(deferred["out"])["dumps"][0]["tensors"]}
            assert got["w"]["dtype"] == "bfloat16" and got["f8b"]["dtype"] == "float8_e5m2"
    # float8 has no kernel of its own, and a chunk with NaN or inf is read again by NumPy: their values
    # are ml_dtypes' (imported for them); finite bfloat16 tensors the kernel reads alone, chunks it
    # cannot sum in float32 (zeros, subnormals) read again as their float32 values, a tensor of several
    # chunks in a dump too small for two threads by one kernel call
    only_bf16 = str(tmp_path / "bf16.safetensors")
    tiny = (rng.integers(0, 1 << 16, 3000, dtype=np.uint32).astype(np.uint16) & np.uint16(0x80FF))
    save_dump(only_bf16, {**{k: tensors[k] for k in ("w", "b", "empty")},
                          "big": rng.standard_normal(300_000).astype(ml_dtypes.bfloat16),
                          "zeros": np.zeros(5000, ml_dtypes.bfloat16), "tiny": tiny.view(ml_dtypes.bfloat16),
                          "constant": np.full(7000, 3.0, ml_dtypes.bfloat16)})
    stats, real = (_run(["stats", only_bf16, "--format", "json"], first, str(tmp_path)) for first in "-i")
    assert stats["ml_dtypes"] is (not kernels.BUILT or bool(os.environ.get("GRADTOOL_NO_KERNELS")))
    assert stats["out"] == real["out"]
    assert json.loads(stats["out"])["dumps"][0]["tensors"][0]["dtype"] == "bfloat16"



@pytest.mark.parametrize("mode, deferred", [
    (["--mode", "global-norm", "--max", "1"], True), (["--mode", "global-norm", "--max", "1e9"], True),
    (["--mode", "norm", "--max", "0.5"], True), (["--mode", "average-norm", "--max", "1e-3"], True),
    (["--mode", "value", "--max", "0.5", "--nonfinite", "propagate"], True),
    (["--mode", "value", "--max", "1.00390625000000009", "--min", "-1e-3"], True),  # (bounds by bits)
    (["--mode", "value", "--max", "1e30"], True),
    (["--mode", "global-norm", "--max", "1", "--nonfinite", "zero"], True),  # (NaN zeroed as bits)
    (["--mode", "norm", "--max", "0.5", "--nonfinite", "zero"], True),
    (["--mode", "value", "--max", "0.5", "--min", "0.25", "--nonfinite", "zero"], True),  # (zero moves)
    (["--mode", "norm", "--max", "0.5", "--axes", "-1"], True),  # (by slices, as bits)
    (["--mode", "norm", "--max", "0.5", "--axes", "0"], True),
    (["--mode", "norm", "--max", "0.5", "--axes", "-1", "--nonfinite", "propagate"], True),
    (["--mode", "norm", "--max", "0.5", "--axes", "0", "--nonfinite", "propagate"], True)])
def test_clip_of_bfloat16_scaled_by_the_kernel_does_not_import_ml_dtypes(tmp_path, mode, deferred):
    """``clip`` by a norm or by value of bfloat16 tensors the compiled kernel scales or clips takes their
    chunks as their bits (uint16): the same output bytes and report as with ml_dtypes imported first,
    without importing it, for tensors of several chunks (changed on the worker thread), small ones back to
    back (clipped in runs), zeros and subnormal values (measured by their float32 values:
    clip_dump._update_sum_sq), bounds next to a midpoint of two bfloat16 values and past their range. The
    writer's header comes from the deferred dtype's name. Under "zero", a tensor holding NaN and ±inf has
    them zeroed as bits too (in place, before it is scaled or clipped), with the same results."""
    from gradtool import save_dump
    from gradtool.core import kernels

    rng = np.random.default_rng(1)
    tiny = (rng.integers(0, 1 << 16, 3000, dtype=np.uint32).astype(np.uint16) & np.uint16(0x80FF))
    tensors = {"big": rng.standard_normal(300_000).astype(ml_dtypes.bfloat16),
               "w": (rng.standard_normal((300, 70)) * 1e-3).astype(ml_dtypes.bfloat16),
               **{f"s{i}": rng.standard_normal(100 + 300 * i).astype(ml_dtypes.bfloat16) for i in range(10)},
               "zeros": np.zeros(5000, ml_dtypes.bfloat16), "tiny": tiny.view(ml_dtypes.bfloat16),
               "negative_zeros": np.full(70_000, -0.0, np.float32).astype(ml_dtypes.bfloat16),
               "f32": np.ones(10, np.float32)}
    if "--axes" in mode:  # slices across the 2^18-element chunks: rows of 300,000, blocks of 131,072 rows
        tensors["rows"] = (rng.standard_normal((3, 300_000)) * 1e-3).astype(ml_dtypes.bfloat16)
        tensors["columns"] = (rng.standard_normal((150_001, 2)) * [1e-3, 1]).astype(ml_dtypes.bfloat16)
    if "--axes" in mode and "--nonfinite" in mode:  # a NaN row and an infinite column, in their last chunks
        tensors["rows"][1, 299_999], tensors["columns"][150_000, 1] = np.nan, np.inf
    if "--nonfinite" in mode:
        tensors["nan"] = np.array([1.0, np.nan, -np.inf, 2.0], np.float32).astype(ml_dtypes.bfloat16)
    path = str(tmp_path / "d.safetensors")
    save_dump(path, tensors)
    out = str(tmp_path / "out.safetensors")
    got = []
    for first in ("-", "import"):
        run = _run(["clip", path, "-o", out, *mode, "--format", "json"], first, str(tmp_path))
        with open(out, "rb") as f:
            got.append((f.read(), run["out"]))
        os.remove(out)
        if first == "-" and kernels.BUILT and not os.environ.get("GRADTOOL_NO_KERNELS"):
            assert run["ml_dtypes"] is not deferred
    assert got[0] == got[1]
    report = json.loads(got[0][1])
    assert len(report["dumps"][0]["tensors"]) == len(tensors)


_SPECIAL = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x7F7F]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5000), st.integers(0, 2**32 - 1), st.lists(st.sampled_from(_SPECIAL), max_size=8),
       st.sampled_from(["random", "tiny", "zeros"]), st.booleans())
@example(4096, 0, [], "zeros", True)
@example(3, 1, [0x0001], "tiny", True)
def test_a_norm_of_bfloat16_bits_widened_to_float32_is_the_norm_of_the_bfloat16_values(n, seed, special, kind,
                                                                                      kernel):
    """clip measures a bfloat16 chunk it took as its bits (ml_dtypes unimported) by its float32 values
    where the kernel's sum does not do (zeros, subnormals, NaN, ±inf: clip_dump._update_sum_sq), or by
    NormAccumulator.update_bfloat16_bits: the same norm, maximum and NaN/inf flags as the bfloat16
    chunk's own, with the kernel and without it."""
    import contextlib

    from gradtool.core.norms import bfloat16_bits_as_float32
    from gradtool.core import kernels
    from gradtool.core.norms import NormAccumulator

    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    if n:
        bits[rng.integers(0, n, len(special))] = np.array(special, np.uint16)
    if kind == "tiny":  # subnormal and the smallest normal values: squares under float32's range
        bits &= np.uint16(0x80FF)
    elif kind == "zeros":
        bits &= np.uint16(0x8000)
    values = bfloat16_bits_as_float32(bits)
    assert np.array_equal(values, bits.view(ml_dtypes.bfloat16).astype(np.float32), equal_nan=True)
    assert np.array_equal(values.view(np.uint32) >> 16, bits)  # (NaN payloads kept)
    if kernel and not kernels.BUILT:
        pytest.skip("compiled kernel not built")
    with contextlib.nullcontext() if kernel else kernels.disabled():
        for p in (2.0, 1.0, "inf"):
            a, b, c = NormAccumulator(p), NormAccumulator(p), NormAccumulator(p)
            a.update(bits.view(ml_dtypes.bfloat16))
            b.update(values)
            c.update_bfloat16_bits(bits)  # (the kernel's sums of the bits, else b's)
            ra, rb, rc = a.result(), b.result(), c.result()
            for r, acc in ((rb, b), (rc, c)):
                assert ra == r or (ra != ra and r != r)
                assert (a.amax, a.nan, a.inf) == (acc.amax, acc.nan, acc.inf)


def test_a_sharded_step_of_bfloat16_pieces_does_not_import_ml_dtypes(tmp_path):
    """The pieces of a sharded step (one safetensors file a rank) are checked for one dtype by comparing
    them, not hashing them (a DeferredDtype's hash is NumPy's dtype's): ``stats`` and ``clip`` of the
    step give what they give with ml_dtypes imported, without importing it."""
    from gradtool import save_dump
    from gradtool.core import kernels

    rng = np.random.default_rng(2)
    tensors = {"emb": rng.standard_normal(400_000).astype(ml_dtypes.bfloat16),
               "b": rng.standard_normal(3000).astype(ml_dtypes.bfloat16)}
    step = tmp_path / "run" / "step_00001"
    step.mkdir(parents=True)
    for r in range(2):
        shard = {k: np.array_split(v, 2)[r] for k, v in tensors.items()}
        save_dump(str(step / f"rank{r}.safetensors"), shard)
    kernel = kernels.BUILT and not os.environ.get("GRADTOOL_NO_KERNELS")
    run_dir = str(tmp_path / "run")
    stats = [_run(["stats", run_dir, "--format", "json"], first, str(tmp_path)) for first in "-i"]
    assert stats[0]["out"] == stats[1]["out"] and stats[0]["ml_dtypes"] is not kernel
    outs = []
    for first in "-i":
        out = tmp_path / "out"
        run = _run(["clip", run_dir, "-o", str(out), "--mode", "global-norm", "--max", "1",
                    "--format", "json"], first, str(tmp_path))
        files = sorted(p for p in out.rglob("*") if p.is_file())
        outs.append([(p.relative_to(out).as_posix(), p.read_bytes()) for p in files])
        assert files and (first == "i" or run["ml_dtypes"] is not kernel)
        shutil.rmtree(out)
    assert outs[0] == outs[1]


def test_one_deferred_dtype_a_code_shared_by_its_tensors(monkeypatch):
    """Before ml_dtypes is imported, each BF16/F8 code has one DeferredDtype, shared by every tensor of
    it (as NumPy's dtypes are one object each): resolved once, one object a code, not one a tensor."""
    monkeypatch.delitem(sys.modules, "ml_dtypes")  # (only looked up: nothing here resolves one)
    monkeypatch.setattr(safetensors, "_DEFERRED", {})
    got = {code: safetensors.dtype_of(code) for code in CODES}
    assert all(type(d) is DeferredDtype and d.name == ML_DTYPES[c] for c, d in got.items())
    assert all(safetensors.dtype_of(code) is got[code] for code in CODES)


@pytest.mark.parametrize("axes", ["-1", "0"])
def test_nan_in_bfloat16_slices_taken_as_bits_is_refused_as_before(tmp_path, axes):
    """``clip --mode norm --axes`` of bfloat16 slices taken as their bits, under the "error" policy: a NaN
    (here in the last chunk of a row, in the second column) is refused with the error and exit code of
    the values' path (ml_dtypes imported first), and nothing is written."""
    from gradtool import save_dump

    rng = np.random.default_rng(3)
    w = (rng.standard_normal((3, 300_000)) if axes == "-1" else rng.standard_normal((150_001, 2))) * 1e-3
    w.reshape(-1)[-2] = np.nan
    path, out = str(tmp_path / "d.safetensors"), str(tmp_path / "out.safetensors")
    save_dump(path, {"w": w.astype(ml_dtypes.bfloat16), "b": np.ones(10, ml_dtypes.bfloat16)})
    got = []
    for first in ("", "import ml_dtypes; "):
        code = first + "import sys; from gradtool.cli.main import main; main(sys.argv[1:])"
        r = subprocess.run([sys.executable, "-c", code, "clip", path, "-o", out, "--mode", "norm", "--max", "1",
                            "--axes", axes], cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
        got.append((r.returncode, r.stderr))
        assert not os.path.exists(out)
    assert got[0] == got[1] and got[0][0] != 0 and "NaN/Inf in w" in got[0][1], got
