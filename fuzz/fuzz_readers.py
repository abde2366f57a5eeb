#!/usr/bin/env python3
"""Fuzz the dump readers and the log parsers for a bounded time. Not part of the default test run.

    python fuzz/fuzz_readers.py --seconds 120          # seeded random mutation, any machine
    python fuzz/fuzz_readers.py --seconds 120 --atheris   # coverage-guided, if `pip install atheris`

Inputs are valid files (every format, and logs) mutated by truncation, bit flips, byte splices and
random header edits. The property: reading a file (open, index, every tensor whole and in chunks, its statistics) either
succeeds or raises GradtoolError; anything else (IndexError, RecursionError, MemoryError, a segfault,
a hang) is a bug. Each crasher is saved to tests/hostile/crashers/ and replayed by
tests/hostile/test_crashers.py from then on.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys
import tempfile
import time
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRASHERS = os.path.join(ROOT, "tests", "hostile", "crashers")
sys.path.insert(0, ROOT)


def seeds(tmp: str) -> list[tuple[str, bytes]]:
    import gradtool

    rng = np.random.default_rng(0)
    t = {"w": rng.standard_normal((16, 8)).astype(np.float32), "b/x": np.arange(5.0), "h": np.ones(3, np.float16)}
    out = []
    for ext in ("npz", "h5", "safetensors"):
        p = os.path.join(tmp, f"seed.{ext}")
        gradtool.save_dump(p, t, {"step": 3})
        out.append((ext, open(p, "rb").read()))
    import h5py  # gzip datasets as h5py writes them: read from their headers and chunk B-trees (h5header)

    p = os.path.join(tmp, "seed_gzip.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("one", data=t["w"], compression="gzip")
        f.create_dataset("g/two", data=rng.standard_normal((40, 100)).astype(np.float32), chunks=(20, 100),
                         compression="gzip", shuffle=True)
        f.create_dataset("half", data=np.ones(300, np.float16), compression="gzip", compression_opts=9)
    out.append(("h5", open(p, "rb").read()))
    p = os.path.join(tmp, "seed_deflated.npz")  # deflated members: the streaming inflate path
    np.savez_compressed(p, w=t["w"], x=np.arange(5000.0))
    out.append(("npz", open(p, "rb").read()))
    buf = io.BytesIO()
    np.save(buf, t["w"])
    out.append(("npy", buf.getvalue()))
    out.append(("json", b'{"log_history": [{"step": 1, "grad_norm": 1.5, "loss": 2.0}, {"step": 2, "grad_norm": NaN}]}'))
    out.append(("csv", b"step,loss,grad_norm\n1,2.0,1.5\n2,1.9,1.4\n"))
    out.append(("csv", (  # Lightning's metrics.csv: per-parameter norms, empty cells, validation rows
        "epoch,step,train_loss,grad_2.0_norm_total,grad_2.0_norm/w,grad_2.0_norm/b,val_loss\n"
        + "".join(f"0,{s},2.{s},1.{s},0.{s},nan,\n" + (f"0,{s},,,,,1.9\n" if s % 3 == 2 else "")
                  for s in range(8))).encode()))
    out.append(("jsonl", b'{"step": 1, "gnorm": 1.0}\n{"step": 2, "gnorm": 2.0}\n'))
    norms = ["NaN", "1.5", '"Infinity"', "-0.0"]  # the compiled reader's columns: NaN tokens and words
    rows = [f'{{"train/loss":{2 + 1 / i},"train/grad_norm":{norms[i % 4]},"train/global_step":{i}}}\n'
            + ('{"eval/loss": 1e-3, "train/global_step": %d}\n' % i if i % 9 == 0 else "") for i in range(1, 30)]
    out.append(("jsonl", "".join(rows).encode()))
    out.append(("log", b"iteration 10/100 | lm loss: 2.0 | grad norm: 1.25 |\n"))
    megatron = "".join(f" iteration {i:8d}/     100 | learning rate: 1.000E-04 | lm loss: {2 + 1 / i:.6E} "
                       f"| loss scale: 1.0 | grad norm: {1 + i / 8:.3f} |\n" for i in range(1, 40))
    out.append(("log", megatron.encode()))  # read by a line template
    from tests import tensorboard_encoder as enc  # TensorBoard events: framing, CRCs, protobuf, purges

    out.append(("tfevents", b"".join(enc.record(e) for e in [
        enc.file_version_event(), enc.summary_event(1, [enc.scalar_value("train/grad_norm", 1.5)]),
        enc.summary_event(2, [enc.scalar_value("train/grad_norm", 2.5), enc.histogram_value("w")]),
        enc.session_log_event(2, 1), enc.summary_event(2, [enc.scalar_value("train/grad_norm", 3.5)])])))
    out.append(("tfevents", b"".join(enc.record(e) for e in [  # TensorFlow 2's scalars: tensors, metadata
        enc.file_version_event()] + [enc.summary_event(s, [enc.tensor_value(
            "epoch_loss", enc.tensor_proto(1, [1.5 + s], [], content=s % 2 == 0),
            "scalars" if s < 3 else None)]) for s in range(6)]
        + [enc.summary_event(6, [enc.tensor_value("t", enc.tensor_proto(9, [7], []))])])))
    import pathlib

    from tests.wandb_encoder import history, other_record, run_record, write_log  # W&B: both readers

    p = pathlib.Path(tmp, "seed.wandb")
    write_log(p, [run_record("r", 1), other_record(100)]
              + [history(i, i, {"train/grad_norm": 1.5 + i, "train/loss": "NaN" if i == 3 else 2.0,
                                "train/global_step": 10 * i, "img": {"_type": "image"}}) for i in range(400)])
    out.append(("wandb", p.read_bytes()))
    out.append(("log", megatron.replace("\n", "\r\n").upper().encode()))  # CRLF and capitals
    blocks = " \u258f\u258e\u258d\u258c\u258b\u258a\u2589\u2588"
    for bar in (lambda i: ("\u2588" * (i // 8) + blocks[i % 8]).ljust(10)[:10],  # tqdm: its bar's cells free
                lambda i: ("#" * (i // 8) + (str(i % 8) if i % 8 else "")).ljust(10)[:10]):  # ascii=True
        out.append(("log", "".join(f"\rEpoch 0: {i:3d}%|{bar(i)}| {i}/80 [00:0{i % 10}<12:34,  9.87it/s, "
                                   f"loss={2.5 - i / 100:.3f}, grad_norm={1 + i / 50:.3f}]" for i in range(80)
                                   ).encode() + b"\n"))
    from tests.suggest.test_mlflow import T0, hf_metrics, sql_store  # SQLite: rows by C or by sqlite3
    from tests.suggest.test_trackio import _points, trackio_project

    p = pathlib.Path(tmp, "mlflow.db")
    sql_store(p, [("r1", "one", T0, "active", hf_metrics(40))])
    out.append(("db", p.read_bytes()))
    p = pathlib.Path(tmp, "trackio.db")
    trackio_project(p, [("r1", "one", "2026-01-01T00:00:00+00:00", _points(40), 0)])
    out.append(("db", p.read_bytes()))
    return out


def resealed(data: bytes) -> bytes:
    """A W&B log with every record's CRC made right again: a mutation then reaches the protobuf readers
    instead of stopping at the CRC check."""
    import struct
    import zlib

    b = bytearray(data)
    for start in range(0, len(b), 32768):
        at = 7 if start == 0 else 0
        while 32768 - at >= 7 and start + at + 7 <= len(b):
            length, kind = struct.unpack_from("<HB", b, start + at + 4)
            if kind not in (1, 2, 3, 4) or at + 7 + length > 32768:
                break
            body = bytes(b[start + at + 7:start + at + 7 + length])
            struct.pack_into("<I", b, start + at, zlib.crc32(body, zlib.crc32(bytes([kind]))))
            at += 7 + length
    return bytes(b)


def resealed_tfrecords(data: bytes) -> bytes:
    """A TensorBoard event file with every record's two CRCs made right again (as resealed does for W&B)."""
    import struct

    from tests.tensorboard_encoder import masked_crc32c

    b, pos = bytearray(data), 0
    while pos + 16 <= len(b):
        (length,) = struct.unpack_from("<Q", b, pos)
        if pos + 16 + length > len(b):
            break
        struct.pack_into("<I", b, pos + 8, masked_crc32c(bytes(b[pos:pos + 8])))
        struct.pack_into("<I", b, pos + 12 + length, masked_crc32c(bytes(b[pos + 12:pos + 12 + length])))
        pos += 16 + length
    return bytes(b)


