"""Malicious and broken files: one clear error naming the file, never a traceback, never unpickling."""

import io
import os
import struct
import zipfile

import numpy as np
import pytest

from gradtool import open_dump, save_dump
from gradtool.errors import GradtoolError, InputError, UnsafeInputError


class Boom:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))  # would create a file if ever unpickled


def test_pickled_object_array_in_npz_is_refused_and_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    p = str(tmp_path / "evil.npz")
    np.savez(p, ok=np.ones(2), evil=np.array([Boom(str(marker))], dtype=object))
    with pytest.raises(UnsafeInputError, match="evil.*pickle|pickle") as e:
        with open_dump(p) as r:
            [r.read(n) for n in r.names]
    assert "evil" in str(e.value)
    assert not marker.exists()


def test_a_dict_saved_whole_says_how_to_save_its_tensors(tmp_path, run):
    """np.save("step.npy", grads) and np.savez("step.npz", grads=grads) pickle the dict: refused, never
    unpickled, with what to call instead (it said only "holds Python objects (pickle)")."""
    marker = tmp_path / "pwned"
    grads = {"w": np.ones(3), "boom": Boom(str(marker))}
    np.save(tmp_path / "step.npy", grads, allow_pickle=True)
    np.savez(tmp_path / "step.npz", grads=grads)
    for name, member in (("step.npy", "step"), ("step.npz", "grads")):
        r = run("stats", str(tmp_path / name))
        assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
        assert (f"gradtool: error: {tmp_path / name}: tensor {member!r} is one pickled Python object (a dict "
                "of gradients given to np.save, or to np.savez as one argument?); refusing to load it: save "
                "the tensors themselves, np.savez(path, **grads)") in r.stderr
    assert not marker.exists()


def test_member_claiming_huge_shape(tmp_path):
    p = str(tmp_path / "bomb.npz")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("x.npy", header.getvalue() + b"\0" * 64)
    with pytest.raises(InputError, match="claims"):
        open_dump(p)


def test_npy_claiming_huge_shape(tmp_path):
    p = str(tmp_path / "bomb.npy")
    with open(p, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (10**15, 10**6)})
        f.write(b"\0" * 16)
    with pytest.raises(InputError, match="truncated"):
        open_dump(p)


