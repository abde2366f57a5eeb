"""A stored npz member whose bytes were damaged but whose sizes are right (a bit flipped on a disk or in a
copy) is refused by its CRC-32, as ``np.load`` refuses it, on every path that reads it: the streamed and
raw ones ``stats`` and ``clip`` take, not only a whole ``read``. Before, ``stats`` printed the damaged
norms with exit 0 and ``clip`` wrote them into a new npz with a fresh, matching CRC."""

import json
import os
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradtool import open_dump, save_dump
from gradtool.errors import InputError
from gradtool.io import inflate
from gradtool.io.npz import NpzReader


def _data_span(path, member):
    """(first byte, end) of a stored member's bytes (.npy header and data) in the file."""
    with zipfile.ZipFile(path) as z:
        zi = z.getinfo(member)
    with open(path, "rb") as f:
        f.seek(zi.header_offset + 26)
        name_len, extra_len = np.frombuffer(f.read(4), "<u2")
    start = zi.header_offset + 30 + int(name_len) + int(extra_len)
    return start, start + zi.file_size


def _flip(path, position, bit=0x10):
    data = bytearray(open(path, "rb").read())
    data[position] ^= bit
    open(path, "wb").write(bytes(data))


def crc_calls(monkeypatch):
    """The length of each piece of data the readers take a CRC-32 of from now on (a list that grows)."""
    calls = []
    real = inflate.fast_crc32

    def counting():
        crc32 = real()

        def counted(data, value=0):
            calls.append(len(data))
            return crc32(data, value)
        return counted

    monkeypatch.setattr(inflate, "fast_crc32", counting)
    return calls


@pytest.fixture
def damaged(tmp_path):
    """A two-tensor npz whose member 'w' has one bit flipped in its data; and the undamaged original."""
    good = str(tmp_path / "good.npz")
    save_dump(good, {"w": np.arange(100_000, dtype=np.float32), "b": np.ones(7)})
    bad = str(tmp_path / "bad.npz")
    open(bad, "wb").write(open(good, "rb").read())
    start, end = _data_span(bad, "w.npy")
    _flip(bad, (start + end) // 2)
    return good, bad


def test_np_load_refuses_the_damaged_file_too(damaged):
    """The premise: numpy's own loader says the file is corrupt."""
    with pytest.raises(zipfile.BadZipFile, match="Bad CRC-32"):
        np.load(damaged[1])["w"]


@pytest.mark.parametrize("how", ["read", "iter_chunks", "raw_location", "iter_chunks_ahead"])
def test_every_read_path_refuses_the_damaged_member(damaged, how):
    with open_dump(damaged[1]) as r:
        np.testing.assert_array_equal(r.read("b"), np.ones(7))  # the undamaged member reads
        with pytest.raises(InputError, match=r"bad.npz: member 'w.npy' is corrupt \(bad CRC-32\)"):
            info = r.info("w")
            if how == "read":
                r.read("w")
            elif how == "raw_location":
                r.raw_location(info)
            else:
                list(getattr(r, how)(info, 4096))


def test_stats_refuses_the_damaged_dump_in_one_line(run, damaged):
    assert run("stats", damaged[0], "--format", "json").exit_code == 0
    r = run("stats", damaged[1], "--format", "json")
    assert r.exit_code == 1
    assert r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"gradtool: error: {damaged[1]}: member 'w.npy' is corrupt (bad CRC-32)"]


def test_clip_writes_nothing_from_the_damaged_dump_and_leaves_it_as_it_was(run, damaged, tmp_path):
    before = open(damaged[1], "rb").read()
    out = tmp_path / "out.npz"
    for mode in (["--mode", "global-norm", "--max", "1"], ["--mode", "value", "--max", "1e30"]):
        r = run("clip", damaged[1], "-o", str(out), *mode)
        assert r.exit_code == 1, r.stderr
        assert "member 'w.npy' is corrupt (bad CRC-32)" in r.stderr
        assert not out.exists()
        assert sorted(os.listdir(tmp_path)) == ["bad.npz", "good.npz"]  # no temporary file left either
    assert open(damaged[1], "rb").read() == before


def test_a_damaged_step_of_a_history_is_named(run, damaged, tmp_path):
    hist = tmp_path / "hist"
    hist.mkdir()
    os.link(damaged[0], hist / "step_00001.npz")
    os.link(damaged[1], hist / "step_00002.npz")
    r = run("stats", str(hist), "--format", "json")
    assert r.exit_code == 1
    assert "step_00002.npz: member 'w.npy' is corrupt (bad CRC-32)" in r.stderr