def read_both_ways(p: str) -> None:
    """A log read with the compiled log readers (gradtool/io/_logscan.c) and with the Python ones (the
    loader switched off) must give the same history or the same error."""
    from gradtool.errors import GradtoolError
    from gradtool.io import compiled
    from gradtool.io.logs import read_norm_log

    got = []
    saved = compiled.log_readers
    for on in (True, False):
        compiled.log_readers = saved if on else (lambda: None)
        try:
            h = read_norm_log(p)
            got.append((h.steps, repr(h.norms), repr(h.loss), repr(h.lr), h.key, h.notes))
        except GradtoolError as exc:
            got.append(str(exc))
        finally:
            compiled.log_readers = saved
    if got[0] != got[1]:
        raise AssertionError(f"the compiled readers read {got[0]!r:.300}, the Python ones {got[1]!r:.300}")


def clip_into(p: str, ext: str, tmp: str) -> None:
    """``clip --mode global-norm`` of the dump into a new file of its format (small tensors a run at a
    time: read past the headers between them, or inflated together, and written whole)."""
    from gradtool.clip_dump import ClipSpec, clip_dump
    from gradtool.io.dump import make_writer, open_dump

    out = os.path.join(tmp, f"clipped.{ext}")
    if os.path.exists(out):
        os.unlink(out)
    with open_dump(p) as r:
        fmt = {"h5": "hdf5"}.get(ext, ext)
        with make_writer(out, fmt, r.metadata, compress=bool(getattr(r, "compressed", False)) and ext == "npz") as w:
            clip_dump(r, w, ClipSpec(mode="global-norm", max=1e-3))


