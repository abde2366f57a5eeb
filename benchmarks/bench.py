#!/usr/bin/env python3
"""gradtool's benchmark suite: ratios against baselines measured in the same run. Not a test.

    python benchmarks/bench.py            # full size (GPT-2-small-shaped dump, ~500 MB per format)
    python benchmarks/bench.py --quick    # a tenth of the size, for a smoke run
    python benchmarks/bench.py --logs-only  # suggest-threshold on each kind of log, with and without
                                            # the compiled readers (a few minutes)

Builds its workloads in a temporary directory, warms the page cache, and measures gradtool (as a user
runs it: the installed CLI in a subprocess, and the library in-process) next to its baselines: a raw
read of the same file into a reused 1 MiB buffer, `cp`, NumPy's own loaders, and PyTorch's
`get_total_norm(foreach=True)` when torch is installed. Prints a Markdown table of ratios and peak RSS.
Figures are medians of a few repetitions; the machine is shared, so re-run before relying on one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable

import numpy as np

GPT2_LAYERS = 12
D, V, CTX = 768, 50257, 1024


def gpt2_shapes(scale: float = 1.0) -> dict[str, tuple[int, ...]]:
    """148 tensors shaped like GPT-2 small (124M parameters at scale 1)."""
    v = max(int(V * scale), 16)
    shapes: dict[str, tuple[int, ...]] = {"wte": (v, D), "wpe": (CTX, D)}
    for i in range(GPT2_LAYERS):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (D,), p + "ln_1.bias": (D,),
                       p + "attn.c_attn.weight": (D, 3 * D), p + "attn.c_attn.bias": (3 * D,),
                       p + "attn.c_proj.weight": (D, D), p + "attn.c_proj.bias": (D,),
                       p + "ln_2.weight": (D,), p + "ln_2.bias": (D,),
                       p + "mlp.c_fc.weight": (D, 4 * D), p + "mlp.c_fc.bias": (4 * D,),
                       p + "mlp.c_proj.weight": (4 * D, D), p + "mlp.c_proj.bias": (D,)})
    shapes.update({"ln_f.weight": (D,), "ln_f.bias": (D,)})
    if scale < 1:  # shrink the big matrices too, keeping 148 tensors
        shapes = {k: tuple(max(int(d * math.sqrt(scale)), 1) if len(s) == 2 else d for d in s) for k, s in shapes.items()}
    return shapes


def make_tensors(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(s, dtype=np.float32) * rng.choice([1e-3, 1e-2, 1e-1])).astype(np.float32)
            for k, s in shapes.items()}


def small_tensors(n: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"t{i:05d}": rng.standard_normal(int(rng.integers(1000, 5001)), dtype=np.float32) for i in range(n)}


def timeit(fn: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def alternate(ours: Callable[[], float], base: Callable[[], float], repeat: int = 3) -> tuple[float, float]:
    """Median seconds of two measurements taken in turns (ours, base, ours, base, ...), so that both see
    the same moments of a shared machine's load; each callable returns the seconds of one run."""
    a, b = [], []
    for _ in range(repeat):
        a.append(ours())
        b.append(base())
    return statistics.median(a), statistics.median(b)


def page_aligned_buffer(nbytes: int) -> memoryview:
    """A buffer starting at a page boundary. Reading a file from offset 0 into it, every copy is in phase:
    into a bytearray (malloc: 16 bytes into a page, for a fresh block) the kernel's copy ran at a third of
    the speed on the AMD EPYC (see gradtool.io.base.buffer_phase), which made the baseline slow by luck."""
    import mmap

    return memoryview(mmap.mmap(-1, nbytes))


def raw_read(path: str) -> None:
    view = page_aligned_buffer(1 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass


def gradtool_cmd() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "gradtool")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "gradtool"]


# Commands run as a user's install runs them: with bytecode caches. pip compiles them at install time;
# a PYTHONDONTWRITEBYTECODE=1 environment (as on the project's machines) with an editable install would
# recompile gradtool's modules from source at every start (~20 ms). main() writes the caches once.
CLI_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def settle(src: str, output: str) -> None:
    """Before a timed clip or cp, for both sides alike: remove the last run's output, warm the source (this
    VM reclaims cold page cache within seconds) and let the last run's dirty pages be written back."""
    if os.path.exists(output):
        os.remove(output)
    raw_read(src)
    os.sync()


def timed_cp(src: str, dst: str, durable: bool) -> float:
    """Seconds of ``cp`` (then ``sync FILE`` when ``durable``), after :func:`settle`."""
    settle(src, dst)
    t = time.perf_counter()
    sync = f" && sync '{dst}'" if durable else ""
    subprocess.run(["sh", "-c", f"cp '{src}' '{dst}'{sync}"], check=True)
    return time.perf_counter() - t


def timed_numpy_copy(src: str, dst: str) -> float:
    """Seconds of a Python process that imports NumPy and copies ``src`` to ``dst`` (``shutil.copyfile``,
    the kernel's copy as ``cp``'s), after :func:`settle`: what any command line on NumPy pays to rewrite a
    file before it does any work on the bytes."""
    settle(src, dst)
    copy = "import numpy, shutil, sys; shutil.copyfile(sys.argv[1], sys.argv[2])"
    return run_measured([sys.executable, "-c", copy, src, dst], 1)[0]


def clip_command(src: str, out: str, max_norm: str, durable: bool) -> list[str]:
    return gradtool_cmd() + ["clip", src, "-o", out, "--mode", "global-norm", "--max", max_norm,
                             "--format", "json"] + ([] if durable else ["--no-fsync"])


def run_measured(cmd: list[str], repeat: int = 3, cwd: str | None = None,
                 env: dict[str, str] | None = None) -> tuple[float, float]:
    """(median wall seconds, peak RSS MiB) of a command run as its own process (``env``: more
    environment variables)."""
    wrapper = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
               "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
               "w = time.perf_counter() - t; "
               "print(w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)")
    walls, rss = [], []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, cwd=cwd,
                             env={**CLI_ENV, **(env or {})}).stdout.split()
        if out[2] != "0":
            raise SystemExit(f"command failed: {' '.join(cmd)}")
        walls.append(float(out[0]))
        rss.append(int(out[1]) / 1024)
    return statistics.median(walls), max(rss)


def write_mlflow_run(root: str, norms: np.ndarray) -> str:
    """An MLflow file-store run (``meta.yaml``, ``metrics/grad_norm``, ``metrics/loss``) of ``norms``."""
    run = os.path.join(root, "mlruns", "0", "r0")
    os.makedirs(os.path.join(run, "metrics"))
    with open(os.path.join(run, "meta.yaml"), "w") as f:
        f.write("run_id: r0\nrun_name: bench\nstart_time: 1795521146861\nlifecycle_stage: active\n")
    for key, values in (("grad_norm", norms), ("loss", np.full(len(norms), 2.0))):
        with open(os.path.join(run, "metrics", key), "w") as f:
            f.writelines(f"{1795521146861 + i} {float(v)!r} {i}\n" for i, v in enumerate(values))
    return run


def write_mlflow_db(path: str, norms: np.ndarray) -> None:
    """An MLflow SQLite store (the tables gradtool reads, with MLflow's indexes on them) of one run logging
    ``norms`` and a loss."""
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("CREATE TABLE runs (run_uuid, name, start_time, lifecycle_stage)")
    con.execute('CREATE TABLE metrics ("key", value, timestamp, run_uuid, step, is_nan, '
                'PRIMARY KEY ("key", timestamp, step, run_uuid, value, is_nan))')
    con.execute('CREATE TABLE latest_metrics ("key", value, timestamp, step, is_nan, run_uuid, '
                'PRIMARY KEY ("key", run_uuid))')
    con.execute("INSERT INTO runs VALUES ('r0', 'bench', 1795521146861, 'active')")
    for key, values in (("grad_norm", norms), ("loss", np.full(len(norms), 2.0))):
        con.executemany("INSERT INTO metrics VALUES (?, ?, ?, 'r0', ?, 0)",
                        ((key, float(v), 1795521146861 + i, i) for i, v in enumerate(values)))
        con.execute("INSERT INTO latest_metrics VALUES (?, ?, ?, ?, 0, 'r0')",
                    (key, float(values[-1]), 1795521146861 + len(values) - 1, len(values) - 1))
    for table, columns in (("metrics", "run_uuid"), ("latest_metrics", "run_uuid"),
                           ("metrics", "run_uuid, key, step")):  # MLflow's migrations make these
        con.execute(f"CREATE INDEX index_{table}_{columns.replace(', ', '_')} ON {table} ({columns})")
    con.commit()
    con.close()