def test_each_member_is_checked_once(damaged, monkeypatch):
    """Chunks asked for twice, and the raw location after them, cost one CRC pass a member."""
    monkeypatch.setattr(NpzReader, "CRC_PIECE", 1 << 20)
    calls = crc_calls(monkeypatch)
    with zipfile.ZipFile(damaged[0]) as z:
        sizes = sorted(zi.file_size for zi in z.infolist())
    with open_dump(damaged[0]) as r:
        for name in ("w", "b", "w"):
            info = r.info(name)
            for _ in range(2):
                list(r.iter_chunks(info, 4096))
            r.raw_location(info)
    assert sorted(calls) == sizes  # each member's .npy header and data, once (both from one pread)


def test_a_window_of_members_ends_at_one_already_checked(tmp_path, monkeypatch):
    """A member read whole first (its CRC checked by that read) is not checked again by the window of
    members checked from an earlier one: the window ends before it, the members after it are checked
    when asked for."""
    p = str(tmp_path / "three.npz")
    save_dump(p, {"a": np.arange(1000.0), "b": np.arange(2000.0), "c": np.arange(3000.0)})
    calls = crc_calls(monkeypatch)
    with zipfile.ZipFile(p) as z:
        size = {zi.filename[:-4]: zi.file_size for zi in z.infolist()}
    with open_dump(p) as r:
        r.read("b")
        assert sum(calls) == size["b"]  # (its header, then its data)
        done = len(calls)
        r.raw_location(r.info("a"))
        assert calls[done:] == [size["a"]]  # 'a' alone: the window stops at 'b'
        r.raw_location(r.info("b"))
        assert len(calls) == done + 1
        r.raw_location(r.info("c"))
        assert calls[done + 1:] == [size["c"]]


def test_the_check_can_be_switched_off(damaged, monkeypatch):
    monkeypatch.setattr(NpzReader, "VERIFY_CRC", False)
    with open_dump(damaged[1]) as r:
        assert sum(c.size for c in r.iter_chunks(r.info("w"), 4096)) == 100_000


_dtypes = st.sampled_from(["<f4", "<f2", "<f8", "<i8", "|b1", "|u1", ">f4"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=_dtypes, n=st.integers(0, 3000), piece=st.sampled_from([64, 1000, 4096, 1 << 20]),
       task=st.sampled_from([1, 100, 4096, 8 << 20]), window=st.sampled_from([1, 5000, 64 << 20]),
       where=st.floats(0, 1, exclude_max=True), bit=st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]),
       seed=st.integers(0, 2**16))
def test_any_bit_flipped_in_a_member_is_caught_and_an_intact_one_passes(tmp_path, monkeypatch, dtype, n, piece,
                                                                         task, window, where, bit, seed):
    """A CRC-32 catches every single-bit error: a flip anywhere in a member's data (any dtype, any size,
    checked from one pread or in tasks of any size on two threads, their CRCs combined, alone or with
    the members after it) is refused; the intact file streams numpy's values, and its other members
    pass."""
    monkeypatch.setattr(NpzReader, "CRC_PIECE", piece)
    monkeypatch.setattr(NpzReader, "CRC_TASK", task)
    monkeypatch.setattr(NpzReader, "CRC_WINDOW", window)
    a = (np.random.default_rng(seed).standard_normal(n) * 100).astype(dtype)
    p = str(tmp_path / f"d{seed}.npz")
    if os.path.exists(p):
        os.remove(p)
    np.savez(p, t=a, after=np.arange(n % 700, dtype=np.float32))
    with open_dump(p) as r:
        got = np.concatenate([c.copy() for c in r.iter_chunks(r.info("t"), 512)] or [np.zeros(0, a.dtype)])
    assert got.tobytes() == a.astype(a.dtype.newbyteorder("=")).tobytes()
    start, end = _data_span(p, "t.npy")
    header = 128
    if end - start == header:
        return  # an empty tensor: nothing but the header to damage (a damaged header is refused as such)
    _flip(p, start + header + int(where * (end - start - header)), bit)
    with open_dump(p) as r:
        with pytest.raises(InputError, match=r"member 't.npy' is corrupt \(bad CRC-32\)"):
            list(r.iter_chunks(r.info("t"), 512))
        assert r.raw_location(r.info("after")) is not None  # the member after it is intact


@settings(max_examples=200, deadline=None)
@given(a=st.binary(max_size=3000), b=st.binary(max_size=3000), seed=st.integers(0, 2**32 - 1))
def test_crc32_combine_is_the_crc_of_the_joined_bytes(a, b, seed):
    """zlib's crc32_combine, which Python's zlib lacks: from the CRCs of two pieces and the second's
    length, the CRC of both (a starting value carried through the first)."""
    import zlib

    from gradtool.io.inflate import crc32_combine

    assert crc32_combine(zlib.crc32(a, seed), zlib.crc32(b), len(b)) == zlib.crc32(a + b, seed)