def check(data: bytes, ext: str, tmp: str) -> None:
    """Raise (and so report) anything that is not a clean GradtoolError."""
    from gradtool.errors import GradtoolError

    p = os.path.join(tmp, f"input.{ext}")
    if ext == "wandb":
        data = resealed(data)
    elif ext == "tfevents" and zlib.crc32(data) & 1:  # half of them: the CRC checks see the rest
        data = resealed_tfrecords(data)
    with open(p, "wb") as f:
        f.write(data)
    try:
        if ext in ("json", "csv", "jsonl", "log", "tfevents", "wandb", "db"):
            read_both_ways(p)
        else:
            from gradtool.io.dump import open_dump
            from gradtool.summarize import summarize_dump

            with open_dump(p) as r:
                summarize_dump(r)
                for name in r.names:
                    r.read(name)
                for info in r.tensors:  # streamed reads too (clip's path): a deflated member's InflateStream
                    for _ in r.iter_chunks(info, 1000):
                        pass
            clip_into(p, ext, tmp)
    except GradtoolError:
        pass


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 4))
        if op == 0 and b:
            del b[int(rng.integers(0, len(b))):]
        elif op == 1 and b:
            i = int(rng.integers(0, len(b)))
            b[i] ^= 1 << int(rng.integers(0, 8))
        elif op == 2 and b:
            i = int(rng.integers(0, len(b)))
            b[i:i] = rng.integers(0, 256, int(rng.integers(1, 16)), dtype=np.uint8).tobytes()
        elif b:
            i = int(rng.integers(0, len(b)))
            b[i] = int(rng.choice([0, 0xFF, ord("{"), ord("9"), ord("-"), ord("."), ord('"')]))
    return bytes(b)


def save_crasher(data: bytes, ext: str, exc: BaseException) -> str:
    os.makedirs(CRASHERS, exist_ok=True)
    name = f"{hashlib.sha256(data).hexdigest()[:16]}.{ext}"
    with open(os.path.join(CRASHERS, name), "wb") as f:
        f.write(data)
    with open(os.path.join(CRASHERS, name + ".txt"), "w") as f:
        f.write(f"{type(exc).__name__}: {exc}\n")
    return name


def run_random(seconds: float, seed: int) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    execs = crashes = 0
    with tempfile.TemporaryDirectory() as tmp:
        corpus = seeds(tmp)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ext, data = corpus[int(rng.integers(0, len(corpus)))]
            m = mutate(data, rng)
            try:
                check(m, ext, tmp)
            except Exception as exc:  # noqa: BLE001 - that is the point
                crashes += 1
                print(f"CRASH {type(exc).__name__}: {exc} -> {save_crasher(m, ext, exc)}", flush=True)
            execs += 1
    return execs, crashes


def run_atheris(seconds: float) -> None:  # pragma: no cover - optional
    import atheris

    tmp = tempfile.mkdtemp()
    corpus = seeds(tmp)

    def one(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        ext, seed = corpus[fdp.ConsumeIntInRange(0, len(corpus) - 1)]
        check(mutate(seed, np.random.default_rng(fdp.ConsumeUInt(4))), ext, tmp)

    atheris.Setup([sys.argv[0], f"-max_total_time={int(seconds)}"], one)
    atheris.Fuzz()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--atheris", action="store_true")
    args = ap.parse_args()
    if args.atheris:
        run_atheris(args.seconds)
        return
    execs, crashes = run_random(args.seconds, args.seed)
    print(f"{execs} executions in {args.seconds:.0f} s (seed {args.seed}), {crashes} crashes")
    sys.exit(1 if crashes else 0)


if __name__ == "__main__":
    main()
