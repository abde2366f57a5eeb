"""Every bad input: exit 1 (or 2, or 0 where the file is still a valid dump), one line on stderr naming the
file, no traceback, no output file, no temp file, the input untouched, nothing unpickled, no hang."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal

import pytest

from tests.hostile.corpus import build_corpus

HANG_GUARD_SECONDS = 60  # not a performance bound: a hang would otherwise stall the whole suite


@contextlib.contextmanager
def hang_guard(seconds: int = HANG_GUARD_SECONDS):
    def boom(*_):
        raise TimeoutError(f"no answer within {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    marker = str(d / "PWNED")
    items = build_corpus(str(d), marker)
    return d, marker, items


def _sha(p: str) -> str:
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


def _check_failure(r, path: str, what: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, f"{what}: expected one line on stderr, got {r.stderr!r}"
    assert lines[0].startswith("gradtool: error: "), (what, lines[0])
    assert os.path.basename(path)[:40] in lines[0] or "<stdin>" in lines[0], (what, lines[0])
    assert "Traceback" not in r.stderr


def test_every_bad_dump_fails_cleanly(corpus, run, tmp_path):
    d, marker, items = corpus
    dumps = [b for b in items if b.kind == "dump"]
    assert len(dumps) > 150
    for bad in dumps:
        before = _sha(bad.path)
        out_dir = tmp_path / "out"
        out_dir.mkdir(exist_ok=True)
        out = str(out_dir / ("clipped" + os.path.splitext(bad.path)[1]))
        with hang_guard():
            r = run("stats", bad.path, "--format", "json")
        assert r.exit_code in bad.codes, f"{bad.what}: stats exit {r.exit_code}: {r.stderr}"
        if r.exit_code:
            _check_failure(r, bad.path, bad.what)
        with hang_guard():
            r = run("clip", bad.path, "-o", out, "--mode", "global-norm", "--max", "1", "--nonfinite", "zero")
        if r.exit_code:
            _check_failure(r, bad.path, bad.what)
            assert not os.path.exists(out), bad.what
        assert r.exit_code in bad.codes + ((1,) if 0 in bad.codes else ()), f"{bad.what}: clip exit {r.exit_code}: {r.stderr}"
        leftovers = [f for f in os.listdir(out_dir) if f.endswith(".gradtool-tmp")]
        assert not leftovers, (bad.what, leftovers)
        for f in os.listdir(out_dir):
            os.remove(out_dir / f)
        assert _sha(bad.path) == before, f"{bad.what}: the input changed"
    assert not os.path.exists(marker), "a pickle was executed"


def test_every_bad_log_fails_cleanly(corpus, run):
    d, marker, items = corpus
    for bad in [b for b in items if b.kind == "log"]:
        with hang_guard():
            r = run("suggest-threshold", bad.path)
        assert r.exit_code in bad.codes, f"{bad.what}: exit {r.exit_code}: {r.stderr}"
        _check_failure(r, bad.path, bad.what)


def test_corpus_size_is_reported(corpus):
    d, marker, items = corpus
    print(f"\ncorpus: {len(items)} bad inputs ({sum(b.kind == 'dump' for b in items)} dumps, "
          f"{sum(b.kind == 'log' for b in items)} logs)")
    assert len(items) >= 170


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_refused_dumps_leave_no_descriptor_open(corpus):
    """Opening and reading every bad dump in one process (as a long-lived library user or the fuzzer
    does) leaves the number of open descriptors where it was: a reader that refuses a file closes what
    it opened. (The npz reader once kept its raw descriptor after refusing a file, and the safetensors
    and HDF5 readers theirs after refusing a tensor name; the fuzzer ran out of descriptors.)"""
    from gradtool import open_dump
    from gradtool.errors import GradtoolError

    d, marker, items = corpus
    dumps = [b for b in items if b.kind == "dump"]
    before = len(os.listdir("/proc/self/fd"))
    for bad in dumps:
        try:
            with open_dump(bad.path) as r:
                for name in r.names:
                    r.read(name)
        except GradtoolError:
            pass
    assert len(os.listdir("/proc/self/fd")) == before
