"""Compare two revisions of gradtool's library code in ONE process, alternating them, to judge a change
on a noisy machine.

On a shared VM the same in-process `stats` of one file can take 75 ms in one hour and 105 ms in the
next, so whole-suite ratios (bench.py) cannot resolve a change worth 10 %. This script loads revision A
and revision B side by side as two packages (``gradtool_a``, ``gradtool_b``: the library imports itself
relatively), runs the same job with each in turns (A, B, B, A, A, B, ...), and prints medians, quartiles
and how many pairs B won. It is a development tool: not part of the test run, no timings in tests.

    python benchmarks/ab.py stats big.safetensors big.h5          # HEAD vs the working tree
    python benchmarks/ab.py --a HEAD~3 --b HEAD --pairs 60 stats big.npz
    python benchmarks/ab.py log run.jsonl                          # read a training log and analyse it
    python benchmarks/ab.py history run.h5 dumps/                  # stats of every step of a history
    python benchmarks/ab.py --pairs 10 clip big.safetensors        # clip --mode global-norm, no fsync
    python benchmarks/ab.py --max 1e9 clip big.safetensors         # ... a step that needs no clipping
    python benchmarks/ab.py --mode norm --max 0.5 clip big.npz     # ... per-tensor clip_by_norm

Both revisions use the compiled kernel and log readers built in this checkout; if their C sources differ
between them the script refuses (build each and compare with bench.py instead), unless told --c-added
(the change only adds C functions that revision A does not call).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_SOURCES = ("gradtool/core/_kernels.c", "gradtool/core/_kernels_loops.h", "gradtool/core/_kernels_summary.h",
                  "gradtool/io/_logscan.c", "gradtool/io/_logscan_pow10.h", "gradtool/io/_inflate_many.c")
BUILT = (("core", "_kernels"), ("io", "_logscan"), ("io", "_inflate_many"))  # the compiled modules copied into a revision's package
WORKTREE = "WORKTREE"


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", ROOT, *args], check=True, capture_output=True).stdout


def _source(rev: str, path: str) -> bytes | None:
    if rev == WORKTREE:
        full = os.path.join(ROOT, path)
        return open(full, "rb").read() if os.path.exists(full) else None
    try:
        return _git("show", f"{rev}:{path}")
    except subprocess.CalledProcessError:
        return None


def export(rev: str, into: str) -> str:
    """The ``gradtool`` package of ``rev`` (or of the working tree) copied into ``into``, with this
    checkout's compiled kernel and log readers; returns the package directory."""
    pkg = os.path.join(into, "gradtool")
    if rev == WORKTREE:
        shutil.copytree(os.path.join(ROOT, "gradtool"), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        archive = _git("archive", rev, "gradtool")
        subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
        for sub, module in BUILT:  # (the log readers' too: without them revision A ran the Python readers)
            built = os.path.join(ROOT, "gradtool", sub)
            for name in os.listdir(built):
                if name.startswith(module) and name.endswith((".so", ".pyd")):
                    shutil.copy2(os.path.join(built, name), os.path.join(pkg, sub, name))
    return pkg


def load(pkg: str, name: str) -> ModuleType:
    """Import the package at ``pkg`` under the top-level name ``name``."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(pkg, "__init__.py"),
                                                  submodule_search_locations=[pkg])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def job(kind: str, package: str, path: str, max_norm: float = 1e-3, mode: str = "global-norm") -> Callable[[], Any]:
    """One run of the job with the package imported as ``package``. A job may carry ``prepare``, run
    before each timed run and not timed."""
    if kind == "stats":
        dump = importlib.import_module(f"{package}.io.dump")
        summarize = importlib.import_module(f"{package}.summarize")

        def stats() -> Any:
            with dump.open_dump(path) as reader:
                return summarize.summarize_dump(reader)

        return stats
    if kind == "history":
        history = importlib.import_module(f"{package}.io.history")
        engine = importlib.import_module(f"{package}.engine")

        def stats_of_history() -> Any:
            refs = history.expand_inputs([path], resolve_steps=False)
            return [s.global_norm for s in engine.summarize_refs(refs)]

        return stats_of_history
    if kind == "clip":
        dump = importlib.import_module(f"{package}.io.dump")
        detect = importlib.import_module(f"{package}.io.detect")
        clipping = importlib.import_module(f"{package}.clip_dump")
        fmt = detect.detect_format(path)
        root, ext = os.path.splitext(path)
        out = f"{root}.ab-{package}{ext}"  # beside the input: the same disk

        def clip() -> Any:  # the output written as `gradtool clip` writes it: a compressed npz compressed
            with dump.open_dump(path) as reader, dump.make_writer(
                    out, fmt, reader.metadata, compress=fmt == "npz" and bool(getattr(reader, "compressed", False))) as writer:
                result = clipping.clip_dump(reader, writer, clipping.ClipSpec(mode, max=max_norm).validate())
            os.remove(out)
            return result.scale

        clip.prepare = os.sync  # type: ignore[attr-defined]  # the last run's writeback is not this run's cost
        return clip
    if kind == "log":
        logs = importlib.import_module(f"{package}.io.logs")
        suggest = importlib.import_module(f"{package}.suggest")

        def log() -> Any:
            history = logs.read_norm_log(path)
            columns = history.arrays()
            facts = suggest.analyze_history(*columns)
            return suggest.suggest_threshold(*columns, facts=facts).threshold

        return log
    raise SystemExit(f"unknown job {kind!r}")


def compare(run_a: Callable[[], Any], run_b: Callable[[], Any], pairs: int) -> tuple[list[float], list[float]]:
    """Seconds of each run, A and B in turns, the order swapped every pair (A B, B A, ...)."""
    times: dict[str, list[float]] = {"a": [], "b": []}
    runs = {"a": run_a, "b": run_b}
    for i in range(pairs):
        for which in ("a", "b") if i % 2 == 0 else ("b", "a"):
            prepare = getattr(runs[which], "prepare", None)
            if prepare is not None:
                prepare()
            t = time.perf_counter()
            runs[which]()
            times[which].append(time.perf_counter() - t)
    return times["a"], times["b"]


def quartiles(v: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(v, n=4)
    return q[0], statistics.median(v), q[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", default="HEAD", help="revision A (default HEAD)")
    ap.add_argument("--b", default=WORKTREE, help=f"revision B (default {WORKTREE}: the files as they are now)")
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--mode", default="global-norm", help="clip: the mode (default global-norm)")
    ap.add_argument("--max", type=float, default=1e-3, help="clip: the global-norm threshold (default 1e-3: "
                    "every tensor scaled; a large one clips nothing)")
    ap.add_argument("--c-added", action="store_true",
                    help="run both revisions with this checkout's build although their C sources differ: for a "
                    "change that only adds to the C (revision A never calls what is new)")
    ap.add_argument("kind", choices=["stats", "history", "clip", "log"])
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    for path in KERNEL_SOURCES:
        if _source(args.a, path) != _source(args.b, path) and not args.c_added:
            raise SystemExit(f"{path} differs between {args.a} and {args.b}: this script runs both revisions "
                             "with one build of the kernel; compare builds with benchmarks/bench.py instead")
    tmp = tempfile.mkdtemp(prefix="gradtool-ab-")
    try:
        packages = {}
        for label, rev in (("a", args.a), ("b", args.b)):
            os.makedirs(os.path.join(tmp, label))
            load(export(rev, os.path.join(tmp, label)), f"gradtool_{label}")
            packages[label] = f"gradtool_{label}"
        for path in args.paths:
            run_a, run_b = (job(args.kind, packages["a"], path, args.max, args.mode),
                          job(args.kind, packages["b"], path, args.max, args.mode))
            same = repr(run_a()) == repr(run_b())  # warm both; results compared where they print alike
            a, b = compare(run_a, run_b, args.pairs)
            wins = sum(y < x for x, y in zip(a, b))
            (qa1, ma, qa3), (qb1, mb, qb3) = quartiles(a), quartiles(b)
            print(f"{os.path.basename(path)} ({args.kind}, {args.pairs} pairs): "
                  f"A {args.a} median {ma * 1e3:.1f} ms [{qa1 * 1e3:.1f}, {qa3 * 1e3:.1f}]  "
                  f"B {args.b} median {mb * 1e3:.1f} ms [{qb1 * 1e3:.1f}, {qb3 * 1e3:.1f}]  "
                  f"B/A {mb / ma:.3f}; B faster in {wins}/{args.pairs} pairs"
                  + ("" if same else "  (results print differently)"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
