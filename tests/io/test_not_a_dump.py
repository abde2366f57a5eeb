"""Files that are no gradient dump but get handed to gradtool as one, named for what they are.

Before, a PyTorch ``torch.save`` file (a zip, so "npz" by its magic bytes) was read as a dump of no
tensors: ``stats`` printed "global norm 0", ``suggest-threshold`` saw zero-norm steps and ``clip`` wrote an
empty dump, all with exit 0. Pickles and compressed files were "unrecognised content"."""

import bz2
import gzip
import io
import lzma
import os
import pickle
import zipfile

import numpy as np
import pytest

from gradtool import open_dump, save_dump
from gradtool.errors import InputError
from gradtool.io.detect import compression, is_pickle, not_a_dump


class Boom:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))  # would create a file if ever unpickled


TORCH_LEGACY_MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)  # what torch.save < 1.6 starts with


def _torch_zip(path, marker):
    """A file laid out as ``torch.save`` (>= 1.6) writes one: ``NAME/data.pkl`` and its storages."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("g/data.pkl", pickle.dumps({"w": Boom(str(marker))}, protocol=2))
        z.writestr("g/.format_version", "1")
        z.writestr("g/byteorder", "little")
        z.writestr("g/data/0", np.ones(12, np.float32).tobytes())
        z.writestr("g/version", "3\n")


def _torch_legacy(path, marker):
    with open(path, "wb") as f:
        f.write(TORCH_LEGACY_MAGIC + pickle.dumps({"w": Boom(str(marker))}, protocol=2))


def _plain_pickle(path, marker):
    with open(path, "wb") as f:
        pickle.dump({"w": Boom(str(marker))}, f, protocol=4)


def _zip_of_pickles(path, marker):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("model/constants.pkl", pickle.dumps(Boom(str(marker))))


@pytest.mark.parametrize("make, name, message", [
    (_torch_zip, "g.pt", "is a PyTorch torch.save file (a zip of pickled tensors); gradtool never loads pickles"),
    (_torch_legacy, "g_legacy.pt", "is a PyTorch torch.save file (a pickle); gradtool never loads pickles"),
    (_plain_pickle, "grads.pkl", "is a Python pickle; gradtool never loads pickles"),
    (_zip_of_pickles, "scripted.pt", "is a zip of pickles (PyTorch?), not an .npz dump"),
])
def test_pickles_are_named_never_loaded_and_never_read_as_empty_dumps(run, tmp_path, make, name, message):
    marker = tmp_path / "pwned"
    p = str(tmp_path / name)
    make(p, marker)
    before = open(p, "rb").read()
    with pytest.raises(InputError, match="never loads pickles"):
        open_dump(p)
    out = str(tmp_path / "out.npz")
    for args in (["stats", p], ["stats", p, "--format", "json"], ["suggest-threshold", p],
                 ["clip", p, "-o", out, "--mode", "norm", "--max", "1"]):
        r = run(*args)
        assert r.exit_code == 1 and r.stdout == "", (args, r.stdout)
        assert r.stderr.startswith(f"gradtool: error: {p}: "), (args, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
        if args[0] != "suggest-threshold" or make in (_torch_zip, _zip_of_pickles):
            assert message in r.stderr, (args, r.stderr)
        else:  # a pickle is no dump by its first bytes, so suggest-threshold read it as a log
            assert "is a Python pickle, not a training log; gradtool never loads pickles" in r.stderr
    assert not os.path.exists(out) and not marker.exists()
    assert open(p, "rb").read() == before


def test_a_directory_of_torch_files_is_refused_naming_the_first(run, tmp_path):
    """A directory of .pt files used to be a history of zero-norm steps (suggest-threshold: "zero norms
    at every step")."""
    d = tmp_path / "grads"
    d.mkdir()
    for s in (100, 200):
        _torch_zip(str(d / f"step_{s}.pt"), tmp_path / "pwned")
    for cmd in ("stats", "suggest-threshold"):
        r = run(cmd, str(d))
        assert r.exit_code == 1 and f"{d / 'step_100.pt'}: is a PyTorch torch.save file" in r.stderr, r.stderr


def test_a_zip_that_holds_no_npy_member_is_not_an_empty_dump(run, tmp_path):
    p = str(tmp_path / "notes.zip")
    with zipfile.ZipFile(p, "w") as z:
        for n in ("a.txt", "b/c.csv", "d.json", "e.md"):
            z.writestr(n, "x")
    r = run("stats", p)
    assert r.exit_code == 1 and r.stderr == (
        f"gradtool: error: {p}: is a zip archive with no .npy member (4 other: 'a.txt', 'b/c.csv', 'd.json', ...),"
        " not an .npz dump\n")


def test_an_empty_npz_and_foreign_members_beside_tensors_are_still_dumps(tmp_path):
    """What NumPy itself reads stays readable: ``np.savez(p)`` with no arrays is a dump of no tensors,
    and members other than ``.npy`` beside tensors are ignored, as ``np.load`` ignores them."""
    empty = str(tmp_path / "empty.npz")
    np.savez(empty)
    with open_dump(empty) as r:
        assert r.names == []
    mixed = str(tmp_path / "mixed.npz")
    save_dump(mixed, {"w": np.arange(3.0)})
    with zipfile.ZipFile(mixed, "a") as z:
        z.writestr("README.txt", "notes")
    with open_dump(mixed) as r:
        assert r.names == ["w"] and r.read("w").tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("size, kind", [(2, "bfloat16"), (1, "float8")])
def test_bfloat16_saved_by_numpy_says_how_to_save_it(run, tmp_path, size, kind):
    # np.savez of a JAX (ml_dtypes) bfloat16 array writes '<V2': raw bytes, the type lost. It was
    # "unsupported dtype '|V2' (not a numeric tensor)", which told a JAX user nothing
    p = str(tmp_path / "grads.npz")
    np.savez(p, w=np.zeros(3, f"V{size}"))
    r = run("stats", p)
    assert r.exit_code == 1 and r.stderr.count("\n") == 1
    assert f"unsupported dtype '|V{size}' (raw {size}-byte values, as NumPy saves a {kind} array" in r.stderr
    assert "np.asarray(g, np.float32)" in r.stderr and "safetensors.numpy.save_file" in r.stderr
    np.savez(p, w=np.zeros(3, "V4"))  # no such array type: the plain message
    assert "unsupported dtype '|V4' (not a numeric tensor)" in run("stats", p).stderr


COMPRESSORS = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress}