def write_trackio_db(path: str, norms: np.ndarray) -> None:
    """A Trackio project (its metrics table and the indexes on it, as trackio 0.43 writes them) of one run:
    one row per value, as the Hugging Face Trainer logs them (grad_norm, loss, learning rate, global step;
    JSON as bytes)."""
    import json
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("CREATE TABLE metrics (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, "
                "timestamp TEXT NOT NULL, run_name TEXT NOT NULL, step INTEGER NOT NULL, "
                "metrics TEXT NOT NULL, log_id TEXT, space_id TEXT)")
    for index in ("idx_metrics_run_step ON metrics(run_id, step)",  # trackio 0.43's indexes
                  "idx_metrics_run_timestamp ON metrics(run_id, timestamp)"):
        con.execute(f"CREATE INDEX {index}")
    rows = ((i, json.dumps({"train/loss": 2.0, "train/grad_norm": float(v), "train/learning_rate": 1e-4,
                            "train/global_step": i + 1}, separators=(",", ":")).encode())  # as orjson
            for i, v in enumerate(norms))
    con.executemany("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) "
                    "VALUES ('r0', '2026-11-24T10:00:00+00:00', 'bench', ?, ?)", rows)
    con.commit()
    con.close()


def write_wandb_log(path: str, norms: np.ndarray) -> None:
    """A W&B run log of one history record per value, as the Hugging Face Trainer's callback and wandb
    write them (the Trainer's train/loss, grad_norm, learning rate, epoch and global step; wandb's _step,
    _runtime, _timestamp), written by the tests' encoder (tests/wandb_encoder.py: wandb's framing and
    protobuf wire format)."""
    import pathlib

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    from tests.wandb_encoder import history, write_log

    write_log(pathlib.Path(path), [history(i, i, {
        "train/loss": round(2.0 + 1 / (i + 1), 4), "train/grad_norm": float(v),
        "train/learning_rate": 5e-05 * (1 - i / len(norms)), "train/epoch": round(i / 1000, 2),
        "train/global_step": i + 1, "_step": i, "_runtime": 0.37 * i + 1.2345678,
        "_timestamp": 1795521146.123456 + 0.37 * i}) for i, v in enumerate(norms)])


def write_wandb_per_parameter_log(path: str, norms: np.ndarray, parameters: int = 500) -> None:
    """A W&B run log of Lightning's ``self.log_dict(grad_norm(self, norm_type=2))`` under the WandbLogger:
    a history record per step of ``norms`` (the total) with ``parameters`` norms more and the step (each
    record ~30 KB, split over blocks)."""
    import pathlib

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    from tests.wandb_encoder import history, write_log

    scale = np.linspace(0.05, 0.5, parameters)
    names = [f"grad_2.0_norm/layers.{k // 4}.{'qkvo'[k % 4]}_proj.weight" for k in range(parameters)]
    write_log(pathlib.Path(path), [history(i, i, {
        "grad_2.0_norm_total": float(v), **dict(zip(names, (scale * float(v)).tolist())),
        "trainer/global_step": i, "_step": i}) for i, v in enumerate(norms)])


