"""Recommend a clipping threshold from a norm history, with the evidence (pure, host-side NumPy).

Follows the documented guidance (README "How suggest-threshold decides"; sources: Pascanu et al. 2013,
AutoClip 2020, ZClip 2025, RNMT+ 2018):

1. **Clean**: NaN/Inf steps and exact zeros are set aside and reported.
2. **Explosions**: the first *divergence* is found, a norm surge (or non-finite value) after which the
   loss jumps and stays up (or, without a loss, the norm stays ≥ 4× up or turns non-finite). Everything
   from there on is a broken regime and is excluded; the threshold must sit below the norm that led in.
3. **Burn-in**: the warm-up transient is skipped: the first max(25, 10 %) healthy observations, or
   until a logged learning-rate warm-up ends, whichever is later (at most half the healthy part).
4. **Window**: the last max(200, 50 %) observations of the healthy part after burn-in.
5. **Robust tail** (method ``robust``): m = median(log x), s = 1.4826·MAD(log x), τ = exp(m + k·s), k = 3.5.
6. **Guard rails**: τ is kept within [max(median, 0.5·mean), 10·mean] of the window (Pascanu's band) and
   below 0.9× the norm that led into a divergence. When those bounds cross, explosions happen at
   ordinary norms: clipping cannot fix that, and no number is recommended.

Other methods: ``percentile`` (AutoClip: the P-th percentile of the window), ``zscore`` (ZClip-like: EMA
mean/variance with α = 0.97 after a 25-step warm-up, spikes fed back clipped; τ = μ + z·σ) and
``pascanu`` (a multiple of the windowed mean).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

METHODS = ("robust", "percentile", "zscore", "pascanu")
MAD_TO_SIGMA = 1.4826
MIN_POINTS = 8
BLOCK = 32  # points per block for the running baseline of the divergence detector


@dataclass
class SuggestConfig:
    method: str = "robust"
    k: float = 3.5  # robust: MADs (in log space) above the median
    percentile: float = 99.0  # percentile method (AutoClip's paper uses 10: a normaliser, not a spike guard)
    z: float = 2.5  # zscore method
    alpha: float = 0.97  # zscore method EMA factor
    factor: float = 5.0  # pascanu: multiple of the windowed mean (their study: 0.5x-10x converged)
    burn_in: int | None = None  # observations to skip (None = automatic)
    window: int | None = None  # observations in the window (None = automatic)
    current: float | None = None  # the user's present threshold, to report its clip rate

    def validate(self) -> SuggestConfig:
        from .errors import UsageError

        if self.method not in METHODS:
            raise UsageError(f"--method must be one of {', '.join(METHODS)}")
        if not 0 < self.percentile <= 100:
            raise UsageError("--percentile must be in (0, 100]")
        for name in ("k", "z", "factor"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise UsageError(f"--{name} must be a positive number")
        if not 0 < self.alpha < 1:
            raise UsageError("alpha must be in (0, 1)")
        if self.current is not None and not (math.isfinite(self.current) and self.current > 0):
            raise UsageError("--current must be a positive number")
        if self.burn_in is not None and self.burn_in < 0 or self.window is not None and self.window < MIN_POINTS:
            raise UsageError(f"--burn-in must be >= 0 and --window >= {MIN_POINTS}")
        return self


@dataclass
class HistoryFacts:
    """What the history says before any threshold is chosen (shared by every mode of one input)."""

    steps: list[int]
    n: int
    logging_interval: int | None
    nonfinite_steps: list[int]
    nonfinite_loss_steps: list[int]
    zero_steps: list[int]
    divergence: dict[str, Any] | None
    healthy_end: int  # index (exclusive) where the healthy part ends
    burn_in: int  # observations skipped at the start
    burn_in_reason: str
    window_start: int
    warnings: list[str] = field(default_factory=list)

    @property
    def window(self) -> slice:
        return slice(self.window_start, self.healthy_end)

    def as_dict(self) -> dict[str, Any]:
        # not dataclasses.asdict: it deep-copies the per-step list (4 s for a 10^6-step log)
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "steps"}
        d = {k: list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v for k, v in d.items()}
        s = self.steps
        d["burn_in"] = {"observations": self.burn_in, "reason": self.burn_in_reason,
                        "until_step": s[self.burn_in - 1] if self.burn_in else None}
        d.pop("burn_in_reason")
        d["window"] = {"observations": self.healthy_end - self.window_start,
                       "first_step": s[self.window_start] if self.healthy_end > self.window_start else None,
                       "last_step": s[self.healthy_end - 1] if self.healthy_end > self.window_start else None}
        d.pop("window_start")
        d.pop("healthy_end")
        return d


@dataclass
class Suggestion:
    threshold: float | None
    method: str
    reason: str | None = None  # why there is no threshold
    evidence: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- helpers
def _median(a: np.ndarray) -> float:
    return float(np.median(a)) if a.size else math.nan


def _finite_loss(loss: np.ndarray, lo: int, hi: int) -> np.ndarray:
    seg = loss[max(lo, 0):max(hi, 0)]
    return seg[np.isfinite(seg)]


def _optional_column(values: Sequence[float | None] | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(float64 array with None as NaN, mask of the entries that were given), without a Python loop.
    A masked array (see ``masked_column``) gives its mask; a plain array is given everywhere."""
    if values is None:
        return np.full(n, np.nan), np.zeros(n, dtype=bool)
    if isinstance(values, np.ma.MaskedArray):
        return values.filled(np.nan).astype(np.float64, copy=False), ~np.ma.getmaskarray(values)
    if isinstance(values, np.ndarray):
        return values.astype(np.float64, copy=False), np.ones(values.size, dtype=bool)
    if type(values) is list:  # the common cases by a C-speed count, without an object array
        nones = values.count(None)
        if nones == 0:
            return np.asarray(values, dtype=np.float64), np.ones(n, dtype=bool)
        if nones == len(values):
            return np.full(n, np.nan), np.zeros(n, dtype=bool)
    obj = np.asarray(values, dtype=object)
    given = np.not_equal(obj, None)
    return obj.astype(np.float64) if given.all() else np.where(given, obj, np.nan).astype(np.float64), given


