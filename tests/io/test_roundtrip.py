import json
import os
import re

import h5py
import ml_dtypes
import numpy as np
import pytest

from gradtool import open_dump, save_dump
from gradtool.errors import InputError
from gradtool.io.detect import detect_format
from gradtool.io.history import expand_inputs
from tests.reference import ref_global

FORMATS = ["npz", "h5", "safetensors"]


def sample_tensors():
    rng = np.random.default_rng(0)
    return {
        "encoder/layer.0/attn[weight]": rng.standard_normal((4, 3)).astype(np.float32),
        "bias": rng.standard_normal(5).astype(np.float64),
        "half": rng.standard_normal((2, 2)).astype(np.float16),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 7), np.float32),
        "count": np.arange(6, dtype=np.int64).reshape(2, 3),
        "mask": np.array([True, False]),
        "ünïcode.名前": np.ones(3, np.float32),
    }


@pytest.mark.parametrize("ext", FORMATS)
def test_roundtrip_names_order_shapes_dtypes_values(tmp_path, ext):
    t = sample_tensors()
    p = str(tmp_path / f"d.{ext}")
    save_dump(p, t, {"step": 12, "loss": 0.25})
    with open_dump(p) as r:
        assert r.step == 12 and r.metadata["loss"] == 0.25
        if ext != "safetensors":  # safetensors orders by data offset, which we write in the given order too
            assert r.names == list(t)
        assert r.names == list(t)
        for name, a in t.items():
            b = r.read(name)
            assert b.dtype == a.dtype and b.shape == a.shape
            assert b.tobytes() == a.tobytes()


def test_bfloat16_and_float8_in_safetensors(tmp_path):
    p = str(tmp_path / "bf.safetensors")
    t = {"w": np.array([1.5, -2.0, 3e38], ml_dtypes.bfloat16), "f8": np.array([0.5], ml_dtypes.float8_e4m3fn)}
    save_dump(p, t)
    with open_dump(p) as r:
        assert r.read("w").dtype == np.dtype(ml_dtypes.bfloat16)
        assert r.read("w").tobytes() == t["w"].tobytes()
        assert r.read("f8").tobytes() == t["f8"].tobytes()


@pytest.mark.parametrize("ext", ["npz", "h5"])
def test_bfloat16_refused_where_the_format_lacks_it(tmp_path, ext):
    from gradtool.errors import GradtoolError

    with pytest.raises(GradtoolError, match="safetensors"):
        save_dump(str(tmp_path / f"x.{ext}"), {"w": np.ones(2, ml_dtypes.bfloat16)})
    assert not os.listdir(tmp_path)  # nothing left behind


def test_interop_with_official_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    t = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, 2], np.int32)}
    p1 = str(tmp_path / "ours.safetensors")
    save_dump(p1, t, {"step": 3})
    loaded = st.load_file(p1)
    assert all(np.array_equal(loaded[k], v) for k, v in t.items())
    p2 = str(tmp_path / "theirs.safetensors")
    st.save_file(t, p2, metadata={"step": "7"})
    with open_dump(p2) as r:
        assert r.step == 7 and np.array_equal(r.read("a"), t["a"])


def test_interop_with_numpy_savez(tmp_path):
    a, b = np.arange(5.0), np.ones((2, 2), np.float32)
    for fn, name in ((np.savez, "s.npz"), (np.savez_compressed, "c.npz")):
        p = str(tmp_path / name)
        fn(p, a=a, b=b)
        with open_dump(p) as r:
            assert r.names == ["a", "b"] and np.array_equal(r.read("a"), a) and np.array_equal(r.read("b"), b)
    with open_dump(str(tmp_path / "c.npz")) as r:
        assert r.compressed


@pytest.mark.parametrize("ext,compress", [("npz", False), ("npz", True), ("h5", False), ("h5", True),
                                          ("safetensors", False)])