@pytest.mark.parametrize("ext", ["npz", "h5", "safetensors", "npy"])
def test_truncated_files_at_many_offsets(tmp_path, ext):
    p = str(tmp_path / f"good.{ext}")
    t = {"w": np.arange(1000, dtype=np.float32)} if ext == "npy" else {"a": np.arange(1000, dtype=np.float32), "b": np.ones(300)}
    if ext == "npy":
        np.save(p, t["w"])
    else:
        save_dump(p, t)
    data = open(p, "rb").read()
    for cut in sorted({1, 5, 8, 9, 20, 64, 100, len(data) // 3, len(data) // 2, len(data) - 100, len(data) - 1}):
        bad = str(tmp_path / f"cut{cut}.{ext}")
        with open(bad, "wb") as f:
            f.write(data[:cut])
        with pytest.raises(GradtoolError) as e:
            with open_dump(bad) as r:
                for n in r.names:
                    r.read(n)
        assert os.path.basename(bad) in str(e.value)


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_cut_short_says_truncated(tmp_path, compressed):
    """An np.savez file cut short (a crash, or a dump still being written) lacks the zip directory written
    last: the message says so, not only zipfile's 'File is not a zip file'; a zip-like file that does not
    begin as a zip keeps the general message."""
    p = str(tmp_path / "good.npz")
    (np.savez_compressed if compressed else np.savez)(p, w=np.arange(5000, dtype=np.float32))
    data = (tmp_path / "good.npz").read_bytes()
    for cut in (100, len(data) // 2, len(data) - 1):
        bad = tmp_path / f"cut{cut}.npz"
        bad.write_bytes(data[:cut])
        with pytest.raises(InputError, match=rf"cut{cut}.npz: truncated .npz archive: the zip directory .* "
                                             r"missing \(cut short, or still being written\)"):
            open_dump(str(bad))
    other = tmp_path / "other.npz"
    other.write_bytes(b"PK\x05\x06" + b"\0" * 10)
    with pytest.raises(InputError, match="other.npz: not a readable .npz archive"):
        open_dump(str(other))


def test_text_file_named_h5(tmp_path):
    p = tmp_path / "notes.h5"
    p.write_text("hello, I am not HDF5\n")
    with pytest.raises(InputError, match="notes.h5.*not look like a hdf5|does not look like"):
        open_dump(str(p))


def test_zero_length_file(tmp_path):
    p = tmp_path / "empty.npz"
    p.write_bytes(b"")
    with pytest.raises(InputError, match=r"empty.npz: is empty \(0 bytes: a dump still being written"):
        open_dump(str(p))


@pytest.mark.parametrize("name", ["../escape", "/abs/path", "a/../../b", "nul\x00byte", "ctl\x1b[31m", "x" * 5000, "a//b", ""])
def test_path_like_and_control_names_refused_in_safetensors(tmp_path, name):
    import json

    p = str(tmp_path / "names.safetensors")
    header = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")
    with pytest.raises(UnsafeInputError):
        open_dump(p)


def test_tf_style_names_are_fine(tmp_path):
    p = str(tmp_path / "tf.npz")
    save_dump(p, {"dense/kernel:0": np.ones(2), "w:0": np.ones(1), "attn[weight]": np.ones(1)})
    with open_dump(p) as r:
        assert r.names == ["dense/kernel:0", "w:0", "attn[weight]"]


def test_safetensors_overlapping_and_out_of_range_offsets(tmp_path):
    import json

    def write(header, data=b"\0" * 8):
        p = str(tmp_path / "x.safetensors")
        h = json.dumps(header).encode()
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + data)
        return p

    with pytest.raises(UnsafeInputError, match="overlaps"):
        open_dump(write({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}))
    with pytest.raises(InputError, match="past the end"):
        open_dump(write({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}))
    with pytest.raises(InputError, match="do not match"):
        open_dump(write({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}))
    with pytest.raises(InputError, match="unsupported dtype"):
        open_dump(write({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}))
    with pytest.raises(InputError, match="duplicate"):
        p = str(tmp_path / "dup.safetensors")
        h = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"\0" * 8)
        open_dump(p)


def test_valid_zip_that_is_not_an_npz(tmp_path):
    p = str(tmp_path / "docs.npz")
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("readme.txt", "hello")
    # once read as a dump of no tensors (global norm 0, exit 0): a torch.save file is such a zip
    with pytest.raises(InputError, match=r"docs.npz: is a zip archive with no .npy member \(1 other"):
        open_dump(p)


def test_corrupt_member_data(tmp_path):
    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, a=np.random.default_rng(0).standard_normal(10_000))
    data = bytearray(open(p, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(p, "wb").write(bytes(data))
    with pytest.raises(InputError, match="c.npz"):
        with open_dump(p) as r:
            r.read("a")


def test_npz_local_header_naming_another_file_is_refused(tmp_path):
    """The stored members' headers are read at the offsets of their local headers (not through zipfile):
    a local header whose file name differs from the central directory's is refused as zipfile does."""
    p = tmp_path / "swapped.npz"
    np.savez(p, alpha=np.ones(3, np.float32))
    data = bytearray(p.read_bytes())
    data[data.index(b"alpha.npy")] = ord("b")  # the first occurrence is the local header's copy
    p.write_bytes(bytes(data))
    with pytest.raises(InputError, match="swapped.npz.*local header names another file"):
        open_dump(str(p))


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(name=st.text(min_size=1, max_size=12))
def test_control_character_check_is_its_definition(name):
    """The regex check refuses exactly the names with a character below 32 or DEL."""
    from gradtool.io.base import check_tensor_name

    control = any(ord(c) < 32 or ord(c) == 127 for c in name)
    try:
        check_tensor_name(name, "f")
        refused = None
    except UnsafeInputError as exc:
        refused = str(exc)
    if control:
        assert refused is not None
    elif refused is not None:
        assert "control" not in refused


def _name_refused_by_definition(name: str) -> bool:
    """The rules of check_tensor_name written out, for the test of its one-regex fast path."""
    parts = name.replace("\\", "/").split("/")
    return (not name or len(name) > 4096 or any(ord(c) < 32 or ord(c) == 127 for c in name)
            or name[0] in "/\\" or (len(name) > 2 and name[0].isalpha() and name[1] == ":" and name[2] in "/\\")
            or any(p in ("", ".", "..") for p in parts))


@settings(max_examples=500, deadline=None)
@given(name=st.one_of(st.text(max_size=12), st.text(st.sampled_from("ab./\\:\x00\x7f"), max_size=8),
                      st.sampled_from([".", "..", "a..b", "...", "C:x", "C:/x", "x" * 4096, "x" * 4097])))
def test_tensor_name_check_is_its_definition(name):
    """Names of one part take a regular expression, the others the step-by-step checks: the same answers."""
    from gradtool.io.base import MAX_NAME_LENGTH, check_tensor_name

    assert MAX_NAME_LENGTH == 4096
    try:
        assert check_tensor_name(name, "f") == name
        refused = False
    except UnsafeInputError:
        refused = True
    assert refused == _name_refused_by_definition(name)


def _check_shape_by_each_dimension(shape, name, path):
    """check_shape as it was written before plain ints were told by their types together."""
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InputError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
    if any(d < 0 for d in shape) or len(shape) > 64:
        raise InputError(f"{path}: tensor {name!r} has an invalid shape {tuple(shape)!r}")
    return tuple(int(d) for d in shape)


class _Dim(int):
    """An int subclass (an IntEnum's members are such), a shape's dimension all the same."""


@settings(max_examples=400, deadline=None)
@given(st.one_of(
    st.lists(st.one_of(st.integers(-3, 2**40), st.booleans(), st.floats(0, 4), st.none(), st.text(max_size=2),
                       st.integers(0, 9).map(_Dim), st.integers(0, 9).map(np.int64)), max_size=5),
    st.lists(st.integers(0, 3), min_size=60, max_size=70), st.integers(0, 5), st.none(), st.text(max_size=3),
    st.lists(st.integers(0, 9), max_size=4).map(tuple)))
def test_a_shape_is_checked_as_it_was_dimension_by_dimension(shape):
    """check_shape accepts and refuses what it did when it checked each dimension in a generator: lists
    and tuples of at most 64 non-negative ints (int subclasses too, bools and NumPy ints not), with the
    same message; a tuple of ints back."""
    from gradtool.io.base import check_shape

    def outcome(check):
        try:
            got = check(shape, "t", "x.safetensors")
            return got, [type(d) for d in got]
        except InputError as exc:
            return str(exc)

    assert outcome(check_shape) == outcome(_check_shape_by_each_dimension)


@pytest.mark.parametrize("text, error", [('{"a": 1, "b": {"c": 2, "c": 3}}', "duplicate key 'c'"),
                                         ('{"b": 1, "a": 2, "b": 3, "a": 4}', "duplicate key 'b'"),
                                         ('{"a": {"b": 1}, "b": {"a": 1}}', None)])
def test_a_safetensors_header_with_a_key_given_twice_is_refused_naming_the_first(text, error):
    """_no_duplicates (json's object_pairs_hook for safetensors headers) names the first key given twice in
    an object, at any depth; an object of distinct keys is a dict of them."""
    import json

    from gradtool.io.safetensors import _no_duplicates

    if error is None:
        assert json.loads(text, object_pairs_hook=_no_duplicates) == json.loads(text)
        return
    with pytest.raises(ValueError, match=error):
        json.loads(text, object_pairs_hook=_no_duplicates)


def test_the_collector_is_paused_while_an_index_is_read_and_on_again_after(tmp_path, monkeypatch):
    """open_dump reads an index with the cyclic garbage collector paused (thousands of small objects, no
    cycles), and turns it on again after, when the index is refused too; one already off stays off."""
    import gc

    from gradtool.io import safetensors

    seen = []
    index = safetensors.SafetensorsReader._index
    monkeypatch.setattr(safetensors.SafetensorsReader, "_index", lambda self: seen.append(gc.isenabled()) or index(self))
    good = str(tmp_path / "a.safetensors")
    save_dump(good, {"w": np.ones(3, np.float32)})
    bad = str(tmp_path / "b.safetensors")  # refused by its index: a tensor named twice
    h = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    with open(bad, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"\0" * 8)
    assert gc.isenabled()
    open_dump(good).close()
    with pytest.raises(InputError):
        open_dump(bad)
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        open_dump(good).close()
        assert not gc.isenabled()
    finally:
        gc.enable()
