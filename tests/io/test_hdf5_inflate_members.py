"""Small gzip HDF5 datasets inflated whole, many to a call (``Hdf5Reader.inflate_members``): the bytes
h5py reads, for ``stats``' small-member jobs (``summarize.inflated_small_stats``) the statistics of
streaming each dataset, bit for bit; a dataset it does not take or that fails a check is None, and
streaming it reports what is wrong."""

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool import open_dump
from gradtool import summarize as summarize_mod
from gradtool.core import kernels
from gradtool.core.stats import STREAM_CHUNK
from gradtool.errors import InputError
from gradtool.io.hdf5 import SMALL_DATASET_BYTES, Hdf5Reader
from gradtool.summarize import summarize_dump
from tests.small_members import whole_and_streamed

needs_kernel = pytest.mark.skipif(kernels.compiled_f32_summaries is None, reason="compiled kernel not built")


def _write(path, datasets):
    """``datasets``: name -> (array, h5py create_dataset keywords)."""
    with h5py.File(path, "w", track_order=True) as f:
        for name, (a, kw) in datasets.items():
            f.create_dataset(name, data=a, **kw)


def _mixed(rng):
    gz = {"compression": "gzip"}
    return {
        "one_chunk": (rng.standard_normal(1000).astype(np.float32), gz),
        "edge_chunks": (rng.standard_normal((37, 5)).astype(np.float32), {**gz, "chunks": (8, 3)}),
        "shuffled": (rng.standard_normal(999).astype(np.float16), {**gz, "shuffle": True, "chunks": (100,)}),
        "big_endian": (rng.standard_normal(300).astype(">f4"), {**gz, "chunks": (64,)}),
        "ints": (np.arange(500, dtype=np.int32), gz),
        "f64": (rng.standard_normal(77), {**gz, "compression_opts": 9}),
        "contiguous": (rng.standard_normal(50).astype(np.float32), {}),
        "lzf": (rng.standard_normal(50).astype(np.float32), {"compression": "lzf"}),
        "large": (rng.standard_normal(SMALL_DATASET_BYTES // 4 + 1).astype(np.float32), gz),
        "empty": (np.zeros(0, np.float32), {}),
    }


def test_inflate_members_gives_the_bytes_h5py_reads_and_none_for_the_rest(tmp_path):
    path = str(tmp_path / "mixed.h5")
    data = _mixed(np.random.default_rng(0))
    _write(path, data)
    with h5py.File(path, "a") as f:  # (an attribute: h5py indexes it, not the header reader)
        ds = f.create_dataset("with_attrs", data=data["one_chunk"][0][:10], compression="gzip")
        ds.attrs["note"] = 1
    taken = {"one_chunk", "edge_chunks", "shuffled", "ints", "f64"}  # (big-endian: h5py indexes it)
    with open_dump(path) as reader:
        assert isinstance(reader, Hdf5Reader)
        infos = reader.tensors
        assert {i.name for i in infos if reader.inflates_whole(i)} == taken
        out = np.full(sum(i.nbytes for i in infos) + 3, 0xAB, np.uint8)
        got = reader.inflate_members(infos, out)
        at = 0
        for info, view in zip(infos, got):
            if info.name in taken:
                assert bytes(view) == data[info.name][0].tobytes(), info.name  # (the file's byte order)
                assert np.shares_memory(np.frombuffer(view, np.uint8), out[at:at + info.nbytes])
            else:
                assert view is None, info.name
                assert (out[at:at + info.nbytes] == 0xAB).all()  # nothing written where it was not taken
            at += info.nbytes
        alone = reader.inflate_members([reader.info("shuffled")])  # (its own bytes when no buffer is given)
        assert bytes(alone[0]) == data["shuffled"][0].tobytes()


def _damage_chunk(path, name):
    with h5py.File(path, "r") as f:
        info = f[name].id.get_chunk_info(0)
    with open(path, "r+b") as f:
        f.seek(info.byte_offset + info.size // 2)
        b = f.read(1)
        f.seek(info.byte_offset + info.size // 2)
        f.write(bytes([b[0] ^ 0xFF]))


def test_a_damaged_small_dataset_is_none_and_streaming_it_names_the_file(tmp_path):
    rng = np.random.default_rng(1)
    path = str(tmp_path / "bad.h5")
    _write(path, {f"t{i}": (rng.standard_normal(2000).astype(np.float32), {"compression": "gzip"})
                  for i in range(30)})
    _damage_chunk(path, "t20")
    with open_dump(path) as reader:
        got = reader.inflate_members(reader.tensors)
        assert got[20] is None and all(g is not None for k, g in enumerate(got) if k != 20)
        with pytest.raises(InputError, match=r"bad.h5: dataset 't20'"):
            summarize_dump(reader)


def _both(path, monkeypatch):
    return whole_and_streamed(path, monkeypatch, Hdf5Reader)


@needs_kernel
def test_stats_of_small_gzip_datasets_inflated_whole_equal_streamed(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    data = _mixed(rng)
    data["specials"] = (np.array([np.nan, -np.inf, 1e25, 0.0] * 50, np.float32), {"compression": "gzip"})
    data["last_one_chunk"] = (rng.standard_normal(STREAM_CHUNK).astype(np.float32), {"compression": "gzip"})
    data["two_stream_chunks"] = (rng.standard_normal(STREAM_CHUNK + 1).astype(np.float32), {"compression": "gzip"})
    path = str(tmp_path / "s.h5")
    _write(path, data)
    whole, streamed, got = _both(path, monkeypatch)
    assert [n for n, _ in whole.tensors] == list(data)
    assert [repr(s) for _, s in whole.tensors] == [repr(s) for _, s in streamed.tensors]
    assert {"one_chunk", "edge_chunks", "shuffled", "specials", "last_one_chunk"} <= set(got)
    stats = dict(whole.tensors)  # and against an independent float64 reference
    for k in ("one_chunk", "edge_chunks", "shuffled"):
        x = data[k][0].astype(np.float64)
        assert stats[k].norm == pytest.approx(np.sqrt(np.sum(x * x)), rel=1e-6)
        assert stats[k].max_abs == np.max(np.abs(x))


@needs_kernel
@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, STREAM_CHUNK + 1), min_size=1, max_size=10),
       rows=st.sampled_from([None, 999, 4096, 100_000]), shuffle=st.booleans(), seed=st.integers(0, 2**32 - 1),
       job=st.integers(1, 1 << 18))
def test_any_small_gzip_datasets_in_any_jobs_equal_streamed(tmp_path_factory, sizes, rows, shuffle, seed, job):
    """Datasets across the one-chunk boundary, in HDF5 chunks of any size, in jobs of any size."""
    rng = np.random.default_rng(seed)
    data = {}
    for k, n in enumerate(sizes):
        a = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 3)).astype([np.float32, np.float16][k % 2])
        kw = {"compression": "gzip", "shuffle": shuffle}
        if rows is not None:
            kw["chunks"] = (min(rows, n),)
        data[f"layer.{k}"] = (a, kw)
    path = str(tmp_path_factory.mktemp("h") / "g.h5")
    _write(path, data)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(summarize_mod, "SMALL_MEMBER_JOB_BYTES", job)
        whole, streamed, _ = _both(path, m)
    assert [repr(s) for _, s in whole.tensors] == [repr(s) for _, s in streamed.tensors]
