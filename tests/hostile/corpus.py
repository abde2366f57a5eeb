"""A corpus of bad inputs, generated (never committed as binaries): every way a dump or a log can be
broken or hostile that we know of. ``build_corpus(dir)`` writes them and returns their descriptions."""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
from dataclasses import dataclass

import h5py
import numpy as np

from gradtool import save_dump


@dataclass
class Bad:
    path: str
    what: str
    kind: str  # "dump" or "log"
    codes: tuple[int, ...] = (1,)  # acceptable exit codes


class Payload:
    """Unpickling this would create a file: proof that nothing was ever unpickled."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _good_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"layer/w": rng.standard_normal((64, 32)).astype(np.float32), "b": np.arange(10.0),
            "h": rng.standard_normal(50).astype(np.float16)}


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def _npy_bytes(header: dict, data: bytes = b"") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + data


def _safetensors(header: dict, data: bytes, raw_header: bytes | None = None) -> bytes:
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def build_corpus(d: str, marker: str) -> list[Bad]:
    out: list[Bad] = []
    good = _good_tensors()
    originals = {}
    for ext in ("npz", "h5", "safetensors"):
        p = os.path.join(d, f"good.{ext}")
        save_dump(p, good)
        originals[ext] = open(p, "rb").read()
    np.save(os.path.join(d, "good.npy"), good["layer/w"])
    originals["npy"] = open(os.path.join(d, "good.npy"), "rb").read()
    zc = os.path.join(d, "goodc.npz")
    np.savez_compressed(zc, **{k.replace("/", "_"): v for k, v in good.items()})
    originals["compressed.npz"] = open(zc, "rb").read()

    # truncations at many offsets, and bit flips, of every format
    for ext, data in originals.items():
        n = len(data)
        cuts = sorted({0, 1, 4, 7, 8, 9, 12, 16, 31, 64, 100, 128, 300, 511, 1000, n // 7, n // 3, n // 2,
                       2 * n // 3, n - 200, n - 64, n - 22, n - 1})
        for cut in cuts:
            if 0 <= cut < n:
                out.append(Bad(_write(os.path.join(d, f"trunc_{cut}.{ext}"), data[:cut]), f"{ext} truncated at {cut}", "dump"))
        rng = np.random.default_rng(len(data))
        for k, pos in enumerate(sorted(set(rng.integers(0, n, 12).tolist()))):
            flipped = bytearray(data)
            flipped[pos] ^= 1 << int(rng.integers(0, 8))
            out.append(Bad(_write(os.path.join(d, f"flip_{k}.{ext}"), bytes(flipped)), f"{ext} bit flip at {pos}",
                           "dump", (0, 1)))  # a flip inside the data is still a valid dump
    out.append(Bad(_write(os.path.join(d, "empty.npz"), b""), "zero-length file", "dump"))
    out.append(Bad(_write(os.path.join(d, "magic.h5"), b"\x89HDX\r\n\x1a\n" + b"\0" * 100), "wrong magic", "dump"))
    out.append(Bad(_write(os.path.join(d, "text.h5"), b"I am a text file, not HDF5\n" * 10), "text named .h5", "dump"))
    out.append(Bad(_write(os.path.join(d, "text.safetensors"), b"hello"), "text named .safetensors", "dump"))

    zp = os.path.join(d, "notnpz.npz")
    with zipfile.ZipFile(zp, "w") as z:
        z.writestr("readme.txt", "a zip, but no arrays")
        z.writestr("data.bin", b"\0" * 100)
    out.append(Bad(zp, "valid zip that is not an npz", "dump", (0, 1)))

    pk = os.path.join(d, "pickle.npz")
    np.savez(pk, ok=np.ones(3), evil=np.array([Payload(marker), Payload(marker)], dtype=object))
    out.append(Bad(pk, "npz member with a pickled object array", "dump"))
    pk1 = os.path.join(d, "pickle.npy")
    np.save(pk1, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    out.append(Bad(pk1, "npy with a pickled object array", "dump"))

    for name, header, data in (
        ("huge_shape.npy", {"descr": "<f8", "fortran_order": False, "shape": (10**12, 10**6)}, b"\0" * 64),
        ("neg_shape.npy", {"descr": "<f8", "fortran_order": False, "shape": (-5,)}, b""),
        ("bad_descr.npy", {"descr": "<q9", "fortran_order": False, "shape": (3,)}, b"\0" * 8),
        ("void.npy", {"descr": "|V16", "fortran_order": False, "shape": (2,)}, b"\0" * 32),
        ("string.npy", {"descr": "<U5", "fortran_order": False, "shape": (2,)}, b"\0" * 40),
        ("struct.npy", {"descr": [("a", "<f4"), ("b", "<i4")], "fortran_order": False, "shape": (2,)}, b"\0" * 16),
    ):
        out.append(Bad(_write(os.path.join(d, name), _npy_bytes(header, data)), name, "dump"))
    out.append(Bad(_write(os.path.join(d, "hostile_header.npy"),
                          b"\x93NUMPY\x01\x00" + struct.pack("<H", 60) + b"{'descr': __import__('os').system('x')}   \n"),
                   "npy header with code", "dump"))
    zb = os.path.join(d, "bomb.npz")
    with zipfile.ZipFile(zb, "w") as z:
        z.writestr("x.npy", _npy_bytes({"descr": "<f4", "fortran_order": False, "shape": (10**11,)}, b"\0" * 16))
    out.append(Bad(zb, "npz member claiming a huge shape", "dump"))
    zb2 = os.path.join(d, "bomb2.npz")
    with zipfile.ZipFile(zb2, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", _npy_bytes({"descr": "<f4", "fortran_order": False, "shape": (25_000_000,)}, b"\0" * 100_000_000))
    out.append(Bad(zb2, "deflate bomb: 100 MB of zeros (a real tensor, must not hang or blow memory)", "dump", (0, 1)))

    # names: path traversal, NUL, control characters, 10 kB, duplicates
    def st_names(name: str, fname: str, what: str) -> None:
        hdr = {name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
        out.append(Bad(_write(os.path.join(d, fname), _safetensors(hdr, b"\0" * 4)), what, "dump"))

    st_names("../../etc/passwd", "dotdot.safetensors", "name with ..")
    st_names("/abs/name", "abs.safetensors", "absolute name")
    st_names("nul\x00byte", "nul.safetensors", "NUL in name")
    st_names("bell\x07\x1b[2J", "ctrl.safetensors", "control characters in name")
    st_names("x" * 10_000, "long.safetensors", "10 kB name")
    dup = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    out.append(Bad(_write(os.path.join(d, "dup.safetensors"), _safetensors({}, b"\0" * 8, dup)), "duplicate names", "dump"))
    zd = os.path.join(d, "dup.npz")
    with zipfile.ZipFile(zd, "w") as z:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            z.writestr("a.npy", _npy_bytes({"descr": "<f4", "fortran_order": False, "shape": (1,)}, b"\0" * 4))
            z.writestr("a.npy", _npy_bytes({"descr": "<f4", "fortran_order": False, "shape": (1,)}, b"\0" * 4))
    out.append(Bad(zd, "duplicate npz members", "dump"))
    zt = os.path.join(d, "traverse.npz")
    with zipfile.ZipFile(zt, "w") as z:
        z.writestr("../../evil.npy", _npy_bytes({"descr": "<f4", "fortran_order": False, "shape": (1,)}, b"\0" * 4))
    out.append(Bad(zt, "npz member name with ..", "dump"))

    # safetensors offsets
    for fname, hdr, data, what in (
        ("overlap.safetensors", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                 "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "overlapping offsets"),
        ("range.safetensors", {"a": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}, b"\0" * 8, "offsets past the end"),
        ("mismatch.safetensors", {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "offsets vs shape"),
        ("negative.safetensors", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, b"\0" * 8, "negative offset"),
        ("dtype.safetensors", {"a": {"dtype": "C128", "shape": [1], "data_offsets": [0, 16]}}, b"\0" * 16, "unknown dtype"),
        ("hugeshape.safetensors", {"a": {"dtype": "F64", "shape": [2**40, 2**30], "data_offsets": [0, 8]}}, b"\0" * 8, "huge shape"),
        ("notobj.safetensors", [1, 2, 3], b"", "header not an object"),
        ("meta.safetensors", {"__metadata__": [1], "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "bad metadata"),
    ):
        out.append(Bad(_write(os.path.join(d, fname), _safetensors(hdr, data)), what, "dump"))
    out.append(Bad(_write(os.path.join(d, "hugehdr.safetensors"), struct.pack("<Q", 2**62) + b"{}"), "header length 2^62", "dump"))
    deep = b"[" * 100_000 + b"]" * 100_000
    out.append(Bad(_write(os.path.join(d, "deep.safetensors"), _safetensors({}, b"", b'{"a":' + deep + b"}")),
                   "deeply nested JSON header", "dump"))

    # HDF5: links, cycles, non-numeric and null datasets
    hp = os.path.join(d, "links.h5")
    with h5py.File(hp, "w") as f:
        f["data"] = np.arange(4.0)
        f["soft"] = h5py.SoftLink("/nowhere")
        g = f.create_group("loop")
        g["back"] = f["loop"]  # a hard-link cycle
        g["up"] = h5py.SoftLink("/loop")
    out.append(Bad(hp, "HDF5 with soft links and a group cycle", "dump", (0,)))
    hx = os.path.join(d, "external_link.h5")
    with h5py.File(hx, "w") as f:
        f["data"] = np.arange(4.0)
        f["model/ext"] = h5py.ExternalLink("/etc/passwd", "/x")
    out.append(Bad(hx, "HDF5 external link (a tensor in another file)", "dump"))
    secret = _write(os.path.join(d, "private.bin"), b"PRIVATE KEY " * 100)
    he = os.path.join(d, "external_storage.h5")
    with h5py.File(he, "w") as f:  # raw external storage: its bytes would be read as the tensor
        f.create_dataset("w", shape=(300,), dtype="f4", external=[(secret, 0, 1200)])
    out.append(Bad(he, "HDF5 dataset whose data is another file's bytes (external storage)", "dump"))
    src = os.path.join(d, "source.h5")
    with h5py.File(src, "w") as f:
        f["a"] = np.arange(10.0)
    layout = h5py.VirtualLayout(shape=(10,), dtype="f8")
    layout[:] = h5py.VirtualSource(src, "a", shape=(10,))
    hv = os.path.join(d, "virtual.h5")
    with h5py.File(hv, "w") as f:  # a virtual dataset: data from another file, fill values if it is gone
        f.create_virtual_dataset("v", layout, fillvalue=0)
    out.append(Bad(hv, "HDF5 virtual dataset mapped from another file", "dump"))
    hs = os.path.join(d, "strings.h5")
    with h5py.File(hs, "w") as f:
        f["names"] = np.array([b"a", b"b"])
    out.append(Bad(hs, "HDF5 dataset of strings", "dump"))
    hn = os.path.join(d, "null.h5")
    with h5py.File(hn, "w") as f:
        f.create_dataset("empty", data=h5py.Empty("f4"))
    out.append(Bad(hn, "HDF5 null dataspace", "dump"))

    # logs
    for fname, text, what in (
        ("empty.log", "", "empty log"),
        ("garbage.log", "\x00\x01 not a log at all \xff" * 20, "binary garbage"),
        ("garbage_lines.jsonl", "{\"step\": 1, \"grad_norm\": \n}}}\n[[[\nnull\n", "garbage JSON lines"),
        ("nan_only.json", json.dumps({"log_history": [{"step": i, "grad_norm": float("nan")} for i in range(50)]}),
         "NaN-only trainer_state"),
        ("inf_only.csv", "step,grad_norm\n" + "".join(f"{i},inf\n" for i in range(50)), "Inf-only CSV"),
        ("nonorm.csv", "step,loss\n1,2\n2,3\n", "CSV without a norm column"),
        ("badjson.json", "{\"log_history\": [", "truncated JSON"),
        ("notlist.json", "{\"log_history\": 5}", "log_history not a list"),
        ("deep.json", "[" * 100_000 + "]" * 100_000, "deeply nested JSON log"),
        ("header_only.tsv", "step\tgrad_norm\n", "header-only TSV"),
    ):
        p = os.path.join(d, fname)
        with open(p, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        out.append(Bad(p, what, "log"))
    return out