def test_the_same_dump_written_at_two_times_is_the_same_bytes(tmp_path, monkeypatch, ext, compress):
    """No wall-clock time in an output (the npz metadata member carried its writing time): a clip run
    twice gives identical files, so outputs can be compared by hash. zipfile's clock is moved forward a
    day for the second write; HDF5 would record times through its C library's clock, so that case waits
    a little over a second (HDF5 times have one-second resolution)."""
    import time
    import types
    import zipfile

    tensors = {"layer/w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5)}
    meta = {"step": 7, "loss": 0.25}
    first, second = str(tmp_path / f"a.{ext}"), str(tmp_path / f"b.{ext}")
    save_dump(first, tensors, meta, compress=compress)

    now = time.time
    tomorrow = types.SimpleNamespace(time=lambda: now() + 86400, localtime=time.localtime)
    monkeypatch.setattr(zipfile, "time", tomorrow)
    if ext == "h5":
        time.sleep(1.1)
    save_dump(second, tensors, meta, compress=compress)
    assert open(first, "rb").read() == open(second, "rb").read()


def test_npy_single_tensor(tmp_path):
    p = str(tmp_path / "grad.npy")
    np.save(p, np.arange(4, dtype=np.float32))
    with open_dump(p) as r:
        assert r.names == ["grad"] and r.read("grad").tolist() == [0, 1, 2, 3]
    f = str(tmp_path / "fortran.npy")
    np.save(f, np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    with open_dump(f) as r:
        assert r.read("fortran").tolist() == [[0, 1, 2], [3, 4, 5]]


def test_format_detected_from_bytes_not_extension(tmp_path):
    p = str(tmp_path / "misnamed.h5")
    np.savez(p.replace(".h5", ""), x=np.ones(2))
    os.rename(p.replace(".h5", ".npz"), p)
    assert detect_format(p) == "npz"
    with open_dump(p) as r:
        assert r.format == "npz"


def test_hdf5_tree_attributes_and_compression_kept(tmp_path):
    src = str(tmp_path / "keras.h5")
    with h5py.File(src, "w") as f:
        f.attrs["step"] = 4
        g = f.create_group("model/dense")
        g.attrs["layer"] = "dense"
        d = g.create_dataset("kernel", data=np.ones((3, 2), np.float32), compression="gzip")
        d.attrs["units"] = 2
        f.create_dataset("top", data=np.arange(3.0))
    with open_dump(src) as r:
        assert set(r.names) == {"model/dense/kernel", "top"}
        assert r.step == 4 and r.info("model/dense/kernel").compression == "gzip"
        assert r.group_attrs["model/dense"]["layer"] == "dense"


def test_hdf5_soft_links_are_not_followed(tmp_path):
    p = str(tmp_path / "links.h5")
    with h5py.File(p, "w") as f:
        f["real"] = np.arange(3.0)
        f["soft"] = h5py.SoftLink("/real")
        f["dangling"] = h5py.SoftLink("/nowhere")
        f["hard"] = f["real"]  # a second hard link to the same object: visited once
    with open_dump(p) as r:
        assert r.names == ["real"] or r.names == ["hard"]


def test_hdf5_non_numeric_datasets_are_named_as_what_they_are(tmp_path, run):
    """h5py gives HDF5's variable-length types (strings, sequences, references) an object dtype, and the
    refusal said "holds Python objects (pickle)": there is no pickle in HDF5. Now it says what the
    dataset holds, and where text belongs (attributes, read as metadata)."""
    cases = {"text": ("hello", "a string dataset, not a numeric tensor (keep text as an attribute"),
             "fixed": (np.bytes_("abc"), "a string dataset"),
             "seq": (None, "a dataset of variable-length sequences, not a numeric tensor"),
             "ref": (None, "a dataset of HDF5 references, not a numeric tensor")}
    for name, (value, said) in cases.items():
        p = str(tmp_path / f"{name}.h5")
        with h5py.File(p, "w") as f:
            f["w"] = np.ones(3, np.float32)
            if name == "seq":
                f.create_dataset(name, (2,), dtype=h5py.vlen_dtype(np.float32))
            elif name == "ref":
                f.create_dataset(name, (1,), dtype=h5py.ref_dtype)
            else:
                f[name] = value
        with pytest.raises(InputError, match=re.escape(f"{name}.h5: tensor {name!r} is {said}")):
            open_dump(p)
        r = run("stats", p)
        assert r.exit_code == 1 and "pickle" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_hdf5_external_links_are_refused_not_skipped(tmp_path, run):
    """An external link was skipped without a word: its tensor was missing from the global norm (a
    smaller norm, a wrong threshold). Now the dump is refused, naming the link and its target, wherever
    the link is: in a group of a dump, or at the top of a history file (where it could be a step)."""
    other = str(tmp_path / "other.h5")
    with h5py.File(other, "w") as f:
        f["w"] = np.full(3, 100.0)
        f.create_group("step_2").attrs["step"] = 2
        f["step_2/w"] = np.ones(3)
    dump = str(tmp_path / "dump.h5")
    with h5py.File(dump, "w") as f:
        f["model/a"] = np.arange(3.0)
        f["model/b"] = h5py.ExternalLink(other, "/w")
    history = str(tmp_path / "history.h5")
    with h5py.File(history, "w") as f:
        f.create_group("step_1").attrs["step"] = 1
        f["step_1/w"] = np.ones(3)
        f["step_2"] = h5py.ExternalLink(other, "/step_2")
    with pytest.raises(InputError, match=r"dump\.h5: 'model/b' is an external link to '.*other\.h5':/w: not read"):
        open_dump(dump)
    with pytest.raises(InputError, match=r"history\.h5: 'step_2' is an external link to '.*other\.h5':/step_2"):
        expand_inputs([history])
    for path in (dump, history):
        r = run("stats", path)
        assert r.exit_code == 1 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "is an external link" in r.stderr and "Traceback" not in r.stderr
    out = str(tmp_path / "out.h5")
    r = run("clip", dump, "-o", out, "--mode", "global-norm", "--max", "1")
    assert r.exit_code == 1 and not os.path.exists(out)


def test_hdf5_data_outside_the_dump_is_refused_not_read(tmp_path, run):
    """Raw external storage reads any file's bytes as a tensor (clip would copy them into its output); a
    virtual dataset reads other files, and its fill value where they are gone (a silent norm 0). Both
    were read; now the dump is refused, naming the dataset and the files."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.full(8, 7.0, np.float32).tobytes())
    ext = str(tmp_path / "ext.h5")
    with h5py.File(ext, "w") as f:
        f["inside"] = np.ones(3)
        f.create_dataset("w", shape=(8,), dtype="f4", external=[(str(secret), 0, 32)])
    refused = r"ext\.h5: dataset 'w' keeps its data in external file\(s\) '.*/secret"
    with pytest.raises(InputError, match=refused):
        open_dump(ext)
    src = str(tmp_path / "src.h5")
    with h5py.File(src, "w") as f:
        f["a"] = np.arange(4.0)
    layout = h5py.VirtualLayout(shape=(4,), dtype="f8")
    layout[:] = h5py.VirtualSource(src, "a", shape=(4,))
    vds = str(tmp_path / "vds.h5")
    with h5py.File(vds, "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=0)
    os.remove(src)  # h5py would now read zeros
    for path, what in ((ext, "external file"), (vds, "virtual dataset mapped from '.*src.h5'")):
        out = str(tmp_path / ("out_" + os.path.basename(path)))
        r = run("clip", path, "-o", out, "--mode", "value", "--max", "100")
        assert r.exit_code == 1 and not os.path.exists(out)
        assert re.search(what, r.stderr) and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert run("stats", path).exit_code == 1


def test_stdin_dump(tmp_path, monkeypatch):
    import io
    import sys

    p = str(tmp_path / "x.npz")
    save_dump(p, {"w": np.arange(3.0)})
    with open(p, "rb") as f:
        data = f.read()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    r = open_dump("-")
    spooled = r.path
    assert r.read("w").tolist() == [0, 1, 2] and r.display_path == "<stdin>"
    r.close()
    assert not os.path.exists(spooled)


def test_save_refuses_existing_file(tmp_path):
    from gradtool.errors import OutputError

    p = str(tmp_path / "x.npz")
    save_dump(p, {"w": np.ones(1)})
    with pytest.raises(OutputError, match="exists"):
        save_dump(p, {"w": np.zeros(1)})
    save_dump(p, {"w": np.zeros(1)}, force=True)
    with open_dump(p) as r:
        assert r.read("w")[0] == 0


def test_hdf5_every_storage_layout_reads_the_same(tmp_path):
    """Contiguous datasets are indexed by file offset; chunked, compressed, compact and empty ones
    through h5py. All read back exactly, with their dataset attributes."""
    p = str(tmp_path / "layouts.h5")
    a = np.arange(600, dtype=np.float32).reshape(20, 30) - 300.5
    with h5py.File(p, "w", track_order=True) as f:
        f.create_dataset("contig", data=a).attrs["units"] = 30
        f.create_dataset("chunked", data=a, chunks=(3, 30))
        f.create_dataset("gz", data=a, compression="gzip", compression_opts=7)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        space = h5py.h5s.create_simple((4,))
        h5py.h5d.create(f.id, b"compact", h5py.h5t.NATIVE_DOUBLE, space, dcpl=dcpl).write(
            h5py.h5s.ALL, h5py.h5s.ALL, np.arange(4.0))
        f.create_dataset("unallocated", shape=(5,), dtype="f4")
        f.create_dataset("empty", shape=(0, 3), dtype="f4")
    with open_dump(p) as r:
        assert r.names == ["contig", "chunked", "gz", "compact", "unallocated", "empty"]
        for n in ("contig", "chunked", "gz"):
            np.testing.assert_array_equal(r.read(n), a)
            np.testing.assert_array_equal(np.concatenate([c.copy() for c in r.iter_chunks(r.info(n), 64)]), a.ravel())
        assert r.info("contig").attrs == {"units": 30} and r.info("chunked").attrs == {}
        assert r.info("gz").compression == "gzip" and r.info("gz").compression_opts == 7
        assert r.info("contig").compression is None
        assert r.raw_location(r.info("contig")) is not None and r.raw_location(r.info("gz")) is None
        assert r.read("compact").tolist() == [0, 1, 2, 3]
        assert r.read("unallocated").tolist() == [0] * 5
        assert r.read("empty").shape == (0, 3)


@pytest.mark.parametrize("userblock", [512, 4096])
def test_hdf5_after_a_user_block_is_detected_and_read_at_the_right_offsets(tmp_path, userblock):
    """An HDF5 file may begin with a user block (its superblock then sits at 512, 1024, 2048, ...; MATLAB
    v7.3 .mat files have one): it was refused as 'does not look like a hdf5 file'. Contiguous datasets are
    read by file offset (pread, the parallel statistics and the compiled kernel), so their values are
    checked against h5py's, big enough for the parallel path, and through clip."""
    import subprocess
    import sys

    from gradtool.summarize import summarize_dump

    p = str(tmp_path / "ub.mat")
    rng = np.random.default_rng(7)
    big = rng.standard_normal((1500, 1000)).astype(np.float32)  # 6 MB: read in pieces on two threads
    with h5py.File(p, "w", userblock_size=userblock, track_order=True) as f:
        f.create_dataset("big", data=big)
        f.create_dataset("chunked", data=big[:50], chunks=(10, 1000), compression="gzip")
        f.create_dataset("small", data=np.arange(5.0))
    with open(p, "rb") as f:
        assert f.read(8) != b"\x89HDF\r\n\x1a\n"
    assert detect_format(p) == "hdf5"
    with open_dump(p) as r:
        assert r.names == ["big", "chunked", "small"]
        np.testing.assert_array_equal(r.read("big"), big)
        assert r.raw_location(r.info("big")) is not None  # the offset path is the one under test
        tensors = dict(summarize_dump(r).tensors)
    ref = np.sqrt(np.sum(big.astype(np.float64) ** 2))
    assert tensors["big"].norm == pytest.approx(ref, rel=1e-7)  # float32 chunk dots, summed in float64
    assert tensors["big"].max_abs == np.abs(big).max()
    assert tensors["small"].norm == pytest.approx(np.sqrt(30.0))
    out = str(tmp_path / "clipped.h5")
    proc = subprocess.run([sys.executable, "-m", "gradtool", "clip", p, "-o", out, "--mode", "norm", "--max", "1",
                           "--format", "json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["dumps"][0]["clipped_tensors"] == 3
    with open_dump(out) as c:
        np.testing.assert_allclose(c.read("big"), big / ref, rtol=2e-7)


def test_hdf5_nested_groups_hard_link_cycle_and_group_attrs(tmp_path):
    p = str(tmp_path / "tree.h5")
    with h5py.File(p, "w", track_order=True) as f:
        g = f.create_group("a", track_order=True)
        g.attrs["kind"] = "block"
        g.create_dataset("w", data=np.ones(3))
        g.create_group("b").create_dataset("v", data=np.zeros(2))
        g["b"]["back"] = g  # a hard link cycle a/b/back -> a
    with open_dump(p) as r:
        assert r.names == ["a/w", "a/b/v"]
        assert r.group_attrs["a"] == {"kind": "block"} and r.group_attrs["a/b"] == {}


def test_hdf5_name_that_is_not_utf8_is_a_one_line_error(tmp_path):
    from gradtool.errors import InputError

    p = str(tmp_path / "latin1.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset(b"caf\xe9", data=np.ones(2))
    with pytest.raises(InputError, match="latin1.h5.*not valid UTF-8"):
        open_dump(p)


def test_hdf5_history_file_is_refused_as_one_dump_and_read_as_history(tmp_path):
    from gradtool.errors import InputError
    from gradtool.io.hdf5 import open_h5, step_groups

    p = str(tmp_path / "hist.h5")
    with h5py.File(p, "w", track_order=True) as f:
        f.create_dataset("loose", data=np.ones(1))
        for s in (10, 20):
            f.create_group(f"step_{s}").attrs["step"] = s
            f[f"step_{s}"].create_dataset("w", data=np.full(2, s, np.float32))
        f.create_group("notes").attrs["step"] = "ten"  # not an integer: not a step group
        f["soft"] = h5py.SoftLink("/step_10")
    with pytest.raises(InputError, match="several steps"):
        open_dump(p)
    f = open_h5(p, p)
    try:
        assert step_groups(f, p) == [("step_10", 10), ("step_20", 20)]
    finally:
        f.close()
    with open_dump(p, group="step_20") as r:
        assert r.read("w").tolist() == [20, 20]


def _reference_walk(group, prefix="", seen=None):
    """Independent reference for the HDF5 index: h5py's own group iteration (creation order where a group
    tracks it, name order where not), hard links only, each object once (the root group counts as seen:
    a hard link back to it is a cycle), depth first; (name, kind)."""
    seen = {h5py.h5o.get_info(group.id).addr} if seen is None else seen
    out = []
    for key in group.id:
        if group.id.links.get_info(key).type != h5py.h5l.TYPE_HARD:
            continue
        info = h5py.h5o.get_info(group.id, key)
        if info.addr in seen:
            continue
        seen.add(info.addr)
        name = prefix + key.decode()
        if info.type == h5py.h5o.TYPE_DATASET:
            out.append((name, "dataset"))
        else:
            out.append((name, "group"))
            out.extend(_reference_walk(group[key.decode()], name + "/", seen))
    return out


def _reference_external_links(group, prefix="", seen=None):
    """Independent reference for the links the index refuses: the external links below a group, by
    h5py's own iteration (name order, HDF5's H5Lvisit order), through hard links to groups each once."""
    seen = {h5py.h5o.get_info(group.id).addr} if seen is None else seen
    out = []
    for key in sorted(group.id):
        kind = group.id.links.get_info(key).type
        if kind == h5py.h5l.TYPE_EXTERNAL:
            out.append(prefix + key.decode())
        elif kind == h5py.h5l.TYPE_HARD and h5py.h5o.get_info(group.id, key).type == h5py.h5o.TYPE_GROUP:
            addr = h5py.h5o.get_info(group.id, key).addr
            if addr not in seen:
                seen.add(addr)
                out.extend(_reference_external_links(group[key.decode()], prefix + key.decode() + "/", seen))
    return out


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_h5_names = st.sampled_from(["z", "a", "m", "b", "y", "q0", "Q", "é"])


@st.composite
def _h5_trees(draw, depth=0):
    """A group: (track_order, [(name, child)]) where child is None (a dataset), "hard"/"soft"/"ext" (a
    link to an earlier object) or a subtree."""
    children = []
    for name in draw(st.lists(_h5_names, max_size=4, unique=True)):
        kinds = [None, "hard", "soft", "ext"] + (["group"] if depth < 2 else [])
        kind = draw(st.sampled_from(kinds))
        children.append((name, draw(_h5_trees(depth + 1)) if kind == "group" else kind))
    return draw(st.booleans()), children


@settings(max_examples=60, deadline=None)
@given(tree=_h5_trees())
def test_hdf5_index_walk_equals_h5pys_own_iteration(tmp_path_factory, tree):
    """The reader's one-call walk (H5Ovisit) lists the tensors and groups in the order, and under the
    names, of a walk through h5py's own group iteration: mixed creation-order tracking, repeated hard
    links (cycles included), soft and external links (never followed)."""
    path = str(tmp_path_factory.mktemp("walk") / "t.h5")
    made = []  # paths of every object made, for the hard links

    def build(group, node, prefix):
        for name, child in node[1]:
            full = prefix + name
            if child is None:
                group.create_dataset(name, data=np.arange(3, dtype=np.float32))
                made.append(full)
            elif child == "hard":
                group[name] = group.file[made[-1]] if made else group  # an earlier object, or a cycle
            elif child == "soft":
                group[name] = h5py.SoftLink("/" + made[-1] if made else "/nowhere")
            elif child == "ext":
                group[name] = h5py.ExternalLink("/etc/hostname", "/x")
            else:
                sub = group.create_group(name, track_order=child[0])
                made.append(full)
                build(sub, child, full + "/")

    with h5py.File(path, "w", track_order=tree[0]) as f:
        build(f, tree, "")
    with h5py.File(path, "r") as f:
        want = _reference_walk(f)
        external = _reference_external_links(f)
    if external:
        with pytest.raises(InputError, match=re.escape(f"{external[0]!r} is an external link")):
            open_dump(path)
        return
    with open_dump(path) as r:
        assert r.names == [n for n, kind in want if kind == "dataset"]
        assert list(r.group_attrs) == [n for n, kind in want if kind == "group"]


def test_hdf5_dtypes_recognised_by_type_equality_are_h5pys(tmp_path):
    """The index recognises common HDF5 types by H5Tequal, and converts the others as h5py does: every
    dtype below must come out as h5py's own ``Dataset.dtype`` (byte order included)."""
    codes = ["<f4", ">f4", "<f8", ">f8", "<f2", ">f2", "<i8", ">i8", "<i4", "<i2", "i1", "u1", "<u2", "<u4",
             "<u8", "?", "<c8", "<c16"]
    path = str(tmp_path / "types.h5")
    with h5py.File(path, "w", track_order=True) as f:
        for i, code in enumerate(codes):
            f.create_dataset(f"t{i}", data=np.zeros(3, dtype=code))
    with h5py.File(path, "r") as f:
        want = [f[f"t{i}"].dtype for i in range(len(codes))]
    with open_dump(path) as r:
        got = [i.dtype for i in r.tensors]
    assert [d.str for d in got] == [d.str for d in want]
    assert got == want


def test_clip_keeps_hdf5_soft_links(tmp_path, run):
    """Soft links (aliases of a tensor or group, dangling ones) were left out of clip's HDF5 output without
    a word; they are written as they were, so an alias names the clipped tensor. Each tensor is still
    read and clipped once, under its hard link's name."""
    p = str(tmp_path / "aliases.h5")
    w = np.full((3, 4), 2.0, np.float32)  # norm sqrt(12 * 4)
    with h5py.File(p, "w", track_order=True) as f:
        f["enc/w"] = w
        f["enc/alias"] = h5py.SoftLink("w")  # relative
        f["head"] = h5py.SoftLink("/enc/w")
        f["blocks"] = h5py.SoftLink("/enc")
        f["gone"] = h5py.SoftLink("/nowhere")
    out = str(tmp_path / "clipped.h5")
    r = run("clip", p, "-o", out, "--mode", "norm", "--max", "1", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert [t["name"] for t in json.loads(r.stdout)["dumps"][0]["tensors"]] == ["enc/w"]
    with h5py.File(out, "r") as f:
        links = {n: f.get(n, getlink=True) for n in ("enc/alias", "head", "blocks", "gone")}
        assert {n: (type(link).__name__, link.path) for n, link in links.items()} == {
            "enc/alias": ("SoftLink", "w"), "head": ("SoftLink", "/enc/w"), "blocks": ("SoftLink", "/enc"),
            "gone": ("SoftLink", "/nowhere")}
        expected = w.astype(np.float64) / np.sqrt(np.sum(w.astype(np.float64) ** 2))
        for name in ("enc/w", "enc/alias", "head", "blocks/w"):
            np.testing.assert_allclose(f[name][()], expected, rtol=1e-6)


def test_clip_keeps_soft_links_inside_the_steps_of_a_history(tmp_path, run):
    p = str(tmp_path / "hist.h5")
    with h5py.File(p, "w", track_order=True) as f:
        for s in (1, 2):
            g = f.create_group(f"step_{s}")
            g.attrs["step"] = s
            g["w"] = np.full(4, 3.0 * s, np.float32)
            g["alias"] = h5py.SoftLink(f"/step_{s}/w")
    out = str(tmp_path / "clipped.h5")
    r = run("clip", p, "-o", out, "--mode", "global-norm", "--max", "1")
    assert r.exit_code == 0, r.stderr
    with h5py.File(out, "r") as f:
        for s in (1, 2):
            assert f.get(f"step_{s}/alias", getlink=True).path == f"/step_{s}/w"
            np.testing.assert_allclose(f[f"step_{s}/alias"][()], np.full(4, 0.5), rtol=1e-6)


def test_clip_keeps_second_hard_links(tmp_path, run):
    """A tensor under two names (tied weights written as ``f["lm_head/w"] = f["embed/w"]``), a group
    under two names and a link back to the root lost their second names in clip's HDF5 output; the
    tensor is counted once in the global norm (as PyTorch counts a tied parameter) and clipped once."""
    p = str(tmp_path / "tied.h5")
    embed, other = np.full((4, 3), 2.0, np.float32), np.arange(5, dtype=np.float32)
    with h5py.File(p, "w", track_order=True) as f:
        f["embed/w"] = embed
        f["lm_head/w"] = f["embed/w"]
        f["enc/v"] = other
        f["enc_alias"] = f["enc"]
        f["enc/root"] = f["/"]
    with open_dump(p) as r:
        assert r.names == ["embed/w", "enc/v"]
        assert r.hard_links == {"lm_head/w": "embed/w", "enc_alias": "enc", "enc/root": ""}
    out = str(tmp_path / "clipped.h5")
    r = run("clip", p, "-o", out, "--mode", "global-norm", "--max", "1", "--format", "json")
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)["dumps"][0]
    assert rep["global_norm_before"] == pytest.approx(ref_global([embed, other]), rel=1e-6)
    with h5py.File(out, "r") as f:
        def addr(name):
            return h5py.h5o.get_info(f[name].id).addr

        assert addr("lm_head/w") == addr("embed/w") and addr("enc_alias") == addr("enc")
        assert addr("enc/root") == addr("/")
        np.testing.assert_allclose(f["lm_head/w"][()], embed / ref_global([embed, other]), rtol=1e-6)


def test_files_without_second_names_have_no_hard_links(tmp_path):
    p = str(tmp_path / "plain.h5")
    with h5py.File(p, "w") as f:
        f["a/w"] = np.ones(3, np.float32)
        f["b"] = np.ones(2, np.float32)
    with open_dump(p) as r:
        assert r.hard_links == {} and r.soft_links == {}
