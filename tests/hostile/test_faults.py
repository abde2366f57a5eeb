"""Interrupted and failing writes: SIGKILL at many points, a full disk, two runs racing for one output.
The output path holds nothing or a complete file, never a half-written one; the input never changes."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gradtool import open_dump, save_dump

KILL_POINTS = 12


def gradtool_cmd() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "gradtool")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "gradtool"]


def sha(p: str) -> str:
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def big_dump(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    rng = np.random.default_rng(0)
    p = str(d / "big.npz")
    save_dump(p, {f"layer{i}/w": rng.standard_normal((1024, 1024), dtype=np.float32) for i in range(24)})
    return p  # ~100 MB


def is_complete(path: str) -> bool:
    """A complete dump: it opens and every tensor reads back with its full size."""
    try:
        with open_dump(path) as r:
            return all(r.read(n).size == r.info(n).size for n in r.names) and len(r.names) == 24
    except Exception:
        return False


@pytest.mark.parametrize("existing", [False, True])
def test_sigkill_at_many_points_loses_nothing(big_dump, tmp_path, existing):
    out = str(tmp_path / "out.npz")
    cmd = gradtool_cmd() + ["clip", big_dump, "-o", out, "--mode", "global-norm", "--max", "1", "--format", "json"]
    t = time.perf_counter()
    subprocess.run(cmd + ["--force"], check=True, capture_output=True)
    full = time.perf_counter() - t
    previous = sha(out)
    if not existing:
        os.remove(out)
    input_before = sha(big_dump)
    outcomes = {"no output": 0, "previous file": 0, "new complete file": 0}
    for k in range(KILL_POINTS):
        delay = full * (0.05 + 1.25 * k / (KILL_POINTS - 1))  # from start-up to just after the rename
        proc = subprocess.Popen(cmd + ["--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert sha(big_dump) == input_before
        if not os.path.exists(out):
            assert not existing, "the previous output vanished"
            outcomes["no output"] += 1
        elif sha(out) == previous:
            outcomes["previous file"] += 1
        else:
            assert is_complete(out), f"half-written output after a kill at {delay:.2f} s"
            outcomes["new complete file"] += 1
        for f in os.listdir(tmp_path):  # a killed run may leave its hidden temp file, never anything else
            assert f == "out.npz" or (f.startswith(".out.npz.") and f.endswith(".gradtool-tmp")), f
            if f.endswith(".gradtool-tmp"):
                os.remove(tmp_path / f)
        if not existing and os.path.exists(out):
            os.remove(out)
    print(f"\n{KILL_POINTS} kill points (output existed: {existing}): {outcomes}")


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_full_disk_on_a_real_small_filesystem(big_dump, tmp_path, kind):
    """(On ext4 the output's blocks are reserved first, and that reservation fails: the writes then fail
    as on any full disk, and the temporary file, with whatever was reserved, is removed.)"""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if kind == "tmpfs":
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True)
    else:
        image = tmp_path / "ext4.img"
        with open(image, "wb") as f:
            f.truncate(8 << 20)
        r = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
        if r.returncode == 0:
            r = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small {kind} here (needs privileges, or loop devices)")
    for lost in ("lost+found",):  # (mkfs.ext4 makes one)
        if (mnt / lost).exists():
            os.rmdir(mnt / lost)
    try:
        before = sha(big_dump)
        r = subprocess.run(gradtool_cmd() + ["clip", big_dump, "-o", str(mnt / "out.npz"), "--mode", "global-norm",
                                             "--max", "1"], capture_output=True, text=True)
        assert r.returncode == 1
        assert "no space left" in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert os.listdir(mnt) == []  # neither output nor temp file
        assert sha(big_dump) == before
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_full_disk_patched_write(run, tmp_path, monkeypatch):
    src = str(tmp_path / "in.safetensors")
    save_dump(src, {"w": np.ones((100, 100), np.float32), "b": np.ones(10, np.float32)})
    import gradtool.io.safetensors as st

    real = st.SafetensorsWriter.add_chunks
    calls = {"n": 0}

    def failing(self, info, chunks):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, info, chunks)

    monkeypatch.setattr(st.SafetensorsWriter, "add_chunks", failing)
    outdir = tmp_path / "o"
    outdir.mkdir()
    r = run("clip", src, "-o", str(outdir / "x.safetensors"), "--mode", "norm", "--max", "1")
    assert r.exit_code == 1 and "no space left" in r.stderr
    assert os.listdir(outdir) == []


def test_two_runs_to_one_output_never_interleave(big_dump, tmp_path):
    out = str(tmp_path / "race.npz")
    cmds = [gradtool_cmd() + ["clip", big_dump, "-o", out, "--mode", "global-norm", "--max", m, "--force",
                              "--format", "json"] for m in ("1", "2")]
    expected = {}
    for m, c in zip(("1", "2"), cmds):
        subprocess.run(c, check=True, capture_output=True)
        expected[m] = sha(out)
    os.remove(out)
    for _ in range(3):
        procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in cmds]
        assert [p.wait() for p in procs] == [0, 0]
        assert sha(out) in expected.values()  # one whole result, never a mix
        os.remove(out)
    # without --force exactly one run claims the output; the other refuses (exit 2), whenever it notices
    no_force = [[x for x in c if x != "--force"] for c in cmds]
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in no_force]
    codes = sorted(p.wait() for p in procs)
    assert codes == [0, 2] and sha(out) in expected.values()