def test_crc32_combine_over_long_lengths():
    """Lengths of gigabytes: the CRC of 2^k zero bytes after a piece, against zlib's own over the bytes."""
    import zlib

    from gradtool.io.inflate import crc32_combine

    head = b"gradient"
    for n in (1, 4095, 1 << 20, (1 << 24) + 7):
        zeros = bytes(n)
        assert crc32_combine(zlib.crc32(head), zlib.crc32(zeros), n) == zlib.crc32(head + zeros)


def test_threads_asking_for_members_at_once_each_get_the_verdict(tmp_path, monkeypatch):
    """raw_location from several threads at once on one reader (clip's and stats' workers may ask): every
    intact member is handed out, the damaged one refused, whichever thread checks which window."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(NpzReader, "CRC_WINDOW", 20_000)
    monkeypatch.setattr(NpzReader, "CRC_PIECE", 2_000)
    monkeypatch.setattr(NpzReader, "CRC_TASK", 3_000)
    p = str(tmp_path / "many.npz")
    save_dump(p, {f"t{i:03d}": np.full(500 + i, i, np.float32) for i in range(120)})
    start, end = _data_span(p, "t077.npy")
    _flip(p, end - 3)

    def ask(name):
        try:
            return r.raw_location(r.info(name)) is not None
        except InputError as exc:
            return str(exc)

    for _ in range(5):
        with open_dump(p) as r, ThreadPoolExecutor(4) as pool:
            got = dict(zip(r.names, pool.map(ask, r.names)))
        assert got.pop("t077") == f"{p}: member 't077.npy' is corrupt (bad CRC-32)"
        assert set(got.values()) == {True}


def test_where_files_cannot_be_mapped_the_members_are_read(damaged, monkeypatch):
    """A file system that refuses mmap: the same verdicts, from pread (the check itself; the readers'
    windows into aligned data still map them)."""
    import mmap

    def refuse(*args, **kwargs):
        raise OSError(19, "No such device")

    monkeypatch.setattr(mmap, "mmap", refuse)
    monkeypatch.setattr(NpzReader, "CRC_PIECE", 100)
    monkeypatch.setattr(NpzReader, "CRC_TASK", 50_000)
    good, bad = damaged
    with open_dump(good) as r:
        assert r.raw_location(r.info("w")) is not None
    with open_dump(bad) as r, pytest.raises(InputError, match=r"member 'w.npy' is corrupt \(bad CRC-32\)"):
        r.raw_location(r.info("w"))


def test_stats_of_the_intact_members_of_a_damaged_dump_by_select(run, damaged):
    """The damaged member is refused when asked for, not before: --select of the others still reads."""
    r = run("stats", damaged[1], "--select", "b", "--format", "json")
    assert r.exit_code == 0, r.stderr
    (dump,) = json.loads(r.stdout)["dumps"]
    assert [t["name"] for t in dump["tensors"]] == ["b"]
    assert dump["global_norm"] == pytest.approx(7 ** 0.5)


def test_a_whole_read_and_the_streamed_paths_share_one_verdict(damaged, monkeypatch):
    """A member read whole is not checked again when streamed after it, nor the other way round; a
    damaged one stays refused by every path."""
    calls = crc_calls(monkeypatch)
    with open_dump(damaged[0]) as r:
        r.read("b")
        assert calls
        done = len(calls)
        list(r.iter_chunks(r.info("b"), 4096))
        assert len(calls) == done  # 'b', read whole, is not checked again when streamed
        r.raw_location(r.info("w"))
        assert len(calls) > done
        done = len(calls)
        r.read("w")
        assert len(calls) == done  # 'w', checked for its raw location, is not checked again read whole
    with open_dump(damaged[1]) as r:
        for _ in range(2):
            with pytest.raises(InputError, match="bad CRC-32"):
                r.read("w")
        with pytest.raises(InputError, match="bad CRC-32"):
            r.raw_location(r.info("w"))


# -- the statistics pass on two threads takes the CRC-32 of each member the kernel reads, in that read


def _in_kernel_pass(monkeypatch, piece_bytes=2 * 4096 * 4):
    """The two-thread statistics pass for any dump size, several pieces per big tensor."""
    from gradtool import summarize as summarize_mod

    monkeypatch.setattr(summarize_mod, "STATS_WORKERS", 2)
    monkeypatch.setattr(summarize_mod, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(summarize_mod, "PIECE_BYTES", piece_bytes)


def _mixed():
    """Members the kernel reads (float32 of several pieces and a short one, float16, small float32 ones
    taken many to a call) and members it does not (float64, int32)."""
    from gradtool.core.stats import STREAM_CHUNK

    rng = np.random.default_rng(11)
    return {"big": rng.standard_normal(3 * STREAM_CHUNK + 999).astype(np.float32),
            "f64": rng.standard_normal(5000), "half": rng.standard_normal(STREAM_CHUNK + 5).astype(np.float16),
            "s1": rng.standard_normal(300).astype(np.float32), "ints": np.arange(7000, dtype=np.int32),
            "s2": rng.standard_normal(4000).astype(np.float32), "tail": np.ones(70_000, np.float32)}


needs_crc_kernel = pytest.mark.skipif(__import__("gradtool.core.kernels", fromlist=["x"]).compiled_crc32_combine
                                      is None, reason="compiled kernel not built")


@needs_crc_kernel
def test_the_statistics_pass_checks_the_members_it_reads_in_the_kernel_as_it_reads_them(tmp_path, monkeypatch):
    """The members the kernel reads are not read a first time for their CRC: only the others go through
    the reader's own check (_check_crcs_from), and its windows stop at the members left to the kernel;
    every member ends up checked, none owed; the statistics are the one-thread ones (which check first)."""
    from gradtool.summarize import summarize_dump

    p = str(tmp_path / "mixed.npz")
    save_dump(p, _mixed())
    checked_from = []
    real = NpzReader._check_crcs_from
    calls = crc_calls(monkeypatch)

    def recording(self, name):
        checked_from.append(name)
        return real(self, name)

    monkeypatch.setattr(NpzReader, "_check_crcs_from", recording)
    with open_dump(p) as r:
        serial = [(n, repr(s)) for n, s in summarize_dump(r).tensors]  # (small: one thread, checked first)
    assert checked_from
    checked_from.clear()
    calls.clear()
    _in_kernel_pass(monkeypatch)
    with open_dump(p) as r:
        got = [(n, repr(s)) for n, s in summarize_dump(r).tensors]
        assert r._crc_checked == set(r.names) and not r._crc_owed and not r._crc_bad
    assert got == serial
    assert sorted(checked_from) == ["f64", "ints"]
    with zipfile.ZipFile(p) as z:
        sizes = {zi.filename[:-4]: zi.file_size for zi in z.infolist()}
    assert sorted(calls) == sorted([sizes["f64"], sizes["ints"]])  # each alone: the windows stop at the others


@needs_crc_kernel
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(member=st.sampled_from(["big", "f64", "half", "s1", "ints", "s2", "tail"]),
       where=st.floats(0, 1, exclude_max=True), bit=st.sampled_from([1, 8, 128]),
       piece_chunks=st.sampled_from([1, 2, 3, 64]))
def test_a_bit_flipped_in_any_member_is_caught_by_the_statistics_pass(tmp_path_factory, monkeypatch, member, where,
                                                                       bit, piece_chunks):
    """Whichever member holds the flipped bit (read by the kernel in pieces, many to a call, or not by
    the kernel), wherever in its data, however the big ones are cut into pieces: the pass refuses the
    dump, naming that member; the intact dump passes (the pieces' CRCs joined in order, the first
    continued from the .npy header's)."""
    from gradtool.core.stats import STREAM_CHUNK
    from gradtool.summarize import summarize_dump

    _in_kernel_pass(monkeypatch, piece_chunks * STREAM_CHUNK * 4)
    p = str(tmp_path_factory.mktemp("flip") / "d.npz")
    save_dump(p, _mixed())
    with open_dump(p) as r:
        assert len(summarize_dump(r).tensors) == 7
    start, end = _data_span(p, member + ".npy")
    _flip(p, start + 128 + int(where * (end - start - 128)), bit)
    with open_dump(p) as r, pytest.raises(InputError, match=rf"d\.npz: member '{member}\.npy' is corrupt \(bad CRC-32\)"):
        summarize_dump(r)


@needs_crc_kernel
def test_a_damaged_shard_of_a_sharded_step_is_named(tmp_path, monkeypatch):
    """A sharded step's pieces in npz shards: each shard's members are checked by the kernel's pass, and
    the damaged shard file is the one named."""
    from gradtool.io.sharded import ShardedReader
    from gradtool.summarize import summarize_dump

    _in_kernel_pass(monkeypatch)
    step = tmp_path / "step_00001"
    step.mkdir()
    rng = np.random.default_rng(2)
    paths = []
    for rank in range(2):
        paths.append(str(step / f"rank{rank}.npz"))
        save_dump(paths[-1], {"w": rng.standard_normal(50_000).astype(np.float32),
                              "b": rng.standard_normal(100).astype(np.float32)})
    with ShardedReader(paths, display_path=str(step)) as r:
        whole = summarize_dump(r)
    assert [n for n, _ in whole.tensors] == ["w", "b"]
    start, end = _data_span(paths[1], "b.npy")
    _flip(paths[1], end - 1)
    with ShardedReader(paths, display_path=str(step)) as r:
        with pytest.raises(InputError, match=r"rank1\.npz: member 'b\.npy' is corrupt \(bad CRC-32\)"):
            summarize_dump(r)


@needs_crc_kernel
def test_a_small_member_after_a_failed_batch_read_is_still_checked(tmp_path, monkeypatch):
    """The kernel's many-to-a-call read stops at a member it cannot read: the members from there on are
    streamed, and checked by the reader, so a damaged one among them is still refused."""
    from gradtool.core import kernels
    from gradtool.summarize import summarize_dump

    _in_kernel_pass(monkeypatch)
    p = str(tmp_path / "small.npz")
    save_dump(p, {f"t{i}": np.full(100 + i, i, np.float32) for i in range(10)})
    start, end = _data_span(p, "t7.npy")
    _flip(p, end - 2)
    real = kernels.compiled_tensor_summaries_fd

    def fails_at_5(fd, items, out, *crcs):
        real(fd, items[:5], out[:5], *(c[:5] for c in crcs))
        return 5

    monkeypatch.setattr(kernels, "compiled_tensor_summaries_fd", fails_at_5)
    with open_dump(p) as r, pytest.raises(InputError, match=r"member 't7\.npy' is corrupt \(bad CRC-32\)"):
        summarize_dump(r)
    start, end = _data_span(p, "t7.npy")
    _flip(p, end - 2)  # (the flip undone: the same path passes)
    with open_dump(p) as r:
        assert [s.max_abs for _, s in summarize_dump(r).tensors] == [float(i) for i in range(10)]


@needs_crc_kernel
def test_stats_and_clip_on_two_threads_refuse_the_damaged_dump(run, damaged, tmp_path, monkeypatch):
    """The CLI on the kernel's pass: one line naming the member, exit 1, nothing written."""
    _in_kernel_pass(monkeypatch)
    r = run("stats", damaged[1], "--format", "json")
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr.strip().splitlines() == [f"gradtool: error: {damaged[1]}: member 'w.npy' is corrupt (bad CRC-32)"]
    out = tmp_path / "out.npz"
    r = run("clip", damaged[1], "-o", str(out), "--mode", "global-norm", "--max", "1")
    assert r.exit_code == 1 and "member 'w.npy' is corrupt (bad CRC-32)" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["bad.npz", "good.npz"]
    assert run("stats", damaged[0], "--format", "json").exit_code == 0


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_DONTNEED") or not os.path.exists("/proc/self/status"),
                    reason="no MADV_DONTNEED or /proc here")
