"""The .npy header fast path (a regex for the form NumPy writes) against ``ast.literal_eval``, which
NumPy itself uses: the same dict for every header NumPy writes, and None (so literal_eval decides) for
anything else, including near-misses made by mutating real headers."""

import ast
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool.errors import InputError
from gradtool.io.npy import _canonical_header, read_npy_header

DTYPES = ["<f4", ">f4", "<f8", "<f2", "|u1", "|i1", "<i8", ">u2", "|b1", "<c8", "<V2", "<M8[ns]", "<U3"]


def _header(shape, descr, fortran, version):
    b = io.BytesIO()
    write = np.lib.format.write_array_header_1_0 if version == 1 else np.lib.format.write_array_header_2_0
    write(b, {"descr": descr, "fortran_order": fortran, "shape": shape})
    return b.getvalue()


_shapes = st.lists(st.integers(0, 2**40), max_size=5).map(tuple)


@settings(max_examples=300, deadline=None)
@given(shape=_shapes, descr=st.sampled_from(DTYPES), fortran=st.booleans(), version=st.sampled_from([1, 2]))
def test_numpy_written_headers_parse_as_literal_eval_does(shape, descr, fortran, version):
    raw = _header(shape, descr, fortran, version)
    text = raw[10 if version == 1 else 12:].decode("latin1")
    fast = _canonical_header(text)
    ref = ast.literal_eval(text)
    assert fast is None or fast == ref
    if "[" not in descr:  # the plain dtypes a dump holds always take the fast path
        assert fast == ref and type(fast["shape"]) is tuple


@settings(max_examples=500, deadline=None)
@given(shape=_shapes, descr=st.sampled_from(DTYPES), fortran=st.booleans(), data=st.data())
def test_mutated_headers_are_never_read_differently(shape, descr, fortran, data):
    """A header changed at a few places: the fast path either declines or agrees with literal_eval; it
    never accepts what literal_eval rejects (e.g. leading zeros) or reads it differently."""
    text = bytearray(_header(shape, descr, fortran, 1)[10:])
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(text) - 1))
        text[pos] = data.draw(st.sampled_from(b"0123456789, ()'{}:TrueFalse<>|fx\n "))
    header = text.decode("latin1")
    fast = _canonical_header(header)
    try:
        ref = ast.literal_eval(header)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        assert fast is None
        return
    assert fast is None or fast == ref


@pytest.mark.parametrize("shape_text", ["(007,)", "(1, 02)", "(-1,)", "(1 ,)", "(1,2)", "(100000000)"])
def test_near_misses_go_to_literal_eval(shape_text):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text + ", }"
    assert _canonical_header(header) is None


def test_read_npy_header_takes_both_paths():
    """Headers read through read_npy_header with the right lengths; a broken shape is malformed."""
    for descr, expect in (("<f4", np.dtype("<f4")), ("<i2", np.dtype("<i2"))):
        raw = _header((3, 4), descr, False, 1)
        shape, dtype, fortran, hlen = read_npy_header(io.BytesIO(raw + b"\0" * 24), "t", "f.npz")
        assert (shape, dtype, fortran, hlen) == ((3, 4), expect, False, len(raw))
    bad = bytearray(_header((3,), "<f4", False, 1))
    bad[bad.index(b"(3,)") + 1] = ord("x")
    with pytest.raises(InputError, match="malformed"):
        read_npy_header(io.BytesIO(bytes(bad)), "t", "f.npz")


def _read(raw: bytes, name: str = "t"):
    return read_npy_header(io.BytesIO(raw + b"\0" * 64), name, "f.npz")


@settings(max_examples=200, deadline=None)
@given(shape=_shapes, descr=st.sampled_from(DTYPES + ["|O"]), fortran=st.booleans(),
       version=st.sampled_from([1, 2]))