@pytest.mark.parametrize("comp", sorted(COMPRESSORS))
def test_a_compressed_dump_says_how_to_read_it(run, tmp_path, comp):
    src = str(tmp_path / "step.npz")
    save_dump(src, {"w": np.ones(4, np.float32)})
    p = str(tmp_path / "step.npz.x")
    with open(p, "wb") as f:
        f.write(COMPRESSORS[comp](open(src, "rb").read()))
    cmd = {"gzip": "gzip -dc", "bzip2": "bzip2 -dc", "xz": "xz -dc"}[comp]
    for args in (["stats", p], ["clip", p, "--dry-run", "--mode", "norm", "--max", "1"]):
        r = run(*args)
        assert r.exit_code == 1 and r.stderr == (
            f"gradtool: error: {p}: is {comp}-compressed; decompress it first, or pipe it in: "
            f"{cmd} {p} | gradtool ... -\n"), r.stderr
    r = run("suggest-threshold", p)  # no dump by its first bytes, so read as a (compressed) log
    assert r.exit_code == 1 and f"{p}: is a {comp}-compressed gradient dump; decompress it first" in r.stderr
    r = run("stats", "-", input=open(p, "rb").read())
    assert r.exit_code == 1 and r.stderr == f"gradtool: error: <stdin>: is {comp}-compressed; decompress it first\n"


@pytest.mark.parametrize("comp", sorted(COMPRESSORS))
def test_a_directory_of_compressed_dumps_says_what_it_holds(run, tmp_path, comp):
    """It said only "directory holds no gradient dumps", about a directory full of them (compressed)."""
    d = tmp_path / "dumps"
    d.mkdir()
    for s in range(3):
        buf = io.BytesIO()
        np.savez(buf, w=np.full(4, s, np.float32))
        (d / f"step_{s}.npz.z").write_bytes(COMPRESSORS[comp](buf.getvalue()))
    tool = {"gzip": "gzip", "bzip2": "bzip2", "xz": "xz"}[comp]
    hint = (f"; it holds {comp}-compressed files (step_0.npz.z, step_1.npz.z, ...): decompress them first "
            f"({tool} -dk {d}/*)\n")
    for args in (["stats", str(d)], ["suggest-threshold", str(d)]):
        r = run(*args)
        assert r.exit_code == 1 and r.stderr.startswith(f"gradtool: error: {d}: directory holds no ")
        assert r.stderr.endswith(hint), r.stderr
    logs = tmp_path / "logs"  # compressed logs are no compressed dumps: no advice to decompress them
    logs.mkdir()
    (logs / "metrics.csv.gz").write_bytes(gzip.compress(b"step,grad_norm\n1,2.0\n"))
    r = run("suggest-threshold", str(logs))
    assert r.exit_code == 1 and r.stderr.endswith("MLflow, Trackio, W&B or DVCLive runs\n"), r.stderr


def test_a_directory_of_pickles_says_so(run, tmp_path):
    d = tmp_path / "grads"
    d.mkdir()
    for s in range(2):
        (d / f"g{s}.pt").write_bytes(pickle.dumps({"w": [1.0, 2.0]}, protocol=2))
    r = run("stats", str(d))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1
    assert ("directory holds no gradient dumps (.npz .npy .h5 .safetensors); it holds pickles (g0.pt, "
            "g1.pt): gradtool never loads pickles") in r.stderr