def masked_column(values: Sequence[float | None] | None, n: int | None = None) -> np.ma.MaskedArray:
    """A logged column (loss, learning rate) as float64, masked where it was not logged (None): the array
    form that ``analyze_history`` and ``suggest_threshold`` take without converting again."""
    n = len(values) if n is None and values is not None else n or 0
    data, given = _optional_column(values, n)
    return np.ma.MaskedArray(data, mask=~given)


def step_array(steps: Sequence[int]) -> np.ndarray:
    """Steps as int64, or as Python ints in an object array when one does not fit (a log can say anything)."""
    if isinstance(steps, np.ndarray):
        return steps
    try:
        return np.asarray(steps, dtype=np.int64)
    except OverflowError:
        return np.asarray(list(steps), dtype=object)


def logging_interval(steps: Sequence[int]) -> int | None:
    """The median positive gap between logged steps (None for fewer than two)."""
    if len(steps) < 2:
        return None
    d = np.diff(step_array(steps))
    d = d[d > 0]
    if not d.size:
        return None
    if d.dtype == object:  # Python ints beyond int64: exact, without a float conversion
        import statistics

        return int(statistics.median_low(d.tolist()))
    return int(np.median(d))


def _lr_warmup_end(lr: np.ndarray, end: int) -> int:
    """Index where a logged learning-rate warm-up ends (lr first reaches 99 % of its peak), else 0."""
    seg = lr[:end]
    ok = np.isfinite(seg)
    if ok.sum() < 3:
        return 0
    peak = np.nanmax(np.where(ok, seg, -np.inf))
    if peak <= 0:
        return 0
    first = int(np.argmax(ok & (seg >= 0.99 * peak)))
    start = seg[ok][0]
    return first if start < 0.5 * peak else 0