def test_a_header_read_again_comes_from_the_cache_with_the_same_answer(shape, descr, fortran, version):
    """read_npy_header remembers the headers it accepted (a history repeats its model's headers): the
    second read of a header gives what the first gave, and a refused header is refused again (its
    message names the tensor of each read), never served from the cache."""
    from gradtool.io import npy

    raw = _header(shape, descr, fortran, version)
    npy._PARSED.clear()
    try:
        first = _read(raw, "a")
    except InputError as exc:
        assert "'a'" in str(exc)
        with pytest.raises(InputError, match="'b'"):
            _read(raw, "b")
        assert not npy._PARSED
        return
    assert len(npy._PARSED) == 1
    assert _read(raw, "b") == first
    npy._PARSED.clear()
    assert _read(raw, "c") == first  # as parsed afresh


def test_the_cache_of_headers_is_bounded(monkeypatch):
    from gradtool.io import npy

    monkeypatch.setattr(npy, "_PARSED", {})
    monkeypatch.setattr(npy, "MAX_PARSED", 8)
    for n in range(20):
        assert _read(_header((n, 3), "<f4", False, 1))[0] == (n, 3)
    assert len(npy._PARSED) == 8
    assert _read(_header((19, 3), "<f4", False, 1))[0] == (19, 3)  # past the bound: parsed every time


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["<f4", ">f4", "<f2", "<f8", ">i8", "|u1", "<c8", "|b1"]),
       st.lists(st.integers(0, 40), max_size=3), st.integers(1, 3))
def test_npy_header_bytes_are_numpys_whether_made_or_remembered(descr, shape, calls):
    """The header written before a tensor's chunks is what np.save writes for the array in native byte
    order, the first time and when remembered, for repeated and new shapes alike."""
    from gradtool.io.base import TensorInfo
    from gradtool.io.npy import npy_header_bytes

    dtype = np.dtype(descr)
    array = np.zeros(shape, dtype.newbyteorder("="))
    buf = io.BytesIO()
    np.save(buf, array)
    want = buf.getvalue()[: len(buf.getvalue()) - array.nbytes]
    for _ in range(calls):
        assert npy_header_bytes(TensorInfo("t", tuple(shape), dtype)) == want


@settings(max_examples=200, deadline=None)
@given(shape=_shapes, descr=st.sampled_from(DTYPES + ["|O"]), fortran=st.booleans(),
       version=st.sampled_from([1, 2]), cut=st.integers(0, 12), flip=st.integers(-1, 200))
def test_parse_npy_header_of_bytes_answers_as_read_npy_header(shape, descr, fortran, version, cut, flip):
    """parse_npy_header (a whole header's bytes, the npz index's deflated path) gives read_npy_header's
    answer or its error, for headers read for the first time or again, whole, cut short or with a byte
    changed."""
    from gradtool.io import npy
    from gradtool.io.npy import parse_npy_header

    raw = bytearray(_header(shape, descr, fortran, version))
    if 0 <= flip < len(raw):
        raw[flip] ^= 0x20
    raw = bytes(raw[: len(raw) - cut])
    npy._PARSED.clear()
    whole = _header(shape, descr, fortran, version)
    if cut and len(whole) - cut > 12:  # the same text, remembered for a shorter header: not its answer
        short = whole[:8] + (len(whole) - cut - 10).to_bytes(2, "little") if version == 1 else \
            whole[:8] + (len(whole) - cut - 12).to_bytes(4, "little")
        try:
            read_npy_header(io.BytesIO(short + whole[len(short):len(whole) - cut]), "t", "f.npz")
        except InputError:
            pass
    for _ in range(2):  # parsed, then (when accepted) remembered
        try:
            want = read_npy_header(io.BytesIO(raw), "t", "f.npz")
        except InputError as exc:
            with pytest.raises(InputError) as got:
                parse_npy_header(raw, "t", "f.npz")
            assert str(got.value) == str(exc)
        else:
            assert parse_npy_header(raw, "t", "f.npz") == want