def write_tensorboard_log(path: str, norms: np.ndarray, tf2: bool = False) -> str:
    """A TensorBoard run directory of one event file as ``SummaryWriter.add_scalar`` writes it (``tf2``: as
    TensorFlow 2's ``tf.summary.scalar`` and Keras write it, each scalar a tensor of one float32 with the
    scalars plugin's metadata): one event per scalar (grad_norm, loss, learning rate at each step), written
    by the tests' encoder (tests/tensorboard_encoder.py: TFRecord framing, event.proto's wire format)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    from tests import tensorboard_encoder as enc

    def value(tag: str, x: float) -> bytes:
        if tf2:
            return enc.tensor_value(tag, enc.tensor_proto(1, [x], [], content=True), "scalars")
        return enc.scalar_value(tag, x)

    os.makedirs(path)
    with open(os.path.join(path, "events.out.tfevents.1795521146.bench"), "wb") as f:
        f.write(enc.record(enc.file_version_event()))
        for i, v in enumerate(norms):
            for tag, x in (("train/grad_norm", float(v)), ("train/loss", 2.0), ("train/learning_rate", 1e-4)):
                f.write(enc.record(enc.summary_event(i, [value(tag, x)], 1795521146.0 + i)))
    return path


def write_per_parameter_log(path: str, norms: np.ndarray, parameters: int = 500) -> None:
    """A JSON Lines log of each parameter's gradient norm beside the total, as Lightning's
    ``self.log_dict(grad_norm(self, norm_type=2))`` names them (``grad_2.0_norm/<parameter>``,
    ``grad_2.0_norm_total``): one line per step of ``norms`` (the total), ``parameters`` keys more."""
    scale = np.linspace(0.05, 0.5, parameters)
    names = [f"grad_2.0_norm/layers.{k // 4}.{'qkvo'[k % 4]}_proj.weight" for k in range(parameters)]
    with open(path, "w") as f:
        for i, v in enumerate(norms):
            cells = ", ".join(f'"{n}": {x!r}' for n, x in zip(names, (scale * float(v)).tolist()))
            f.write(f'{{"step": {i}, "train_loss": 2.0, "grad_2.0_norm_total": {float(v)!r}, {cells}}}\n')


def write_lightning_csv(path: str, norms: np.ndarray, parameters: int = 500, val_every: int = 500) -> None:
    """Lightning's ``metrics.csv`` of ``self.log_dict(grad_norm(self, norm_type=2))``: a row per step of
    ``norms`` (the total) with ``parameters`` norms more, and every ``val_every`` steps a validation row
    whose other cells are empty (the CSVLogger writes one table of every metric logged)."""
    scale = np.linspace(0.05, 0.5, parameters)
    names = [f"grad_2.0_norm/layers.{k // 4}.{'qkvo'[k % 4]}_proj.weight" for k in range(parameters)]
    empty = "," * (parameters + 2)
    with open(path, "w") as f:
        f.write(",".join(["epoch", "step", "train_loss", "grad_2.0_norm_total", *names, "val_loss"]) + "\n")
        for i, v in enumerate(norms):
            cells = ",".join(map(repr, (scale * float(v)).tolist()))
            f.write(f"0,{i},2.0,{float(v)!r},{cells},\n")
            if i % val_every == val_every - 1:
                f.write(f"0,{i}{empty},1.5\n")


def write_megatron_log(path: str, norms: np.ndarray) -> None:
    """A Megatron-LM console log: one ``iteration N/ M | ... | grad norm: X |`` line per value."""
    with open(path, "w") as f:
        f.writelines(f" iteration {i + 1:8d}/ {len(norms):8d} | consumed samples: {8 * (i + 1)} | elapsed "
                     "time per iteration (ms): 123.4 | learning rate: 1.000E-04 | global batch size: 8 | lm "
                     f"loss: {2.0:.6E} | loss scale: 1.0 | grad norm: {float(v):.3f} | number of skipped "
                     "iterations: 0 |\n" for i, v in enumerate(norms))


def write_megatron_log_with_timers(path: str, norms: np.ndarray, every: int = 5) -> None:
    """A Megatron-LM console log with a timers line after every ``every`` iteration lines (``--log-timers-
    to-tensorboard``'s console twin): runs of the iteration lines' template cut short (a window of the text
    lowercased per run made it quadratic without the compiled reader until the thirty-fourth session)."""
    with open(path, "w") as f:
        for i, v in enumerate(norms):
            f.write(f" iteration {i + 1:8d}/ {len(norms):8d} | consumed samples: {8 * (i + 1)} | learning "
                    f"rate: 1.000E-04 | lm loss: {2.0:.6E} | loss scale: 1.0 | grad norm: {float(v):.3f} |\n")
            if i % every == every - 1:
                f.write("time (ms) | forward-backward: 123.45 | optimizer: 6.78 | batch-generator: 0.12\n")


def write_tensorboard_per_parameter_log(path: str, norms: np.ndarray, parameters: int = 200) -> str:
    """A TensorBoard run of Lightning's ``grad_norm`` under the TensorBoardLogger: ``grad_2.0_norm_total``
    and each parameter's ``grad_2.0_norm/<parameter>`` as an ``add_scalar`` event each, every step of
    ``norms`` (hundreds of tags of one length: 42 s without the compiled reader until the thirty-fourth
    session)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    from tests import tensorboard_encoder as enc

    scale = np.linspace(0.05, 0.5, parameters)
    names = [f"grad_2.0_norm/layers.{k // 4}.{'qkvo'[k % 4]}_proj.weight" for k in range(parameters)]
    os.makedirs(path)
    with open(os.path.join(path, "events.out.tfevents.1795521146.bench"), "wb") as f:
        f.write(enc.record(enc.file_version_event()))
        for i, v in enumerate(norms):
            values = [("grad_2.0_norm_total", float(v)), *zip(names, (scale * float(v)).tolist())]
            f.write(b"".join(enc.record(enc.summary_event(i, [enc.scalar_value(tag, x)], 1795521146.0 + i))
                             for tag, x in values))
    return path


def write_jsonl_with_nonfinite(path: str, norms: np.ndarray) -> None:
    """A JSON Lines log whose norm is NaN one step in seven and inf one in fifty (skipped fp16 steps), the
    last step's finite (a last step's NaN is a divergence): a divergence candidate each (three medians
    each until the thirty-fourth session: 4 s for 300,000)."""
    last = len(norms) - 1
    with open(path, "w") as f:
        for i, v in enumerate(norms):
            x = "NaN" if i % 7 == 1 and i < last else "Infinity" if i % 50 == 3 and i < last else repr(float(v))
            f.write(f'{{"step": {i}, "grad_norm": {x}, "loss": 2.0}}\n')


def write_jsonl_with_times(path: str, norms: np.ndarray) -> None:
    """A JSON Lines log as a logger writes it: a header line of the run's name and host, then a time string
    in every line (a string left the whole log to msgspec or the dict path until the thirty-sixth session:
    after the header line alone, 10^6 lines 3.6 s)."""
    with open(path, "w") as f:
        f.write('{"run": "gpt2-small", "host": "node-7"}\n')
        f.writelines(f'{{"time": "2024-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}", "step": {i}, '
                     f'"grad_norm": {float(v)!r}, "loss": 2.0}}\n' for i, v in enumerate(norms))


def write_trainer_console_with_banner(path: str, norms: np.ndarray) -> None:
    """The Trainer's console (:func:`write_trainer_console`) after wandb's banner ("wandb: \U0001f680 View
    run ..."): one character beyond two bytes makes the whole text four bytes a character (1.1 GB)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("wandb: \U0001f680 View run glorious-sun-1 at: https://wandb.ai/me/proj/runs/abc123\n")
    body = path + ".body"
    write_trainer_console(body, norms)
    with open(path, "ab") as out, open(body, "rb") as f:
        shutil.copyfileobj(f, out, 1 << 24)
    os.remove(body)


def write_trainer_console(path: str, norms: np.ndarray, eval_every: int = 1000) -> None:
    """The Hugging Face Trainer's console as a file holds it (``python train.py > train.log 2>&1``,
    ``logging_steps=1``): a tqdm update (block characters, after a carriage return) and a dict line a step
    (the bar cleared first, as ``tqdm.write`` does), the loss rounded to 4 digits, the norm and the
    learning rate as Python prints floats, the epoch to 2; an evaluation's dict every ``eval_every`` steps
    (~7 us a line until the thirty-fifth session: 6.5 s for 10^6)."""
    n, block, clear = len(norms), "\u2588", "\r" + " " * 60 + "\r"
    with open(path, "w", encoding="utf-8") as f:
        for i, v in enumerate(norms):
            done = 10 * (i + 1) // n
            f.write(f"\r{100 * (i + 1) // n:3d}%|{block * done}{' ' * (10 - done)}| {i + 1}/{n} "
                    f"[00:{i % 60:02d}<12:34,  9.87it/s]{clear}")
            f.write(str({"loss": round(2.5 - i / (2 * n), 4), "grad_norm": float(v),
                         "learning_rate": 5e-05 * (1 - i / n), "epoch": round(3 * i / n, 2)}) + "\n")
            if i % eval_every == eval_every - 1:
                f.write(str({"eval_loss": 2.1, "eval_runtime": 3.2, "eval_samples_per_second": 98.7,
                             "epoch": round(3 * i / n, 2)}) + "\n")


def write_trainer_state(path: str, norms: np.ndarray, eval_every: int = 1000) -> None:
    """A Hugging Face ``trainer_state.json`` of ``logging_steps=1``: a ``log_history`` entry a step (epoch,
    norm, learning rate, loss, step, as the Trainer logs them; sorted keys, indent 2, as it writes them)
    and an evaluation's entry every ``eval_every`` steps, which made ``from_records`` loop over the entries
    in Python (5.2 s for 10^6 until the thirty-fifth session)."""
    n, history = len(norms), []
    for i, v in enumerate(norms):
        history.append({"epoch": round(3 * i / n, 4), "grad_norm": float(v), "learning_rate": 5e-05 * (1 - i / n),
                        "loss": round(2.5 - i / (2 * n), 4), "step": i + 1})
        if i % eval_every == eval_every - 1:
            history.append({"epoch": round(3 * i / n, 4), "eval_loss": 2.1, "eval_runtime": 3.2,
                            "eval_samples_per_second": 98.7, "step": i + 1})
    with open(path, "w") as f:
        json.dump({"best_metric": None, "epoch": 3.0, "global_step": n, "log_history": history,
                   "logging_steps": 1, "max_steps": n}, f, indent=2, sort_keys=True)


def write_torchtitan_log(path: str, norms: np.ndarray) -> None:
    """torchtitan's console: a "[rank0]:[titan]" prefix, a time with a comma ("10:00:00,000"), terminal
    colours, "tps: 1,234" (numbers in thousands commas made a line template that did not read its own
    line, made again every few lines and each time converting every record: quadratic, until the
    thirty-fifth session; 10^6 lines had not finished after 12 minutes)."""
    with open(path, "w") as f:
        f.writelines(f"[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - \x1b[31mstep: {i + 1:2}  "
                     f"\x1b[32mloss:  {2.5 - i / (2 * len(norms)):7.4f}  \x1b[38;2;180;60;0mgrad_norm: "
                     f"{float(v):7.4f}  \x1b[34mmemory: 12.34GiB(15.2%)  tps: 1,234  \x1b[35mtflops: 123.4  "
                     "mfu: 23.4%\x1b[39m\n" for i, v in enumerate(norms))


def write_tqdm_postfix_log(path: str, norms: np.ndarray, ascii_bar: bool = False) -> None:
    """A custom loop's console: tqdm's updates, each after a carriage return, with the norm in the postfix
    (``pbar.set_postfix(loss=..., grad_norm=...)``), no step numbers; the bar 10 characters wide in
    tqdm's eighths of a block (or "#" with ``ascii=True``). Read a line at a time until the thirty-eighth
    session (~4.6 s for 10^6): templates were made only of lines with a step."""
    n, eighths = len(norms), "#" if ascii_bar else " \u258f\u258e\u258d\u258c\u258b\u258a\u2589\u2588"
    with open(path, "w", encoding="utf-8") as f:
        for i, v in enumerate(norms):
            done = 80 * (i + 1) // n
            full, part = divmod(done, 8)
            if ascii_bar:
                bar = ("#" * (10 * (i + 1) // n)).ljust(10)
            else:
                bar = (eighths[-1] * full + (eighths[part] if part and full < 10 else "")).ljust(10)
            f.write(f"\rEpoch 0: {100 * (i + 1) // n:3d}%|{bar}| {i + 1}/{n} [00:{i % 60:02d}<12:34,  "
                    f"9.87it/s, loss={2.5 - i / (2 * n):.3f}, grad_norm={float(v):.3f}]")
        f.write("\n")


def measure_logs(tmp: str, rows: list[tuple[str, str, str, str]]) -> None:
    """Target 7's rows: ``suggest-threshold`` on a log of 10^6 points of each kind gradtool reads (built in
    ``tmp``), each timed as a user runs it after a run not counted (the log in the page cache, as the
    issue measures), and again with ``GRADTOOL_NO_KERNELS=1``: what a user without the compiled readers
    gets (no wheels: an install without a C compiler)."""
    no_kernels = {"GRADTOOL_NO_KERNELS": "1"}

    def timed(what: str, target: str, fmt: str, base: str) -> None:
        cmd = gradtool_cmd() + ["suggest-threshold", target, "--format", fmt]
        # a first run not counted: the first after the log was written took up to twice as long as the
        # next (torchtitan's 0.84 against 0.67 s; the Trainer's console 2.3 against 0.9 s before 893d8ca)
        run_measured(cmd, 1)
        t_sug, _ = run_measured(cmd, 1)
        t_plain, _ = run_measured(cmd, 1, env=no_kernels)
        rows.append((f"suggest-threshold on {what}", f"{t_sug:.2f} s; {t_plain:.2f} s without the extension",
                     base, "-"))
        print(f"suggest {what}: {t_sug:.2f}s; without the extension {t_plain:.2f}s", flush=True)

    log = os.path.join(tmp, "big.jsonl")
    rng = np.random.default_rng(0)
    norms = np.exp(rng.normal(0, 0.3, 1_000_000))
    with open(log, "w") as f:
        for i, v in enumerate(norms):
            f.write(f'{{"step": {i}, "grad_norm": {float(v)!r}, "loss": 2.0}}\n')
    timed("a 10^6-line JSONL log", log, "value", "target ~1 s")
    csv_log = os.path.join(tmp, "big.csv")
    with open(csv_log, "w") as f:
        f.write("step,loss,grad_norm\n")
        f.writelines(f"{i},2.0,{float(v)!r}\n" for i, v in enumerate(norms))
    timed("a 10^6-row CSV log", csv_log, "value", "target ~1 s")
    t_jsonl = rows[-2][1].split(";")[0]
    for what, make, path in (
            ("an MLflow file-store run of 10^6 points", lambda p: write_mlflow_run(p, norms), tmp),
            ("an MLflow mlflow.db of 10^6 points", lambda p: write_mlflow_db(p, norms),
             os.path.join(tmp, "mlflow.db")),
            ("a W&B run log of 10^6 points (8 values a record)", lambda p: write_wandb_log(p, norms),
             os.path.join(tmp, "run-bench.wandb")),
            ("a Trackio project of 10^6 rows", lambda p: write_trackio_db(p, norms),
             os.path.join(tmp, "bench.db")),
            ("a Megatron text log of 10^6 lines", lambda p: write_megatron_log(p, norms),
             os.path.join(tmp, "train.log")),
            ("the Hugging Face Trainer's console, 10^6 dict lines (progress bars between them)",
             lambda p: write_trainer_console(p, norms), os.path.join(tmp, "trainer-console.log")),
            ("the same after wandb's banner (an emoji: a text of four-byte characters)",
             lambda p: write_trainer_console_with_banner(p, norms), os.path.join(tmp, "trainer-banner.log")),
            ("a JSON Lines log of 10^6 lines with a time string in each, after a header line",
             lambda p: write_jsonl_with_times(p, norms), os.path.join(tmp, "times.jsonl")),
            ("a Hugging Face trainer_state.json of 10^6 steps (an evaluation every 1,000)",
             lambda p: write_trainer_state(p, norms), os.path.join(tmp, "trainer_state.json")),
            ("a TensorBoard event file of 10^5 steps (3x10^5 scalar events)",
             lambda p: write_tensorboard_log(p, norms[:100_000]), os.path.join(tmp, "tb")),
            ("a TensorFlow 2 event file of 10^5 steps (3x10^5 tf.summary.scalar events)",
             lambda p: write_tensorboard_log(p, norms[:100_000], tf2=True), os.path.join(tmp, "tb2")),
            ("a JSON Lines log of per-parameter norms, 2,000 steps x 500 parameters (10^6 points; "
             "global-norm and norm modes, --format json)",
             lambda p: write_per_parameter_log(p, norms[:2_000]), os.path.join(tmp, "params.jsonl")),
            ("a Lightning metrics.csv of per-parameter norms, 20,000 steps x 500 parameters (10^7 points, "
             "validation rows of empty cells; --format json)",
             lambda p: write_lightning_csv(p, norms[:20_000]), os.path.join(tmp, "metrics.csv")),
            ("a W&B run log of per-parameter norms, 5,000 records x 500 parameters (2.5x10^6 points; "
             "--format json)", lambda p: write_wandb_per_parameter_log(p, norms[:5_000]),
             os.path.join(tmp, "run-params.wandb")),
            ("a TensorBoard run of per-parameter norms, 5,000 steps x 200 parameters (10^6 scalar events; "
             "--format json)", lambda p: write_tensorboard_per_parameter_log(p, norms[:5_000]),
             os.path.join(tmp, "tb-params")),
            ("a W&B run log of a mixture of experts' per-parameter norms, 500 records x 5,000 parameters "
             "(2.5x10^6 points; --format json)",
             lambda p: write_wandb_per_parameter_log(p, norms[:500], parameters=5_000),
             os.path.join(tmp, "run-experts.wandb")),
            ("a torchtitan log of 10^6 lines (thousands commas, terminal colours)",
             lambda p: write_torchtitan_log(p, norms), os.path.join(tmp, "titan.log")),
            ("a custom loop's tqdm updates, 10^6, the norm in the postfix (no step numbers; the bar's "
             "blocks)", lambda p: write_tqdm_postfix_log(p, norms), os.path.join(tmp, "tqdm.log")),
            ("the same with tqdm's ascii=True bar",
             lambda p: write_tqdm_postfix_log(p, norms, ascii_bar=True), os.path.join(tmp, "tqdm-ascii.log")),
            ("a Megatron text log of 10^5 lines, a timers line every 5", lambda p: write_megatron_log_with_timers(
                p, norms[:100_000]), os.path.join(tmp, "timers.log")),
            ("a JSON Lines log of 3x10^5 points, one norm in six NaN or inf",
             lambda p: write_jsonl_with_nonfinite(p, norms[:300_000]), os.path.join(tmp, "nonfinite.jsonl"))):
        target = make(path) or path
        two_modes = target.endswith(("params.jsonl", "metrics.csv", "params.wandb", "tb-params", "experts.wandb"))
        fmt = "json" if two_modes else "value"
        timed(what, target, fmt, f"{t_jsonl} (10^6-line JSONL)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a tenth of the sizes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", dest="json_out", default=None, help="also write the figures as JSON here")
    ap.add_argument("--logs-only", action="store_true",
                    help="only suggest-threshold on the logs (target 7), with and without the extension")
    args = ap.parse_args()
    scale = 0.1 if args.quick else 1.0
    rep = args.repeat
    import gradtool
    from gradtool.core.norms import l2_norm

    package = os.path.dirname(gradtool.__file__)  # the bytecode caches a pip install writes (see CLI_ENV)
    subprocess.run([sys.executable, "-m", "compileall", "-q", package], env=CLI_ENV, check=False)

    rows: list[tuple[str, str, str, str]] = []  # (what, gradtool, baseline, ratio)

    def add(what: str, ours: float, base: float, base_name: str, higher_is_better: bool = False, unit: str = "s") -> None:
        ratio = base / ours if not higher_is_better else ours / base
        rows.append((what, f"{ours:.3g} {unit}", f"{base:.3g} {unit} ({base_name})", f"{ratio:.2f}"))
        print(f"{what:60s} {ours:9.4f} vs {base:9.4f} {base_name:28s} ratio {ratio:.2f}", flush=True)

    tmp = tempfile.mkdtemp(prefix="gradtool-bench-")
    if args.logs_only:
        try:
            measure_logs(tmp, rows)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        report(rows, args.json_out)
        return
    try:
        big = make_tensors(gpt2_shapes(scale))
        nbytes = sum(a.nbytes for a in big.values())
        print(f"GPT-2-shaped set: {len(big)} tensors, {sum(a.size for a in big.values()) / 1e6:.1f}M elements, "
              f"{nbytes / 1e6:.0f} MB", flush=True)
        files = {}
        for fmt, ext in (("npz", "npz"), ("safetensors", "safetensors"), ("hdf5", "h5")):
            p = os.path.join(tmp, f"gpt2.{ext}")
            gradtool.save_dump(p, big)
            files[fmt] = p
        p = os.path.join(tmp, "gpt2_numpy.npz")
        np.savez(p, **big)
        files["npz (np.savez)"] = p
        os.sync()  # the workloads were just written: let writeback finish before anything is timed
        for p in files.values():
            raw_read(p)

        # 1. stats on uncompressed dumps vs raw read of the same file
        rss_box = [0.0]

        def cli_stats(path: str) -> float:
            wall, rss_run = run_measured(gradtool_cmd() + ["stats", path, "--format", "json"], 1)
            rss_box[0] = max(rss_box[0], rss_run)
            return wall

        for fmt, p in files.items():
            rss_box[0] = 0.0
            t_ours, t_raw = alternate(lambda: cli_stats(p), lambda: timeit(lambda: raw_read(p), 1), rep)
            rss = rss_box[0]
            add(f"stats {fmt}: read bandwidth vs raw read", nbytes / t_ours / 1e9, nbytes / t_raw / 1e9,
                "raw read", higher_is_better=True, unit="GB/s")
            rows[-1] = rows[-1][:3] + (rows[-1][3] + f"; peak RSS {rss:.0f} MiB",)
        # ... in-process (the library, no interpreter start-up), with the compiled kernel and without it
        from gradtool.core import kernels
        from gradtool.summarize import summarize_dump

        def in_process(path: str) -> None:
            with gradtool.open_dump(path) as reader:
                summarize_dump(reader)

        for fmt, p in files.items():
            for label in ("compiled kernel", "NumPy passes"):
                if label == "compiled kernel" and not kernels.BUILT:
                    continue
                with contextlib.nullcontext() if label == "compiled kernel" else kernels.disabled():
                    t_in, t_raw = alternate(lambda: timeit(lambda: in_process(p), 1),
                                            lambda: timeit(lambda: raw_read(p), 1), max(rep, 5))
                add(f"stats {fmt} in-process ({label}) vs raw read", nbytes / t_in / 1e9, nbytes / t_raw / 1e9,
                    "raw read", higher_is_better=True, unit="GB/s")
        # ... half-precision dumps (bfloat16: mixed-precision LLM training; float16), widened in the kernel
        import ml_dtypes

        for dt in (ml_dtypes.bfloat16, np.float16):
            name = np.dtype(dt).name
            p = os.path.join(tmp, f"gpt2_{name}.safetensors")
            gradtool.save_dump(p, {k: v.astype(dt) for k, v in big.items()})
            half_bytes = os.path.getsize(p)
            raw_read(p)
            t_in, t_raw = alternate(lambda: timeit(lambda: in_process(p), 1),
                                    lambda: timeit(lambda: raw_read(p), 1), max(rep, 5))
            add(f"stats safetensors {name} in-process vs raw read", half_bytes / t_in / 1e9,
                half_bytes / t_raw / 1e9, "raw read", higher_is_better=True, unit="GB/s")
            # ... and as a user runs it (ml_dtypes, ~0.5 s to import in 0.7, left unimported: DeferredDtype)
            t_cli, t_raw = alternate(lambda: cli_stats(p), lambda: timeit(lambda: raw_read(p), 1), rep)
            add(f"stats safetensors {name}: read bandwidth vs raw read", half_bytes / t_cli / 1e9,
                half_bytes / t_raw / 1e9, "raw read", higher_is_better=True, unit="GB/s")
            os.unlink(p)
        # ... and a step whose training went wrong: a NaN in every tensor, so a chunk of each the compiled
        # summary does not decide (NumPy's passes, each into a new array, 7 ms a chunk of 2^18 until the
        # fifty-sixth session: in-process 0.23 s against 0.04 s), in-process against the clean file
        nan_path = os.path.join(tmp, "gpt2_nan.safetensors")
        with_nan = {k: v.copy() for k, v in big.items()}
        for i, v in enumerate(with_nan.values()):
            v.reshape(-1)[(i * 7919) % v.size] = np.nan
        gradtool.save_dump(nan_path, with_nan)
        del with_nan
        clean = files["safetensors"]
        t_nan, t_clean = alternate(lambda: timeit(lambda: in_process(nan_path), 1),
                                   lambda: timeit(lambda: in_process(clean), 1), max(rep, 5))
        add("stats in-process, the GPT-2 set with a NaN in every tensor (vs the clean set)", t_nan, t_clean,
            "the clean set")
        os.unlink(nan_path)
        # ... and the CLI against a process that only reads the file (interpreter start-up in both)
        reader_proc = [sys.executable, "-c", "import mmap, sys; b = mmap.mmap(-1, 1 << 20); "  # page-aligned: see raw_read
                       "f = open(sys.argv[1], 'rb', buffering=0)\nwhile f.readinto(b): pass", files["npz"]]
        t_proc, _ = run_measured(reader_proc, rep)
        t_cli, _ = run_measured(gradtool_cmd() + ["stats", files["npz"], "--format", "json"], rep)
        add("stats npz CLI vs a python process reading the file", t_cli, t_proc, "python raw-read process")
        # ... and against the floor of any command line built on NumPy (the design card's): a process that
        # imports NumPy, then reads the file. Target 1's ratio for one dump cannot pass that process's own
        # ratio to the in-process read, the row after (start-up against a read of tens of ms)
        numpy_reader = [sys.executable, "-c", "import numpy\n" + reader_proc[2], files["npz"]]
        stats_npz = gradtool_cmd() + ["stats", files["npz"], "--format", "json"]
        t_cli, t_np_proc = alternate(lambda: run_measured(stats_npz, 1)[0], lambda: run_measured(numpy_reader, 1)[0],
                                     max(rep, 5))
        add("stats npz CLI vs a python process that imports NumPy and reads the file", nbytes / t_cli / 1e9,
            nbytes / t_np_proc / 1e9, "import numpy + read process", higher_is_better=True, unit="GB/s")
        add("that process (import numpy + read) vs an in-process raw read: the floor of the row before",
            nbytes / t_np_proc / 1e9, nbytes / timeit(lambda: raw_read(files["npz"]), max(rep, 5)) / 1e9,
            "raw read", higher_is_better=True, unit="GB/s")
        # ... and the default output, the table people read, against JSON (rich laid the table out at ~0.5 ms
        # a row before the twenty-fifth session: half of `stats` on a 592-tensor dump), in turns
        t_table, t_json = alternate(
            lambda: run_measured(gradtool_cmd() + ["stats", files["safetensors"]], 1)[0],
            lambda: run_measured(gradtool_cmd() + ["stats", files["safetensors"], "--format", "json"], 1)[0], rep)
        add(f"stats CLI, the default table vs --format json ({len(big)} tensors)", t_table, t_json, "--format json")

        # ... and the CLI on a history (the usual job: many steps in one run, start-up paid once): eight
        # hard links to the same dump, so the page cache holds one copy, against raw reads of the eight
        hist8 = os.path.join(tmp, "hist8")
        os.makedirs(hist8)
        for i in range(8):
            os.link(files["safetensors"], os.path.join(hist8, f"step_{i:05d}.safetensors"))
        rss_box[0] = 0.0
        t_cli8, t_raw8 = alternate(
            lambda: cli_stats(hist8),
            lambda: timeit(lambda: [raw_read(os.path.join(hist8, f)) for f in sorted(os.listdir(hist8))], 1),
            rep)
        rss8 = rss_box[0]
        add("stats CLI on 8 steps of the safetensors dump vs raw read", 8 * nbytes / t_cli8 / 1e9, 8 * nbytes / t_raw8 / 1e9,
            "raw read", higher_is_better=True, unit="GB/s")
        rows[-1] = rows[-1][:3] + (rows[-1][3] + f"; peak RSS {rss8:.0f} MiB",)
        # ... and what each further step costs, start-up excluded: (8 steps - 1 step) / 7, both runs in turns,
        # against one raw read. A history of hundreds of steps approaches this ratio.
        step0 = os.path.join(hist8, "step_00000.safetensors")
        t_cli1, t_cli8b = alternate(lambda: cli_stats(step0), lambda: cli_stats(hist8), rep)
        add("stats CLI: each further step of a history ((8 steps - 1 step) / 7, start-up excluded) vs raw read",
            nbytes / max((t_cli8b - t_cli1) / 7, 1e-9) / 1e9, 8 * nbytes / t_raw8 / 1e9,
            "raw read", higher_is_better=True, unit="GB/s")

        t_np = timeit(lambda: [l2_norm(np.load(files["npz (np.savez)"])[k]) for k in big], 1)
        add("numpy: np.load every member + norm (GB/s)", nbytes / t_np / 1e9, nbytes / timeit(lambda: raw_read(files["npz"]), rep) / 1e9,
            "raw read", higher_is_better=True, unit="GB/s")

        # 2. in-memory global norm vs torch foreach and numpy per-tensor dot
        arrays = list(big.values())
        t_ours = timeit(lambda: gradtool.global_norm(arrays), rep)
        t_dot = timeit(lambda: math.sqrt(sum(float(np.dot(a.ravel(), a.ravel())) for a in arrays)), rep)
        add("in-memory global norm, GPT-2 set (vs numpy per-tensor dot)", t_ours, t_dot, "numpy dot")
        smalls = list(small_tensors(int(20000 * max(scale, 0.25))).values())
        t_ours_s = timeit(lambda: gradtool.global_norm(smalls), rep)
        t_dot_s = timeit(lambda: math.sqrt(sum(float(np.dot(a, a)) for a in smalls)), rep)
        add(f"in-memory global norm, {len(smalls)} small tensors (vs numpy dot)", t_ours_s, t_dot_s, "numpy dot")
        try:
            import torch

            tt = [torch.from_numpy(a) for a in arrays]
            ts = [torch.from_numpy(a) for a in smalls]
            total = getattr(torch.nn.utils, "get_total_norm", None)
            if total is not None:
                add("in-memory global norm, GPT-2 set (vs torch foreach)", t_ours,
                    timeit(lambda: total(tt, foreach=True), rep), "torch get_total_norm")
                add(f"in-memory global norm, {len(smalls)} small tensors (vs torch foreach)", t_ours_s,
                    timeit(lambda: total(ts, foreach=True), rep), "torch get_total_norm")
        except ImportError:
            print("(torch not installed: torch baselines skipped)")

        # ... and a dump of that many tensors on disk (a mixture of experts' step): per-tensor costs, not
        # bandwidth. stats and clip end to end against a raw read; clip was quadratic in the tensor count
        # until the twenty-fifth session (DumpReader.info scanned the list), which 148 tensors never showed
        many = os.path.join(tmp, "many.safetensors")
        gradtool.save_dump(many, {f"t{i:05d}": a for i, a in enumerate(smalls)})
        raw_read(many)
        t_raw_many = timeit(lambda: raw_read(many), rep)
        t_stats_many, rss_many = run_measured(gradtool_cmd() + ["stats", many, "--format", "json"], rep)
        out_many = os.path.join(tmp, "many_clipped.safetensors")

        def clip_many() -> float:
            settle(many, out_many)
            return run_measured(clip_command(many, out_many, "1e-3", False), 1)[0]

        t_clip_many = float(np.median([clip_many() for _ in range(rep)]))
        add(f"stats CLI, {len(smalls)} small tensors in one safetensors file (vs raw read)", t_stats_many, t_raw_many,
            "raw read")
        add(f"clip --no-fsync CLI, the same {len(smalls)} tensors (vs raw read)", t_clip_many, t_raw_many, "raw read")
        # ... and a history of 8 such steps (hard links): memory must not grow with the steps (target 4;
        # every tensor's statistics of every step were held until the thirty-second session: 32 steps
        # 0.8-1.75 GB)
        many_hist = os.path.join(tmp, "many_hist")
        os.makedirs(many_hist)
        for i in range(8):
            os.link(many, os.path.join(many_hist, f"step_{i:05d}.safetensors"))
        for what, cmd in (("stats --format json", ["stats", many_hist, "--format", "json"]),
                          ("suggest-threshold --mode norm", ["suggest-threshold", many_hist, "--mode", "norm",
                                                             "--burn-in", "0", "--format", "json"]),
                          ("clip --dry-run --format json", ["clip", many_hist, "--mode", "global-norm", "--max",
                                                            "1e-3", "--dry-run", "--format", "json"])):
            _, rss_hist = run_measured(gradtool_cmd() + cmd, 1)
            add(f"{what} on 8 steps of {len(smalls)} tensors: peak RSS (vs stats of one step)", rss_hist,
                rss_many, "one step", unit="MiB")
        shutil.rmtree(many_hist)
        # ... and target 4's budget on that many tensors (what grows with their count: the index, HDF5's own
        # metadata, each tensor's statistics and output): the same command on a one-tensor dump of the same
        # format + the largest tensor + 64 MB. Until the fortieth session, 20,000 HDF5 datasets took 159 MB
        # (HDF5's metadata cache) and every format's JSON ~30 MB more (all the records, then the document)
        largest_small = max(a.nbytes for a in smalls) / 2**20

        def against_budget(label: str, path: str, argv: Callable[[str], list[str]]) -> None:
            one = os.path.join(tmp, "one" + os.path.splitext(path)[1])
            if os.path.exists(one):
                os.remove(one)
            if "gzip" in label:  # (the same kind of file: a gzip dataset, as the dump's; save_dump writes
                import h5py  # HDF5 uncompressed, and a start-up without the inflating path is ~1.3 MB less)

                with h5py.File(one, "w") as f:
                    f.create_dataset("t", data=smalls[0], compression="gzip")
            else:
                gradtool.save_dump(one, {"t": smalls[0]}, compress="compressed" in label)
            rss = [run_measured(gradtool_cmd() + argv(p), 1)[1] for p in (one, path)]
            budget = rss[0] + largest_small + 64
            rows.append((f"{label}: peak RSS vs target 4's budget", f"{rss[1]:.0f} MiB",
                         f"{budget:.0f} MiB (start-up {rss[0]:.0f} + largest tensor {largest_small:.2f} + 64)",
                         f"{rss[1] / budget:.2f} of the budget"))
            os.remove(one)

        def clip_argv(path: str) -> list[str]:
            out = os.path.join(tmp, "budget_out" + os.path.splitext(path)[1])
            if os.path.exists(out):
                os.remove(out)
            return ["clip", path, "-o", out, "--mode", "global-norm", "--max", "1e-3", "--no-fsync", "--format",
                    "json"]

        many_copies = {"npz": os.path.join(tmp, "many.npz"), "HDF5": os.path.join(tmp, "many.h5")}
        for label, path in many_copies.items():
            gradtool.save_dump(path, {f"t{i:05d}": a for i, a in enumerate(smalls)})
        for label, path in (("safetensors", many), *many_copies.items()):
            against_budget(f"stats --format json, {len(smalls)} small tensors as {label}", path,
                           lambda p: ["stats", p, "--format", "json"])
            against_budget(f"clip --no-fsync, {len(smalls)} small tensors as {label}", path, clip_argv)
        for path in many_copies.values():
            os.remove(path)
        # ... and the same tensors compressed: a savez_compressed npz and an HDF5 file of gzip datasets
        # (a thread, a pool hand-off and an open dataset each, until the thirty-fourth session: clip of the
        # npz 8.4 s; stats and clip of the HDF5 file 14 s and 23 s, 2 GB)
        import h5py

        packed = {"savez_compressed npz": os.path.join(tmp, "many_packed.npz"),
                  "HDF5 of gzip datasets": os.path.join(tmp, "many_gzip.h5")}
        np.savez_compressed(packed["savez_compressed npz"], **{f"t{i:05d}": a for i, a in enumerate(smalls)})
        with h5py.File(packed["HDF5 of gzip datasets"], "w") as f:
            for i, a in enumerate(smalls):
                f.create_dataset(f"g{i // 100:03d}/t{i:05d}", data=a, compression="gzip")
        for label, path in packed.items():
            raw_read(path)
            t_raw_packed = timeit(lambda: raw_read(path), rep)
            t_stats_packed, rss_packed = run_measured(gradtool_cmd() + ["stats", path, "--format", "json"], 1)
            out_packed = path.replace("many_", "many_clipped_")
            settle(path, out_packed)
            t_clip_packed, rss_clip_packed = run_measured(clip_command(path, out_packed, "1e-3", False), 1)
            add(f"stats CLI, the same {len(smalls)} tensors as a {label} (vs raw read)", t_stats_packed,
                t_raw_packed, "raw read")
            add(f"clip --no-fsync CLI, the same {len(smalls)} tensors as a {label} (vs raw read)", t_clip_packed,
                t_raw_packed, "raw read")
            add(f"stats and clip of that {label}: peak RSS (vs stats of the safetensors file)",
                max(rss_packed, rss_clip_packed), rss_many, "safetensors", unit="MiB")
            against_budget(f"stats --format json, the same as a {label}", path,
                           lambda p: ["stats", p, "--format", "json"])
            against_budget(f"clip --no-fsync, the same as a {label}", path, clip_argv)
            for f in (path, out_packed):
                if os.path.exists(f):
                    os.remove(f)
        for f in (many, out_many):
            if os.path.exists(f):
                os.remove(f)

        # 3. clip --mode global-norm end to end vs cp, in turns, each run from the same state: the source
        # warm (this VM reclaims cold page cache within seconds) and no dirty pages left by the last run
        for fmt in ("npz", "safetensors", "hdf5"):
            src = files[fmt]
            out = os.path.join(tmp, f"clipped.{os.path.splitext(src)[1][1:]}")
            dst = os.path.join(tmp, "copy.bin")
            rss_box[0] = 0.0

            def clip_once(durable: bool) -> float:
                settle(src, out)
                wall, rss_run = run_measured(clip_command(src, out, "1e-3", durable), 1)
                rss_box[0] = max(rss_box[0], rss_run)
                return wall

            t_clip, t_cp_sync = alternate(lambda: clip_once(True), lambda: timed_cp(src, dst, True), rep)
            add(f"clip global-norm {fmt} end to end (vs cp + fsync, the same durability)", t_clip, t_cp_sync,
                "cp + sync FILE")
            rows[-1] = rows[-1][:3] + (rows[-1][3] + f"; peak RSS {rss_box[0]:.0f} MiB",)
            t_clip, t_cp = alternate(lambda: clip_once(False), lambda: timed_cp(src, dst, False), rep)
            add(f"clip global-norm {fmt} --no-fsync end to end (vs cp, the same durability)", t_clip, t_cp, "cp")
            # ... and against the floor of a NumPy command line: a process that imports NumPy and copies
            # the file (shutil.copyfile: the kernel's copy, as cp's)
            t_clip, t_np_copy = alternate(lambda: clip_once(False), lambda: timed_numpy_copy(src, dst), rep)
            add(f"clip global-norm {fmt} --no-fsync vs a python process that imports NumPy and copies the file",
                t_clip, t_np_copy, "import numpy + copy process")
            for f in (out, dst):
                if os.path.exists(f):
                    os.remove(f)

        # ... per-row clipping (--mode norm --axes -1), streamed slice by slice since the twenty-fifth session
        # (it held each tensor, its float64 copy and their products: 800 MB at the peak), against target 4's
        # budget: the interpreter with its imports (the same command on a one-tensor dump) + the largest
        # tensor + 64 MB
        def clip_rows(path: str, output: str) -> tuple[float, float]:
            return run_measured(gradtool_cmd() + ["clip", path, "-o", output, "--mode", "norm", "--max", "1e-3",
                                                  "--axes", "-1", "--no-fsync", "--format", "json"], 1)

        src, out = files["safetensors"], os.path.join(tmp, "clipped_rows.safetensors")
        one = os.path.join(tmp, "one.safetensors")
        gradtool.save_dump(one, {"w": np.ones((4, 4), np.float32)})
        _, rss_start = clip_rows(one, os.path.join(tmp, "one_clipped.safetensors"))
        settle(src, out)
        t_rows, rss_rows = clip_rows(src, out)
        largest = max(a.nbytes for a in big.values()) / 2**20
        budget = rss_start + largest + 64
        rows.append((f"clip --mode norm --axes -1 (per row), {nbytes / 1e6:.0f} MB safetensors, --no-fsync: peak "
                     "RSS vs target 4's budget", f"{rss_rows:.0f} MiB ({t_rows:.2f} s)",
                     f"{budget:.0f} MiB (start-up {rss_start:.0f} + largest tensor {largest:.0f} + 64)",
                     f"{rss_rows / budget:.2f} of the budget"))
        print(f"clip --axes -1: {t_rows:.2f} s, peak RSS {rss_rows:.0f} MiB")
        os.remove(out)

        # ... the other modes against global-norm on the same file, in turns (one scale a tensor: the
        # floor): by value (NumPy's comparisons and where a chunk until the thirty-ninth session, 1.8 s
        # against 0.4 s), and by column of the float16 set (NumPy's float16 casts: 9.1 s)
        def clip_mode(path: str, output: str, *how: str) -> float:
            settle(path, output)
            return run_measured(gradtool_cmd() + ["clip", path, "-o", output, *how, "--no-fsync", "--format",
                                                  "json"], 1)[0]

        f16 = os.path.join(tmp, "gpt2_f16.safetensors")
        gradtool.save_dump(f16, {k: v.astype(np.float16) for k, v in big.items()})
        for path, label, how in ((src, "float32", ("--mode", "value", "--max", "1e-3")),
                                 (f16, "float16", ("--mode", "value", "--max", "1e-3")),
                                 (f16, "float16", ("--mode", "norm", "--axes", "0", "--max", "1e-3"))):
            t_mode, t_global = alternate(lambda: clip_mode(path, out, *how),
                                         lambda: clip_mode(path, out, "--mode", "global-norm", "--max",
                                                           "1e-3"), rep)
            add(f"clip {' '.join(how[:-2])}, GPT-2 set {label} safetensors, --no-fsync (vs global-norm, "
                "same file)", t_mode, t_global, "clip --mode global-norm")

        def clip_against_cp(path: str, tensors: dict[str, np.ndarray], label: str) -> None:
            """A row: ``clip --mode global-norm`` of the dump of ``tensors`` written to ``path`` (kept)
            against ``cp`` of it, in turns."""
            gradtool.save_dump(path, tensors)
            os.sync()
            dst = path + ".copy"
            t_clip, t_cp = alternate(lambda: clip_mode(path, out, "--mode", "global-norm", "--max", "1e-3"),
                                     lambda: timed_cp(path, dst, False), rep)
            add(f"clip global-norm, {os.path.getsize(path) / 1e6:.0f} MB of {label} safetensors --no-fsync "
                "(vs cp)", t_clip, t_cp, "cp")
            os.remove(dst)

        # ... and a bfloat16 dump against a copy of it (ml_dtypes, ~0.5 s to import in 0.7, left unimported:
        # the kernel scales the bits; 0.8 s against cp's 0.08 s before the fifty-fourth session)
        import ml_dtypes

        bf16 = os.path.join(tmp, "gpt2_bf16_clip.safetensors")
        clip_against_cp(bf16, {k: v.astype(ml_dtypes.bfloat16) for k, v in big.items()}, "bfloat16")
        # (by value: its bounds rounded to bfloat16 bits without ml_dtypes since the fifty-fifth session,
        # 0.75 -> 0.27 s)
        t_value16, t_global16 = alternate(lambda: clip_mode(bf16, out, "--mode", "value", "--max", "1e-3"),
                                          lambda: clip_mode(bf16, out, "--mode", "global-norm", "--max", "1e-3"),
                                          rep)
        add("clip --mode value, the bfloat16 set, --no-fsync (vs global-norm, same file)", t_value16, t_global16,
            "clip --mode global-norm")
        # (NaN zeroed first, and clipped by slices: their values by ml_dtypes, through NumPy, until the
        # fifty-sixth session: 1.12 and 1.09 s against 0.29 s)
        for how in (("--mode", "global-norm", "--nonfinite", "zero"), ("--mode", "norm", "--axes", "-1")):
            t_how, t_global16 = alternate(lambda: clip_mode(bf16, out, *how, "--max", "1e-3"),
                                          lambda: clip_mode(bf16, out, "--mode", "global-norm", "--max", "1e-3"),
                                          rep)
            add(f"clip {' '.join(how)}, the bfloat16 set, --no-fsync (vs global-norm, same file)", t_how,
                t_global16, "clip --mode global-norm")
        os.remove(bf16)
        # ... and a float64 dump (every other tensor of the set: ~1 GB) against a copy of it: its norms by
        # NumPy in float64 (three new arrays a chunk until the forty-second session: 1.28 s for 420 MB,
        # then 0.34), by the compiled f64_summary and f64_scale since the forty-third (0.30 s); and its
        # clipping by value against global-norm on the same file (NumPy's comparisons and where until the
        # forty-third session: 0.88 s for 420 MB, now 0.29)
        f64 = os.path.join(tmp, "gpt2_f64.safetensors")
        clip_against_cp(f64, {k: v.astype(np.float64) for k, v in list(big.items())[::2]}, "float64")
        t_value64, t_global64 = alternate(lambda: clip_mode(f64, out, "--mode", "value", "--max", "1e-3"),
                                          lambda: clip_mode(f64, out, "--mode", "global-norm", "--max", "1e-3"),
                                          rep)
        add("clip --mode value, the float64 set, --no-fsync (vs global-norm, same file)", t_value64, t_global64,
            "clip --mode global-norm")
        for f in (out, f16, f64):
            if os.path.exists(f):
                os.remove(f)

        # ... and on a 2 GB dump (the GPT-2 set four times over), where start-up and the fixed costs fade;
        # clip and cp measured in turns
        p4 = os.path.join(tmp, "gpt2x4.safetensors")
        gradtool.save_dump(p4, {f"r{i}.{k}": v for i in range(4) for k, v in big.items()})
        os.sync()
        raw_read(p4)
        out4, dst4 = os.path.join(tmp, "clipped4.safetensors"), os.path.join(tmp, "copy4.bin")

        def clip4(durable: bool, max_norm: str = "1e-3") -> float:
            settle(p4, out4)
            return run_measured(clip_command(p4, out4, max_norm, durable), 1)[0]

        def cp4(durable: bool) -> float:
            return timed_cp(p4, dst4, durable)

        def user_space_copy4() -> float:
            """What any tool that transforms every byte must at least do: read into a 256 KiB buffer and
            write it out (no start-up, no work on the bytes), where cp has the kernel copy them."""
            settle(p4, dst4)
            t = time.perf_counter()
            buf = page_aligned_buffer(1 << 18)
            with open(p4, "rb", buffering=0) as fin, open(dst4, "wb", buffering=0) as fout:
                while n := fin.readinto(buf):
                    fout.write(buf[:n])
            return time.perf_counter() - t

        gb4 = 4 * nbytes / 1e9
        t_clip4, t_cp4 = alternate(lambda: clip4(False), lambda: cp4(False), rep)
        add(f"clip global-norm, {gb4:.1f} GB safetensors --no-fsync (vs cp)", t_clip4, t_cp4, "cp")
        t_ucp4, t_cp4u = alternate(user_space_copy4, lambda: cp4(False), rep)
        add(f"a user-space copy of the {gb4:.1f} GB file, in-process (vs cp): the floor for rewriting every byte",
            t_ucp4, t_cp4u, "cp")
        t_clip4n, t_cp4n = alternate(lambda: clip4(False, "1e30"), lambda: cp4(False), rep)
        add(f"clip global-norm, {gb4:.1f} GB safetensors --no-fsync, nothing to clip (vs cp)", t_clip4n, t_cp4n, "cp")
        t_clip4, t_cp4 = alternate(lambda: clip4(True), lambda: cp4(True), rep)
        add(f"clip global-norm, {gb4:.1f} GB safetensors, durable (vs cp + sync)", t_clip4, t_cp4,
            "cp + sync FILE")
        for f in (p4, out4, dst4):
            if os.path.exists(f):
                os.remove(f)

        # 5. compressed input: does it use both cores?
        csub = dict(list(big.items())[: max(len(big) // 3, 4)])
        cpath = os.path.join(tmp, "compressed.npz")
        np.savez_compressed(cpath, **csub)
        os.sync()
        t0 = os.times()
        w, rss_c = run_measured(gradtool_cmd() + ["stats", cpath, "--format", "json"], 1)
        t1 = os.times()
        cpu = (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
        largest = max(a.nbytes for a in csub.values()) / 2**20
        rows.append(("stats on savez_compressed: CPU time / wall time (2 = both cores)", f"{cpu / w:.2f}", "-",
                     f"peak RSS {rss_c:.0f} MiB (largest tensor {largest:.0f} MiB)"))
        print(f"compressed: cpu/wall {cpu / w:.2f}, peak RSS {rss_c:.0f} MiB")
        # ... in-process (no single-threaded start-up), against what two cores can reach here: members
        # inflate in parallel but each on one core, so the largest member alone bounds the wall time
        biggest = max(csub, key=lambda k: csub[k].nbytes)

        def cpu_wall(select: list[str]) -> tuple[float, float]:
            with gradtool.open_dump(cpath) as reader:
                c0, t = time.process_time(), time.perf_counter()
                summarize_dump(reader, select=select)
                return time.process_time() - c0, time.perf_counter() - t

        runs = [cpu_wall([]) for _ in range(max(rep, 3))]
        cpu_in, wall_in = statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs)
        wall_big = statistics.median(cpu_wall([biggest])[1] for _ in range(max(rep, 3)))
        reachable = cpu_in / max(wall_big, cpu_in / 2)
        rows.append(("stats on savez_compressed in-process: CPU time / wall time", f"{cpu_in / wall_in:.2f}",
                     f"{reachable:.2f} reachable", f"{wall_in:.2f} s; the largest member alone {wall_big:.2f} s "
                     f"on one core ({wall_big / cpu_in:.0%} of the CPU time)"))
        print(f"compressed in-process: cpu/wall {cpu_in / wall_in:.2f} of {reachable:.2f} reachable")
        import h5py  # the same third of the set as gzip HDF5 (h5py's default chunking, gzip level 4)

        gpath = os.path.join(tmp, "compressed.h5")
        with h5py.File(gpath, "w", track_order=True) as f:
            for k, a in csub.items():
                f.create_dataset(k, data=a, compression="gzip")
        os.sync()
        raw_read(gpath)
        t0 = os.times()
        w, rss_g = run_measured(gradtool_cmd() + ["stats", gpath, "--format", "json"], 1)
        t1 = os.times()
        cpu = (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
        rows.append(("stats on gzip HDF5: CPU time / wall time (2 = both cores)", f"{cpu / w:.2f}", f"{w:.2f} s",
                     f"peak RSS {rss_g:.0f} MiB"))
        print(f"gzip hdf5: cpu/wall {cpu / w:.2f}, {w:.2f} s, peak RSS {rss_g:.0f} MiB")

        # ... and clip on both compressed dumps (inflate, scale, deflate again: the output keeps the compression)
        for label, path, ext in (("savez_compressed", cpath, "npz"), ("gzip HDF5", gpath, "h5")):
            out = os.path.join(tmp, f"clipped_compressed.{ext}")
            raw_read(path)
            t0 = os.times()
            w, rss_cc = run_measured(gradtool_cmd() + ["clip", path, "-o", out, "--mode", "global-norm", "--max", "1e-3",
                                                       "--no-fsync", "--format", "json"], 1)
            t1 = os.times()
            cpu = (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
            rows.append((f"clip --no-fsync on {label}: CPU time / wall time", f"{cpu / w:.2f}", f"{w:.2f} s",
                         f"peak RSS {rss_cc:.0f} MiB"))
            print(f"clip {label}: cpu/wall {cpu / w:.2f}, {w:.2f} s, peak RSS {rss_cc:.0f} MiB")
            os.remove(out)

        # ... and the inflate library: python-isal (the [speedups] extra) against the standard zlib, in turns
        from gradtool.io import inflate

        if inflate.fast_zlib() is not zlib:
            def stats_with(path: str, use_isal: bool) -> float:
                inflate.USE_ISAL = use_isal
                try:
                    return timeit(lambda: in_process(path), 1)
                finally:
                    inflate.USE_ISAL = True

            for label, path in (("savez_compressed", cpath), ("gzip HDF5", gpath)):
                t_isal, t_zlib = alternate(lambda: stats_with(path, True), lambda: stats_with(path, False), rep)
                add(f"stats {label} in-process: python-isal vs zlib", t_isal, t_zlib, "zlib")
        else:
            print("(python-isal not installed: the inflate comparison is skipped)")

        # 6. CLI start-up
        tiny = os.path.join(tmp, "tiny.npz")
        gradtool.save_dump(tiny, {"w": np.ones(10, np.float32)})
        t_np_imp, _ = run_measured([sys.executable, "-c", "import numpy"], 5)
        t_help, _ = run_measured(gradtool_cmd() + ["--help"], 5)
        t_tiny, rss_tiny = run_measured(gradtool_cmd() + ["stats", tiny], 5)
        add("gradtool --help start-up (vs python -c 'import numpy')", t_help, t_np_imp, "import numpy")
        add("gradtool stats tiny.npz (vs python -c 'import numpy')", t_tiny, t_np_imp, "import numpy")
        # ... of a bfloat16 safetensors file: ml_dtypes 0.7's import alone is ~0.5 s (6 ms in 0.6), which
        # the kernel, reading the bits, does not need (safetensors.DeferredDtype)
        import ml_dtypes

        tiny_bf16 = os.path.join(tmp, "tiny_bf16.safetensors")
        gradtool.save_dump(tiny_bf16, {"w": np.ones(10, ml_dtypes.bfloat16)})
        t_bf16, _ = run_measured(gradtool_cmd() + ["stats", tiny_bf16], 5)
        add("gradtool stats tiny_bf16.safetensors (vs python -c 'import numpy')", t_bf16, t_np_imp,
            "import numpy")

        # 7. history cost is linear; suggest-threshold on a 10^6-point log
        hist = os.path.join(tmp, "hist")
        os.makedirs(hist)
        small_dump = make_tensors(gpt2_shapes(0.01))
        for i in range(32):
            gradtool.save_dump(os.path.join(hist, f"step_{i:05d}.npz"), small_dump)
        t1d, _ = run_measured(gradtool_cmd() + ["stats", os.path.join(hist, "step_00000.npz"), "--format", "json"], rep)
        t32, _ = run_measured(gradtool_cmd() + ["stats", hist, "--format", "json"], rep)
        add("stats on 32 dumps vs 32 x one dump (start-up included once)", t32, 32 * t1d, "32 x one")
        # ... and what such a history of a small model (148 tensors, 3.9 MB a dump, most under 4096
        # elements) costs in-process against raw reads of its files: the per-tensor cost, not the bytes
        from gradtool import engine
        from gradtool.io import history as history_io

        hist_files = [os.path.join(hist, f) for f in sorted(os.listdir(hist))]
        hist_bytes = sum(os.path.getsize(f) for f in hist_files)
        def summarize_hist() -> object:
            return engine.summarize_refs(history_io.expand_inputs([hist], resolve_steps=False))

        def raw_read_hist() -> object:
            return [raw_read(f) for f in hist_files]

        t_hist, t_raw_hist = alternate(lambda: timeit(summarize_hist, 1), lambda: timeit(raw_read_hist, 1),
                                       max(rep, 5))
        add(f"stats in-process on 32 dumps of {len(small_dump)} small tensors vs raw read",
            hist_bytes / t_hist / 1e9, hist_bytes / t_raw_hist / 1e9, "raw read", higher_is_better=True,
            unit="GB/s")
        measure_logs(tmp, rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    report(rows, args.json_out)


def report(rows: list[tuple[str, str, str, str]], json_out: str | None) -> None:
    """The table of ``rows`` on stdout (Markdown), and as JSON in ``json_out`` when given."""
    print()
    print(f"Results {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, NumPy {np.__version__}")
    # which compiled parts and [speedups] libraries the figures were taken with (npz CRC-32 is isal's or
    # zlib's, JSON output msgspec's or the standard library's)
    print(subprocess.run(gradtool_cmd() + ["--version"], capture_output=True, text=True, env=CLI_ENV).stdout.strip())
    print()
    print("| what | gradtool | baseline | ratio (>1: gradtool faster / higher) |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