def _loss_diverged(loss: np.ndarray, given: np.ndarray, j: int, w: int) -> tuple[bool, dict[str, Any]]:
    """The loss jumps after j and stays up, or turns non-finite (``given`` marks logged values: a loss
    that was simply not logged is missing, not NaN)."""
    after = slice(j + 1, j + 1 + w)
    bad_after = given[after] & ~np.isfinite(loss[after])
    if bad_after.any() and bad_after.sum() >= max(1, given[after].sum() // 2):
        return True, {"loss_after": "non-finite"}
    pre = _finite_loss(loss, j - w, j)
    post = _finite_loss(loss, j + 1, j + 1 + w)
    tail = _finite_loss(loss, loss.size - w, loss.size)
    if pre.size < 3 or post.size < 1:
        return False, {}
    p, q, t = _median(pre), _median(post), _median(tail)
    jump = q > p + 0.25 * abs(p) + 1e-12 and t > p + 0.1 * abs(p)
    return bool(jump), {"loss_before": p, "loss_after": q, "loss_at_end": t}


CAP_TOLERANCE = 1e-3  # relative: a norm recomputed after clipping, in float32 or float16, or PyTorch's
# max_norm * total / (total + 1e-6)


def capped_at(norms: np.ndarray) -> tuple[float, int, int] | None:
    """(cap, observations at it, finite non-zero observations) when the norms sit at their largest value c,
    ``x >= c * (1 - CAP_TOLERANCE)``, in at least max(5, 10 %) of the finite non-zero observations and at
    least 3 times as often as at any one value below it: a series taken after clipping at c (every
    training stack logs the norm before clipping; a hand-written loop or a recorder placed after
    ``clip_grad_norm_`` may not). The largest value of a series that was not clipped is its rarest tail,
    and a series printed with few digits repeats every value, its largest no more than the others; None
    for both."""
    v = norms[np.isfinite(norms) & (norms > 0)]
    if v.size < MIN_POINTS:
        return None
    top = float(v.max())
    at_top = v >= top * (1 - CAP_TOLERANCE)
    at = int(np.count_nonzero(at_top))
    if at < max(5, 0.1 * v.size):
        return None
    below = v[~at_top]
    most = int(np.unique(below, return_counts=True)[1].max()) if below.size else 0
    return (top, at, int(v.size)) if at >= 3 * most else None


def analyze_history(steps: Sequence[int], norms: Sequence[float], loss: Sequence[float | None] | None = None,
                    lr: Sequence[float | None] | None = None, *, burn_in: int | None = None,
                    window: int | None = None) -> HistoryFacts:
    """Clean, find the divergence, the burn-in and the window of a (step-sorted) norm history. The columns
    may be lists (None = not logged) or arrays (``step_array``, float64 norms, ``masked_column``): arrays
    are used as they are, without another conversion (10^6-step logs)."""
    x = np.asarray(norms, dtype=np.float64)
    n = x.size
    L, given = _optional_column(loss, n)
    R, _ = _optional_column(lr, n)
    finite = np.isfinite(x)
    st = steps.tolist() if isinstance(steps, np.ndarray) else list(steps)
    nonfinite = [st[i] for i in np.flatnonzero(~finite)]
    nonfinite_loss = [st[i] for i in np.flatnonzero(given & ~np.isfinite(L))]
    zeros = [st[i] for i in np.flatnonzero(finite & (x == 0))]
    has_loss = np.isfinite(L).sum() >= 6
    w = max(5, min(BLOCK, n // 10 or 5))
    divergence = _find_divergence(x, L, given, st, has_loss, w)
    healthy_end = divergence["index"] if divergence else n
    warnings: list[str] = []

    auto = max(25, math.ceil(0.1 * healthy_end))
    lr_end = _lr_warmup_end(R, healthy_end)
    if burn_in is None:
        b, reason = auto, "first max(25, 10%) observations"
        if lr_end > b:
            b, reason = lr_end, "until the learning-rate warm-up ends"
        cap = healthy_end // 2
        if b > cap:
            b, reason = cap, reason + f" (capped at half of the {healthy_end} healthy observations)"
    else:
        b, reason = min(burn_in, max(healthy_end - MIN_POINTS, 0)), "given with --burn-in"
    post = healthy_end - b
    size = window if window is not None else max(200, math.ceil(0.5 * post))
    wstart = max(b, healthy_end - size)
    interval = logging_interval(steps if isinstance(steps, np.ndarray) else st)
    if interval and interval > 1:
        warnings.append(f"the norm is logged every {interval} steps: spikes between samples are unseen, so clip "
                        "rates are lower bounds")
    if divergence:
        warnings.append(f"training diverged at step {divergence['step']}: the {n - healthy_end} observations from "
                        "there on are a broken regime and were left out")
    if capped := capped_at(x):
        top, at, of = capped
        warnings.append(f"the norm is at its largest value, {top:.6g}, in {at} of {of} observations: norms "
                        f"taken after clipping at {top:.6g}? Clipping hides the spikes a threshold is chosen "
                        "from; record or log the norm before clipping (torch.nn.utils.clip_grad_norm_ "
                        "returns it)")
    return HistoryFacts(st, n, interval, nonfinite, nonfinite_loss, zeros, divergence, healthy_end, b,
                        reason, wstart, warnings)


def _row_medians(a: np.ndarray) -> np.ndarray:
    """``np.median(a, axis=1)`` of a 2-D array without NaN, by one ``np.partition`` at the middle: the same
    bits (for an even row length, the mean of the two middle values, (a + b) / 2, as np.median takes it; the
    lower one is the largest value left of the partition point) at a fifth of the cost."""
    k = a.shape[1]
    p = np.partition(a, k // 2, axis=1)  # one kth: partitioning at two is several times slower
    if k % 2:
        return p[:, k // 2]
    return (p[:, : k // 2].max(axis=1) + p[:, k // 2]) / 2  # everything left of kth is <= it


def _block_baseline(logs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every index j: median and robust sigma (1.4826 * MAD) of log x over the previous full block of
    BLOCK points, i.e. block j // BLOCK - 1 (NaN where there is none, or where that block holds fewer than 8
    finite points). O(n), vectorised: a history of 10^6 points takes a few tens of milliseconds."""
    n = logs.size
    nb = n // BLOCK
    med = np.full(n, np.nan)
    sig = np.full(n, np.nan)
    if nb < 1:
        return med, sig
    blocks = logs[: nb * BLOCK].reshape(nb, BLOCK)
    finite = np.isfinite(blocks)
    if finite.all():
        bm = _row_medians(blocks)
        bs = MAD_TO_SIGMA * _row_medians(np.abs(blocks - bm[:, None]))
    else:
        ok = finite.sum(axis=1) >= 8
        import warnings

        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: masked below
            bm = np.nanmedian(blocks, axis=1)
            bs = MAD_TO_SIGMA * np.nanmedian(np.abs(blocks - bm[:, None]), axis=1)
        bm[~ok] = np.nan
        bs[~ok] = np.nan
    # j in block b >= 1 reads block b - 1; the points after the last full block read the last full block
    med[BLOCK: nb * BLOCK] = np.repeat(bm[:-1], BLOCK)
    sig[BLOCK: nb * BLOCK] = np.repeat(bs[:-1], BLOCK)
    med[nb * BLOCK:] = bm[-1]
    sig[nb * BLOCK:] = bs[-1]
    return med, sig


def _find_divergence(x: np.ndarray, L: np.ndarray, given: np.ndarray, steps: list[int], has_loss: bool,
                     w: int) -> dict[str, Any] | None:
    """First index where training breaks: a surge or non-finite value followed by lasting damage."""
    n = x.size
    logs, base_m, surge = _surges(x)
    candidates = np.flatnonzero(surge | ~np.isfinite(x))
    candidates = candidates[candidates >= 1]
    broken = _first_nonfinite_break(x, L, given, candidates[~np.isfinite(x[candidates])], has_loss, w)
    if broken is not None:  # the surges before it are read one by one, as before
        candidates = candidates[candidates < broken]
    for j in candidates[np.isfinite(x[candidates])]:
        j = int(j)
        bad, info = _surge_breaks(x, logs, L, given, j, float(base_m[j]), has_loss, w)
        if bad:
            return {"index": j, "step": steps[j], "norm": float(x[j]), "trigger": "norm surge",
                    "norm_before": float(math.exp(base_m[j])), **info}
    if broken is not None:
        info = _loss_diverged(L, given, broken, w)[1] if has_loss else {}
        return {"index": broken, "step": steps[broken], "norm": float(x[broken]), "trigger": "non-finite norm",
                "norm_before": _last_finite(x, broken), **info}
    if has_loss:  # a loss that turns non-finite (and stays so) while the norm stays finite
        bad_loss = given & np.isinf(L)
        finite_loss = np.flatnonzero(np.isfinite(L))
        if finite_loss.size and finite_loss[-1] < n - 1:
            tail = slice(finite_loss[-1] + 1, n)
            if given[tail].any():
                bad_loss[tail] |= given[tail] & np.isnan(L[tail])
        hits = np.flatnonzero(bad_loss)
        if hits.size:
            j = int(hits[0])
            return {"index": j, "step": steps[j], "norm": float(x[j]), "trigger": "non-finite loss",
                    "norm_before": _last_finite(x, j)}
    return None


def _surges(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log x, NaN where x is not finite and positive; each point's baseline, the median log norm of the
    block before it (:func:`_block_baseline`); the surges: a log norm more than max(6 robust sigma, log 4)
    above its baseline)."""
    good = np.isfinite(x) & (x > 0)
    logs = np.where(good, np.log(np.where(good, x, 1.0)), np.nan)
    base_m, base_s = _block_baseline(logs)
    with np.errstate(invalid="ignore"):
        surge = good & np.isfinite(base_m) & (logs > base_m + np.maximum(6 * base_s, math.log(4)))
    return logs, base_m, surge


def _surge_breaks(x: np.ndarray, logs: np.ndarray, L: np.ndarray, given: np.ndarray, j: int, m: float,
                  has_loss: bool, w: int) -> tuple[bool, dict[str, Any]]:
    """Whether the surge at ``j`` (its block's median log norm ``m``) breaks training, and what says so:
    the loss diverges after it (:func:`_loss_diverged`), or, with no loss logged, the next ``w`` norms
    (three at least) are mostly non-finite or their median is more than 4x the block's."""
    if has_loss:
        return _loss_diverged(L, given, j, w)
    after = logs[j + 1: j + 1 + w]
    after_bad = ~np.isfinite(x[j + 1: j + 1 + w])
    return bool(after.size >= 3 and (np.mean(after_bad) >= 0.5 or
                                     _median(after[np.isfinite(after)]) > m + math.log(4))), {}


def _first_nonfinite_break(x: np.ndarray, L: np.ndarray, given: np.ndarray, at: np.ndarray, has_loss: bool,
                           w: int, first: int = 64) -> int | None:
    """The first of the non-finite norms ``at`` (indices >= 1, ascending) where training breaks, or None:
    the norm stays non-finite (at least half of ``x[j:j + w]``, of two or more points), the loss diverges
    after it (:func:`_loss_diverged`, when ``has_loss``), or it is the last point. Decided for blocks of
    them at once, from running counts and :func:`_window_medians`, where a loop called three medians a
    point (a log of 300,000 points, 48,000 of them NaN: 4.2 -> 0.1 s). Blocks of ``first`` points, then
    four times more each, up to 16,384 (the first NaN of a diverged run usually breaks at once)."""
    if not at.size:
        return None
    n = x.size
    nonfinite = np.concatenate(([0], np.cumsum(~np.isfinite(x))))
    bad_loss = np.concatenate(([0], np.cumsum(given & ~np.isfinite(L))))
    logged = np.concatenate(([0], np.cumsum(given)))
    tail = _median(_finite_loss(L, n - w, n))
    start, size = 0, first
    while start < at.size:
        j = at[start:start + size]
        stop = np.minimum(j + w, n)
        lasting = ((nonfinite[stop] - nonfinite[j]) / (stop - j) >= 0.5) & (stop - j >= 2)
        broke = lasting | (j == n - 1)
        if has_loss:  # _loss_diverged for each j
            a, b = np.minimum(j + 1, n), np.minimum(j + 1 + w, n)
            bad, logged_after = bad_loss[b] - bad_loss[a], logged[b] - logged[a]
            broke |= (bad > 0) & (bad >= np.maximum(1, logged_after // 2))
            p, before = _window_medians(L, np.maximum(j - w, 0), j, w)
            q, after = _window_medians(L, a, b, w)
            with np.errstate(invalid="ignore"):
                broke |= ((before >= 3) & (after >= 1) & (q > p + 0.25 * np.abs(p) + 1e-12)
                          & (tail > p + 0.1 * np.abs(p)))
        if broke.any():
            return int(j[np.argmax(broke)])
        start, size = start + size, min(4 * size, 1 << 14)
    return None


def _window_medians(v: np.ndarray, lo: np.ndarray, hi: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """For each r, the median of the finite values of ``v[lo[r]:hi[r]]`` (``hi - lo <= width``), NaN where
    there is none, and how many there are: the same bits as ``np.median`` of them (an odd count's middle
    value; an even count's two middle values m, m' as (m + m') / 2), rows sorted with NaN last."""
    idx = lo[:, None] + np.arange(width)
    inside = idx < np.minimum(hi, v.size)[:, None]
    rows = np.where(inside, v[np.minimum(idx, max(v.size - 1, 0))] if v.size else np.nan, np.nan)
    rows[~np.isfinite(rows)] = np.nan
    count = np.count_nonzero(~np.isnan(rows), axis=1)
    rows.sort(axis=1)
    r = np.arange(rows.shape[0])
    upper, lower = rows[r, np.minimum(count // 2, width - 1)], rows[r, np.maximum(count // 2 - 1, 0)]
    return np.where(count % 2 == 1, upper, (lower + upper) / 2), count


def _last_finite(x: np.ndarray, j: int) -> float | None:
    prev = x[:j][np.isfinite(x[:j])]
    return float(prev[-1]) if prev.size else None


# ------------------------------------------------------------------------------------------ methods
def _robust(v: np.ndarray, k: float) -> tuple[float, dict[str, Any]]:
    lv = np.log(v)
    m = float(np.median(lv))
    s = MAD_TO_SIGMA * float(np.median(np.abs(lv - m)))
    return math.exp(m + k * s), {"median_log": m, "sigma_log": s, "k": k}


def _zscore(v: np.ndarray, z: float, alpha: float, warmup: int = 25) -> tuple[float, dict[str, Any]]:
    """ZClip-like: μ, σ² = mean, variance of the first ``warmup`` values, then for each value g after them
    (a spike, (g - μ)/σ > z, fed back as μ + zσ): μ ← αμ + (1-α)g, σ² ← ασ² + (1-α)(g - μ)²; τ = μ + zσ.
    The square as d * d (``pow(d, 2)`` is off by an ulp now and then): :func:`_zscore_rows` gives the same
    bits for rows at once."""
    w0 = v[: min(warmup, v.size)]
    mu, var = float(np.mean(w0)), float(np.var(w0))
    spikes = 0
    for g in v[w0.size:].tolist():
        sd = math.sqrt(var)
        if sd > 0 and (g - mu) / sd > z:
            g = mu + z * sd  # ZClip feeds the clipped value back, so spikes do not inflate the EMA
            spikes += 1
        mu = alpha * mu + (1 - alpha) * g
        d = g - mu
        var = alpha * var + (1 - alpha) * (d * d)
    return mu + z * math.sqrt(var), {"ema_mean": mu, "ema_std": math.sqrt(var), "z": z, "alpha": alpha,
                                     "ema_spikes": spikes}


def _zscore_rows(v: np.ndarray, z: float, alpha: float, warmup: int = 25) -> np.ndarray:
    """:func:`_zscore`'s τ of each row of ``v`` (2-D, float64), the EMA run down the columns for every row
    at once: the same bits (the same IEEE operations in the same order)."""
    w0 = v[:, : min(warmup, v.shape[1])]
    mu, var = w0.mean(axis=1), w0.var(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        for g in np.ascontiguousarray(v[:, w0.shape[1]:].T):
            sd = np.sqrt(var)
            spike = (sd > 0) & ((g - mu) / sd > z)
            if spike.any():
                g = np.where(spike, mu + z * sd, g)
            mu = alpha * mu + (1 - alpha) * g
            d = g - mu
            var = alpha * var + (1 - alpha) * (d * d)
    return mu + z * np.sqrt(var)


def _explosion_norm(facts: HistoryFacts) -> float | None:
    """The norm that led into the divergence (the surge itself, or the last finite norm before a
    non-finite one), or None without a divergence."""
    div = facts.divergence
    if not div:
        return None
    return div["norm"] if math.isfinite(div["norm"]) else div.get("norm_before")


ROWS_ELEMENTS = 1 << 20  # values a block of rows holds in suggest_per_tensor (8 MB of float64)
ZSCORE_ROWS = 16  # fewer rows than this: the EMA value by value (a NumPy step a column costs more)


def _thresholds_of_rows(v: np.ndarray, config: SuggestConfig, facts: HistoryFacts) -> np.ndarray:
    """τ of each row of ``v`` (2-D float64: each row a series' window, every value finite and positive, at
    least MIN_POINTS of them), NaN where there is none: what :func:`suggest_threshold` gives each row on its
    own, bit for bit (rows' means, :func:`_row_medians`, ``np.percentile`` along rows and
    :func:`_zscore_rows` are the same IEEE operations as their one-row forms; ``math.exp`` per row), in a
    few NumPy passes over a block instead of ~200 µs of calls a series."""
    mean = v.mean(axis=1)
    median = _row_medians(v)
    if config.method == "robust":
        lv = np.log(v)
        m = _row_medians(lv)
        s = MAD_TO_SIGMA * _row_medians(np.abs(lv - m[:, None]))
        raw = np.array([math.exp(e) for e in (m + config.k * s).tolist()], dtype=np.float64)
    elif config.method == "percentile":
        raw = np.percentile(v, config.percentile, axis=1)
    elif config.method == "zscore":
        raw = _zscore_rows(v, config.z, config.alpha) if v.shape[0] >= ZSCORE_ROWS else \
            np.array([_zscore(row, config.z, config.alpha)[0] for row in v], dtype=np.float64)
    else:
        raw = config.factor * mean
    lower, upper = np.maximum(median, 0.5 * mean), 10.0 * mean
    explosion_norm = _explosion_norm(facts)
    tau = raw
    if config.method == "robust":
        ceiling = upper if explosion_norm is None else np.minimum(upper, 0.9 * explosion_norm)
        tau = np.minimum(np.maximum(raw, lower), ceiling)
    if explosion_norm is not None:  # explosions at ordinary norms: no threshold
        tau = np.where(0.9 * explosion_norm <= lower, np.nan, tau)
    return tau


def suggest_threshold(steps: Sequence[int], norms: Sequence[float], loss: Sequence[float | None] | None = None,
                      lr: Sequence[float | None] | None = None, *, config: SuggestConfig | None = None,
                      facts: HistoryFacts | None = None, with_evidence: bool = True) -> Suggestion:
    """Recommend τ for one norm series (see module doc). ``facts`` lets per-tensor series share the
    global series' divergence, burn-in and window. ``with_evidence=False`` leaves out the figures that
    justify τ (:func:`evidence`, ``current``'s clip rates): half the time, for a tensor among thousands
    whose τ alone is wanted."""
    cfg = (config or SuggestConfig()).validate()
    x = np.asarray(norms, dtype=np.float64)
    if facts is None:
        facts = analyze_history(steps, norms, loss, lr, burn_in=cfg.burn_in, window=cfg.window)
    wv = x[facts.window]
    wv = wv[np.isfinite(wv) & (wv > 0)]
    ev: dict[str, Any] = {}
    if wv.size < MIN_POINTS:
        return Suggestion(None, cfg.method, f"too little healthy data: {wv.size} usable observations in the window "
                          f"(need {MIN_POINTS}); record more steps or lower --burn-in", ev)
    mean, median = float(np.mean(wv)), float(np.median(wv))
    std = float(np.std(wv))
    if cfg.method == "robust":
        raw, detail = _robust(wv, cfg.k)
    elif cfg.method == "percentile":
        raw, detail = float(np.percentile(wv, cfg.percentile)), {"percentile": cfg.percentile}
    elif cfg.method == "zscore":
        raw, detail = _zscore(wv, cfg.z, cfg.alpha)
    else:
        raw, detail = cfg.factor * mean, {"factor": cfg.factor}
    lower, upper = max(median, 0.5 * mean), 10.0 * mean
    div = facts.divergence
    explosion_norm = _explosion_norm(facts)
    ceiling = upper if explosion_norm is None else min(upper, 0.9 * explosion_norm)
    ev.update({"candidate": raw, "method_detail": detail, "window_mean": mean, "window_median": median,
               "window_std": std, "guard": {"lower": lower, "upper": upper, "explosion_norm": explosion_norm}})
    if explosion_norm is not None and 0.9 * explosion_norm <= lower:
        ratio = explosion_norm / median if median else math.inf
        return Suggestion(None, cfg.method, (
            f"training diverged at step {div['step']} from an ordinary norm ({explosion_norm:.4g}, {ratio:.2g}x the "
            "median): clipping cannot prevent this explosion; look at the learning rate, loss scaling or the data"), ev)
    tau = raw
    if cfg.method == "robust":
        tau = min(max(raw, lower), ceiling)
        ev["guard"]["applied"] = "lower" if raw < lower else "upper" if raw > ceiling else None
    elif explosion_norm is not None and raw >= explosion_norm:
        ev.setdefault("warnings", []).append(
            f"this threshold ({raw:.4g}) is above the norm that led into the divergence ({explosion_norm:.4g})")
    if with_evidence:
        ev.update(evidence(x, steps, loss, facts, tau, wv))
        if cfg.current is not None:
            ev["current"] = {"threshold": cfg.current, **clip_rates(x, facts, cfg.current)}
    return Suggestion(tau, cfg.method, None, ev)


def clip_rates(x: np.ndarray, facts: HistoryFacts, tau: float) -> dict[str, float]:
    """Fraction of finite observations above τ: in the window, in the healthy part after burn-in, and in
    the whole history (warm-up and any broken regime included)."""
    allv = x[np.isfinite(x)]
    wv = x[facts.window]
    wv = wv[np.isfinite(wv)]
    hv = x[facts.burn_in:facts.healthy_end]
    hv = hv[np.isfinite(hv)]
    return {"clip_rate_window": float(np.mean(wv > tau)) if wv.size else math.nan,
            "clip_rate_healthy": float(np.mean(hv > tau)) if hv.size else math.nan,
            "clip_rate_all": float(np.mean(allv > tau)) if allv.size else math.nan}


def evidence(x: np.ndarray, steps: Sequence[int], loss: Sequence[float | None] | None, facts: HistoryFacts,
             tau: float, wv: np.ndarray) -> dict[str, Any]:
    """The figures that justify τ in the languages of the sources (AutoClip, ZClip, Pascanu)."""
    lv = np.log(wv)
    m = float(np.median(lv))
    s = MAD_TO_SIGMA * float(np.median(np.abs(lv - m)))
    mean, std = float(np.mean(wv)), float(np.std(wv))
    L = None if loss is None else _optional_column(loss, x.size)[0]  # None -> NaN
    spikes = []
    for i in np.flatnonzero(np.isfinite(x) & (x > tau)):
        change = None
        if L is not None and 0 < i < len(L) - 1 and math.isfinite(L[i - 1]) and math.isfinite(L[i + 1]):
            change = float(L[i + 1] - L[i - 1])
        spikes.append({"step": int(steps[i]), "norm": float(x[i]), "loss_change": change,
                       "in_burn_in": bool(i < facts.burn_in), "after_divergence": bool(i >= facts.healthy_end)})
    return {
        **clip_rates(x, facts, tau),
        "percentile": 100.0 * float(np.mean(wv <= tau)),
        "zscore": (tau - mean) / std if std > 0 else math.inf,
        "robust_zscore_log": (math.log(tau) - m) / s if s > 0 else math.inf,
        "ratio_to_mean": tau / mean,
        "spikes": spikes,
    }


def _own_clips(series: dict[str, Sequence[float]], per: dict[str, float | None], facts: HistoryFacts,
               divisors: dict[str, int] | None, block: int = 4096) -> tuple[int, int]:
    """(pairs clipped, pairs) of the (tensor, step) pairs of the window with a finite value, each tensor
    clipped at its own τ (``per``; tensors without one left out): ``block`` tensors' series a pass."""
    names = [n for n in series if per.get(n) is not None]
    hits = tot = 0
    for start in range(0, len(names), block):
        some = names[start:start + block]
        v = np.asarray([np.asarray(series[n], dtype=np.float64)[facts.window] for n in some])
        if divisors:
            v = v / np.array([max(divisors.get(n, 1), 1) for n in some], dtype=np.float64)[:, None]
        finite = np.isfinite(v)
        own = np.array([per[n] for n in some], dtype=np.float64)[:, None]
        hits += int(np.count_nonzero(finite & (v > own)))
        tot += int(np.count_nonzero(finite))
    return hits, tot


def _per_tensor_thresholds(steps: Sequence[int], series: dict[str, Sequence[float]], facts: HistoryFacts,
                           config: SuggestConfig, block: int | None = None) -> dict[str, float | None]:
    """Each series' τ over the global window (``suggest_threshold(..., facts=facts,
    with_evidence=False).threshold``): blocks of ``block`` series (default: ROWS_ELEMENTS values) whose
    windows are all finite and positive, of one length, by :func:`_thresholds_of_rows`; the others one by
    one. 5,000 series of 500 points: ~1.1 s one by one."""
    names = list(series)
    per: dict[str, float | None] = dict.fromkeys(names)
    width = max(facts.healthy_end - facts.window_start, 1)
    block = block or max(1, ROWS_ELEMENTS // width)
    for start in range(0, len(names), block):
        some = names[start:start + block]
        windows = [np.asarray(series[n], dtype=np.float64)[facts.window] for n in some]
        sizes = {w.size for w in windows}
        clean = np.zeros(len(some), dtype=bool)
        if len(sizes) == 1 and min(sizes) >= MIN_POINTS:
            v = np.asarray(windows) if len(some) > 1 else windows[0][None, :]
            with np.errstate(invalid="ignore"):
                clean = (np.isfinite(v) & (v > 0)).all(axis=1)
            if clean.any():
                taus = _thresholds_of_rows(v[clean] if not clean.all() else v, config, facts)
                for name, t in zip((n for n, c in zip(some, clean) if c), taus.tolist()):
                    per[name] = None if math.isnan(t) else t
        for name, c in zip(some, clean):
            if not c:
                per[name] = suggest_threshold(steps, series[name], config=config, facts=facts,
                                              with_evidence=False).threshold
    return per


def suggest_per_tensor(steps: Sequence[int], series: dict[str, Sequence[float]], facts: HistoryFacts,
                       config: SuggestConfig, *, divisors: dict[str, int] | None = None,
                       cap: float | None = None) -> tuple[Suggestion, dict[str, float | None]]:
    """τ per tensor (each series over the global history's window), and the recommendation: the largest
    (the "biggest value that still cuts off explosions" doctrine), capped at ``cap`` (the global τ)."""
    per = _per_tensor_thresholds(steps, series, facts, config)
    if divisors:
        per = {k: (v / max(divisors.get(k, 1), 1) if v is not None else None) for k, v in per.items()}
    found = {k: v for k, v in per.items() if v is not None}
    if not found:
        return Suggestion(None, config.method, "no tensor has enough usable (finite, non-zero) history"), per
    best_name = max(found, key=found.__getitem__)
    best = found[best_name]
    capped = cap is not None and best > cap
    tau = min(best, cap) if cap is not None else best
    if capped:
        per = {k: (min(v, cap) if v is not None else None) for k, v in per.items()}
    values = np.asarray(series[best_name], dtype=np.float64)
    if divisors:
        values = values / max(divisors.get(best_name, 1), 1)
    wv = values[facts.window]
    wv = wv[np.isfinite(wv) & (wv > 0)]
    ev = {"largest_tensor": best_name, "capped_at_global": bool(capped), "tensors": len(series),
          "tensors_without_threshold": sorted(k for k, v in per.items() if v is None)}
    if wv.size:
        ev.update(evidence(values, steps, None, facts, tau, wv))
        ev.update(clip_rates(values, facts, tau))
        hits, tot = _own_clips(series, per, facts, divisors)
        ev["clip_rate_window_per_tensor"] = hits / tot if tot else math.nan
    if config.current is not None:
        ev["current"] = {"threshold": config.current, **clip_rates(values, facts, config.current)}
    return Suggestion(tau, config.method, None, ev), per
