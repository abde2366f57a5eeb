#!/usr/bin/env python3
"""Make gradtool's sample data from a real (tiny) training run. Deterministic on a given CPU (OpenBLAS's
float32 products round differently with AVX2 and AVX-512: elsewhere the norms differ from the committed
files in the seventh digit); not run by CI.

A vanilla tanh RNN learns the *adding problem* (Hochreiter & Schmidhuber 1997; the task Pascanu et al.
2013 use to study exploding gradients): each sequence holds random values and two markers, and the
target is the sum of the two marked values. Training uses plain SGD with a learning rate high enough
that, now and then, backpropagation through time multiplies the gradient up by orders of magnitude:
the exploding gradients that gradient clipping is for. Nothing is clipped here. (The network soon
learns to predict the mean sum; the long-range dependency itself is what vanilla RNNs find hard.)

Every step's gradients are recorded with gradtool's own recorder. Outputs (in this directory):

  run.h5                 400 steps, one HDF5 group per step (attributes: step, loss, lr)
  dumps/step_*.npz       three single-step dumps (a calm step and the two largest spikes after warm-up)
  dumps/step_*.safetensors   the same three steps as safetensors
  nan_step.npz           a step of the same model run on with a far too high learning rate: NaN/Inf
  trainer_state.json     the run's global norms and losses as a Hugging Face trainer_state.json
  metrics.csv            the same as a CSV log (step, loss, grad_norm, learning_rate)

Run:  python sample_data/make_samples.py   (about 10 seconds)
"""

from __future__ import annotations

import csv
import json
import os
import shutil

import numpy as np

import gradtool

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 2
HIDDEN = 32
SEQ_LEN = 50
BATCH = 32
STEPS = 400
LR = 0.01
RADIUS = 1.2  # spectral radius of the initial recurrent matrix: > 1, where gradients can explode
INPUT_SCALE = 0.05  # small inputs keep the tanh units near their linear range, so BPTT can amplify


def make_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    values = rng.uniform(0.0, 1.0, (BATCH, SEQ_LEN))
    marks = np.zeros((BATCH, SEQ_LEN))
    first = rng.integers(0, SEQ_LEN // 2, BATCH)
    second = rng.integers(SEQ_LEN // 2, SEQ_LEN, BATCH)
    marks[np.arange(BATCH), first] = 1.0
    marks[np.arange(BATCH), second] = 1.0
    x = np.stack([values, marks], axis=-1).astype(np.float32)
    y = (values * marks).sum(axis=1, keepdims=True).astype(np.float32)
    return x, y


def init_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    q, _ = np.linalg.qr(rng.standard_normal((HIDDEN, HIDDEN)))
    return {
        "rnn/W_xh": (rng.standard_normal((2, HIDDEN)) * INPUT_SCALE).astype(np.float32),
        "rnn/W_hh": (q * RADIUS).astype(np.float32),
        "rnn/b_h": np.zeros(HIDDEN, np.float32),
        "head/W": (rng.standard_normal((HIDDEN, 1)) * 0.1).astype(np.float32),
        "head/b": np.zeros(1, np.float32),
    }


def loss_and_grads(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """Forward pass and manual backpropagation through time for h_t = tanh(x_t W_xh + h_{t-1} W_hh + b)."""
    with np.errstate(all="ignore"):
        hs = [np.zeros((BATCH, HIDDEN), np.float32)]
        for t in range(SEQ_LEN):
            hs.append(np.tanh(x[:, t] @ p["rnn/W_xh"] + hs[-1] @ p["rnn/W_hh"] + p["rnn/b_h"]))
        pred = hs[-1] @ p["head/W"] + p["head/b"]
        err = pred - y
        loss = float(np.mean(err ** 2))
        d_pred = (2.0 / BATCH) * err
        g = {k: np.zeros_like(v) for k, v in p.items()}
        g["head/W"] = hs[-1].T @ d_pred
        g["head/b"] = d_pred.sum(axis=0)
        dh = d_pred @ p["head/W"].T
        for t in range(SEQ_LEN, 0, -1):
            dpre = dh * (1.0 - hs[t] ** 2)
            g["rnn/W_xh"] += x[:, t - 1].T @ dpre
            g["rnn/W_hh"] += hs[t - 1].T @ dpre
            g["rnn/b_h"] += dpre.sum(axis=0)
            dh = dpre @ p["rnn/W_hh"].T
    return loss, {k: v.astype(np.float32) for k, v in g.items()}


def global_norm(g: dict[str, np.ndarray]) -> float:
    return gradtool.global_norm(list(g.values()))


def main() -> None:
    rng = np.random.default_rng(SEED)
    params = init_params(rng)
    for name in ("run.h5", "dumps", "nan_step.npz", "trainer_state.json", "metrics.csv"):
        path = os.path.join(HERE, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    rec = gradtool.Recorder(os.path.join(HERE, "run.h5"))
    history = []
    grads_by_step = {}
    for step in range(1, STEPS + 1):
        x, y = make_batch(rng)
        loss, grads = loss_and_grads(params, x, y)
        rec.write(step, grads, loss=loss, lr=LR)
        n = global_norm(grads)
        history.append((step, loss, n))
        grads_by_step[step] = grads
        for k in params:
            params[k] = params[k] - LR * grads[k]
    norms = np.array([h[2] for h in history])
    after_warmup = np.arange(len(norms)) >= STEPS // 10
    spikes = [int(history[i][0]) for i in np.argsort(np.where(after_warmup, norms, 0.0))[::-1][:2]]
    calm = int(history[int(np.argsort(np.abs(np.log(norms) - np.median(np.log(norms))))[0])][0])
    os.makedirs(os.path.join(HERE, "dumps"))
    for step in sorted([calm] + spikes):
        meta = {"step": step, "loss": history[step - 1][1], "lr": LR}
        for ext in ("npz", "safetensors"):
            gradtool.save_dump(os.path.join(HERE, "dumps", f"step_{step:05d}.{ext}"), grads_by_step[step], meta)
    # Run on with a far too high learning rate until the gradients turn non-finite: a real NaN dump.
    boom = {k: v.copy() for k, v in params.items()}
    for extra in range(1, 200):
        x, y = make_batch(rng)
        loss, grads = loss_and_grads(boom, x, y)
        if not all(np.isfinite(v).all() for v in grads.values()):
            gradtool.save_dump(os.path.join(HERE, "nan_step.npz"), grads,
                               {"step": STEPS + extra, "loss": loss, "lr": 50.0})
            break
        for k in boom:
            boom[k] = boom[k] - 50.0 * grads[k]
    else:
        raise SystemExit("the high-learning-rate run did not produce a NaN; adjust make_samples.py")
    log_history = [{"epoch": round(s / STEPS, 4), "grad_norm": n, "learning_rate": LR, "loss": round(l, 6), "step": s}
                   for s, l, n in history]
    with open(os.path.join(HERE, "trainer_state.json"), "w") as f:
        json.dump({"global_step": STEPS, "logging_steps": 1, "max_steps": STEPS, "log_history": log_history}, f, indent=2)
    with open(os.path.join(HERE, "metrics.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss", "grad_norm", "learning_rate"])
        for s, l, n in history:
            w.writerow([s, repr(l), repr(n), LR])
    med = float(np.median(norms))
    print(f"global norm: median {med:.4g}, max {norms.max():.4g} at step {history[int(norms.argmax())][0]}; "
          f"steps above 5x median: {[h[0] for h in history if h[2] > 5 * med]}; "
          f"final loss {history[-1][1]:.4g} (first {history[0][1]:.4g})")


if __name__ == "__main__":
    main()