def test_the_check_lets_go_of_the_pages_it_has_read(tmp_path):
    """The members checked together are mapped whole (up to CRC_WINDOW bytes), and a mapped page of the
    page cache counts in the process's RSS until it is let go: each task's pages are dropped once read,
    so checking 96 MB of members raises the peak RSS by a task or two (8 MiB each), not by the window
    (``stats`` of a 245 MB npz without the kernel peaked at 299 MB). In a fresh process (VmHWM: its own
    peak; ``ru_maxrss`` would start from pytest's at the fork), the file in the page cache."""
    import subprocess
    import sys

    p = str(tmp_path / "big.npz")
    save_dump(p, {"a": np.ones(12 << 20, np.float32), "b": np.ones(12 << 20, np.float32)})  # 2 x 48 MiB
    with open(p, "rb") as f:
        while f.read(1 << 24):  # (into the page cache)
            pass
    script = (
        "import sys\n"
        "from gradtool import open_dump\n"
        "def peak():\n"
        "    with open('/proc/self/status') as f:\n"
        "        return next(int(line.split()[1]) for line in f if line.startswith('VmHWM:'))\n"
        "r = open_dump(sys.argv[1])\n"
        "before = peak()\n"
        "assert r.raw_location(r.info('a')) is not None and r._crc_checked >= {'a', 'b'}\n"
        "print(peak() - before)\n")
    grown_kib = int(subprocess.run([sys.executable, "-c", script, p], capture_output=True, text=True,
                                   check=True).stdout)
    assert grown_kib < 40 << 10  # (96 MiB without letting go)