def test_sniffers_against_the_real_libraries():
    """The magic numbers, checked against what the standard library writes (and does not write)."""
    for comp, f in COMPRESSORS.items():
        assert compression(f(b"step,grad_norm\n")[:16]) == comp
    assert compression(b"BZh is a word") is None and compression(b"step,loss\n") is None
    for proto in (2, 3, 4, 5):
        assert is_pickle(pickle.dumps({"a": 1}, protocol=proto))
    assert not is_pickle(pickle.dumps({"a": 1}, protocol=0))  # protocols 0 and 1 have no PROTO opcode
    buf = io.BytesIO()
    np.save(buf, np.ones(2))
    assert not is_pickle(buf.getvalue()) and compression(buf.getvalue()) is None
    assert not_a_dump(b"\x01\x02hello", "x.safetensors").startswith("does not look like a safetensors file (")
    assert not_a_dump(b"\xff\x00\x13", "notes").startswith("is not a gradient dump (unrecognised content")
    text = "step,grad_norm\n1,2.5 — ünïcode".encode()
    for cut in range(1, len(text) + 1):  # text cut anywhere, in a character too, is text
        assert not_a_dump(text[:cut], "log").startswith("is not a gradient dump but text (a training log? "
                                                        "suggest-threshold reads those"), cut
    assert "but text" not in not_a_dump(b"\xc3\x28 invalid", "x")


def test_real_torch_save_files_when_torch_is_installed(run, tmp_path):
    torch = pytest.importorskip("torch")
    for name, kw in (("new.pt", {}), ("old.pt", {"_use_new_zipfile_serialization": False})):
        p = str(tmp_path / name)
        torch.save({"w": torch.ones(3, 4)}, p, **kw)
        r = run("stats", p)
        assert r.exit_code == 1 and "is a PyTorch torch.save file" in r.stderr, r.stderr


def test_a_training_log_given_to_stats_or_clip_points_to_suggest_threshold(run, tmp_path):
    p = tmp_path / "trainer_state.json"
    p.write_text('{"log_history": [{"step": 1, "grad_norm": 1.5}]}')
    for args in (["stats", str(p)], ["clip", str(p), "--dry-run", "--mode", "norm", "--max", "1"]):
        r = run(*args)
        assert r.exit_code == 1 and r.stderr == (
            f"gradtool: error: {p}: is not a gradient dump but text (a training log? suggest-threshold reads "
            "those; dumps are .npz .npy .h5 .safetensors)\n"), r.stderr
    r = run("stats", "-", input=b"step,grad_norm\n1,2.0\n")
    assert r.exit_code == 1 and "<stdin>: is not a gradient dump but text (a training log?" in r.stderr


def test_a_directory_of_training_logs_given_to_stats_points_to_suggest_threshold(run, tmp_path):
    """`gradtool stats wandb/` (or mlruns/, a Trainer's output/) said only "holds no gradient dumps"."""
    import sqlite3

    cases = {}
    out = tmp_path / "output"
    (out / "checkpoint-5").mkdir(parents=True)
    (out / "checkpoint-5" / "trainer_state.json").write_text('{"log_history": []}')
    cases[out] = "trainer_state.json"
    wb = tmp_path / "wandb"
    (wb / "run-20261124_101010-abc").mkdir(parents=True)
    (wb / "run-20261124_101010-abc" / "run-abc.wandb").write_bytes(b":W&B\xe1\xbe\x00")
    cases[wb] = "W&B runs"
    ml = tmp_path / "mlruns"
    (ml / "0" / "r1" / "metrics").mkdir(parents=True)
    (ml / "0" / "r1" / "meta.yaml").write_text("run_id: r1\nlifecycle_stage: active\n")
    cases[ml] = "MLflow runs"
    db = tmp_path / "proj"
    db.mkdir()
    con = sqlite3.connect(db / "mlflow.db")
    con.executescript("CREATE TABLE runs (run_uuid); CREATE TABLE metrics (key, value, step, run_uuid);")
    con.close()
    cases[db] = "mlflow.db"
    tb = tmp_path / "runs"
    (tb / "Nov24").mkdir(parents=True)
    (tb / "Nov24" / "events.out.tfevents.1.host").write_bytes(b"x")
    cases[tb] = "TensorBoard event files"
    for d, what in cases.items():
        r = run("stats", str(d))
        assert r.exit_code == 1 and r.stderr == (
            f"gradtool: error: {d}: directory holds no gradient dumps (.npz .npy .h5 .safetensors); it holds "
            f"training logs ({what}): suggest-threshold reads them\n"), r.stderr
