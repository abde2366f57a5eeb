"""Synthetic histories with known structure, and the real Hugging Face logs."""

import math
import os

import numpy as np
import pytest

from gradtool.io.logs import read_norm_log
from gradtool.suggest import SuggestConfig, analyze_history, suggest_per_tensor, suggest_threshold

REAL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "real-logs")


def synthetic(seed=0, n=1000, warmup=50, spikes=10, drift=1.5):
    rng = np.random.default_rng(seed)
    x = np.exp(rng.normal(0.0, 0.3, n)) * np.linspace(1, drift, n)
    x[:warmup] *= np.geomspace(300, 1, warmup)
    spike_idx = rng.choice(np.arange(warmup + 50, n), spikes, replace=False)
    x[spike_idx] *= rng.uniform(10, 50, spikes)
    zero_idx = np.array([200, 400])
    nan_idx = np.array([300, 600])
    x[zero_idx] = 0.0
    x[nan_idx] = np.nan
    steady = np.setdiff1d(np.arange(warmup, n), np.r_[spike_idx, zero_idx, nan_idx])
    return list(range(n)), x, spike_idx, steady, nan_idx, zero_idx


@pytest.mark.parametrize("seed", range(5))
def test_threshold_above_steady_state_and_below_every_spike(seed):
    steps, x, spikes, steady, nan_idx, zero_idx = synthetic(seed)
    s = suggest_threshold(steps, x)
    assert s.threshold is not None
    assert np.mean(x[steady] <= s.threshold) >= 0.95
    assert s.threshold < x[spikes].min()
    facts = analyze_history(steps, x)
    assert facts.nonfinite_steps == [int(i) for i in nan_idx] and facts.zero_steps == [int(i) for i in zero_idx]
    spike_steps = {sp["step"] for sp in s.evidence["spikes"]}
    assert {int(i) for i in spikes} <= spike_steps


def test_warmup_does_not_move_it():
    steps, x, *_ = synthetic(1)
    calm = x.copy()
    calm[:50] = x[50:100]
    assert suggest_threshold(steps, x).threshold == suggest_threshold(steps, calm).threshold


def test_lr_warmup_sets_burn_in():
    steps, x, *_ = synthetic(2, n=2000)
    lr = list(np.minimum(np.arange(2000) / 600, 1.0) * 1e-3)
    f = analyze_history(steps, x, lr=lr)
    assert f.burn_in >= 590 and "warm-up" in f.burn_in_reason


def test_early_divergence_with_loss_is_excluded():
    # healthy for 150 steps, then a surge after which the loss jumps to 7 and stays: a broken regime
    rng = np.random.default_rng(3)
    n = 1000
    x = np.exp(rng.normal(0, 0.3, n))
    loss = np.r_[np.linspace(3, 2, 150), np.full(n - 150, 7.0)] + rng.normal(0, 0.05, n)
    x[150] = 30.0
    x[151:] *= rng.uniform(10, 60, n - 151)
    s = suggest_threshold(list(range(n)), x, list(loss))
    facts = analyze_history(list(range(n)), x, list(loss))
    assert facts.divergence["step"] == 150 and facts.divergence["trigger"] == "norm surge"
    assert s.threshold < 0.9 * 30.0  # below the norm that led into the explosion
    healthy = x[25:150]
    assert np.mean(healthy <= s.threshold) >= 0.95
    naive = float(np.percentile(x, 95))
    assert naive > 10 * s.threshold  # what a percentile of the whole history would have said


def test_divergence_without_loss_from_lasting_norm_level():
    rng = np.random.default_rng(4)
    x = np.exp(rng.normal(0, 0.2, 600))
    x[300:] *= 50
    f = analyze_history(list(range(600)), x)
    assert f.divergence and f.divergence["step"] == 300


def test_isolated_spike_with_recovering_loss_is_not_divergence():
    rng = np.random.default_rng(5)
    n = 500
    x = np.exp(rng.normal(0, 0.2, n))
    x[250] = 40
    loss = list(np.linspace(3, 1, n))
    f = analyze_history(list(range(n)), x, loss)
    assert f.divergence is None
    s = suggest_threshold(list(range(n)), x, loss)
    assert s.threshold < 40 and any(sp["step"] == 250 for sp in s.evidence["spikes"])


def test_explosion_at_ordinary_norms_gives_no_number():
    rng = np.random.default_rng(6)
    n = 600
    x = np.exp(rng.normal(0, 0.3, n))
    x[301:] = np.nan
    loss = list(np.r_[np.linspace(3, 2, 301), np.full(n - 301, np.nan)])
    s = suggest_threshold(list(range(n)), x, loss)
    assert s.threshold is None and "clipping cannot" in s.reason


def test_too_little_data():
    s = suggest_threshold([1, 2, 3], [1.0, 2.0, 3.0])
    assert s.threshold is None and "too little" in s.reason


@pytest.mark.parametrize("method", ["percentile", "zscore", "pascanu"])
def test_other_methods(method):
    steps, x, spikes, steady, *_ = synthetic(7)
    s = suggest_threshold(steps, x, config=SuggestConfig(method=method))
    assert s.threshold is not None and s.method == method
    wv = x[analyze_history(steps, x).window]
    wv = wv[np.isfinite(wv) & (wv > 0)]
    if method == "percentile":
        assert s.threshold == pytest.approx(np.percentile(wv, 99))
    if method == "pascanu":
        assert s.threshold == pytest.approx(5 * wv.mean())
    if method == "zscore":
        assert np.median(wv) < s.threshold < x[spikes].max()


def test_current_threshold_clip_rate():
    steps, x, *_ = synthetic(8)
    s = suggest_threshold(steps, x, config=SuggestConfig(current=1e-3))
    assert s.evidence["current"]["clip_rate_all"] == pytest.approx(np.mean(x[np.isfinite(x)] > 1e-3))


def test_evidence_figures_are_consistent():
    steps, x, *_ = synthetic(9)
    s = suggest_threshold(steps, x)
    e = s.evidence
    facts = analyze_history(steps, x)
    wv = x[facts.window]
    wv = wv[np.isfinite(wv) & (wv > 0)]
    assert e["percentile"] == pytest.approx(100 * np.mean(wv <= s.threshold))
    assert e["ratio_to_mean"] == pytest.approx(s.threshold / wv.mean())
    assert e["clip_rate_window"] == pytest.approx(np.mean(x[facts.window][np.isfinite(x[facts.window])] > s.threshold))
    lv = np.log(wv)
    m = np.median(lv)
    sig = 1.4826 * np.median(np.abs(lv - m))
    assert e["robust_zscore_log"] == pytest.approx((math.log(s.threshold) - m) / sig)


def test_per_tensor_max_and_global_consistency():
    rng = np.random.default_rng(10)
    n = 400
    tensors = {f"t{i}": np.exp(rng.normal(math.log(1 + i), 0.3, n)) for i in range(5)}
    glob = np.sqrt(sum(v ** 2 for v in tensors.values()))
    steps = list(range(n))
    facts = analyze_history(steps, glob)
    g = suggest_threshold(steps, glob, facts=facts)
    s, per = suggest_per_tensor(steps, tensors, facts, SuggestConfig(), cap=g.threshold)
    assert s.threshold == max(per.values()) and s.threshold <= g.threshold
    assert s.evidence["largest_tensor"] == "t4"
    avg, per_avg = suggest_per_tensor(steps, tensors, facts, SuggestConfig(), divisors={k: 100 for k in tensors})
    assert avg.threshold == pytest.approx(max(v for v in per.values()) / 100)


@pytest.mark.skipif(not os.path.isdir(REAL), reason="../shared/real-logs not present")
@pytest.mark.parametrize("name", sorted(f for f in os.listdir(REAL) if f.endswith(".json")) if os.path.isdir(REAL) else [])
def test_real_logs_give_finite_threshold_with_low_clip_rate(name):
    h = read_norm_log(os.path.join(REAL, name))
    s = suggest_threshold(h.steps, h.norms, h.loss, h.lr)
    assert s.threshold is not None and math.isfinite(s.threshold) and s.threshold > 0
    assert s.evidence["clip_rate_window"] <= 0.10
    # and it is scale-aware: not a copied 1.0
    finite = [v for v in h.norms if math.isfinite(v)]
    assert min(finite) < s.threshold < max(finite)


def test_million_point_history_is_fast_enough_to_not_be_quadratic():
    rng = np.random.default_rng(0)
    x = np.exp(rng.normal(0, 0.3, 200_000))
    s = suggest_threshold(range(200_000), x)
    assert s.threshold is not None


from hypothesis import given as _given, settings as _settings  # noqa: E402
from hypothesis import strategies as _st  # noqa: E402


@_settings(max_examples=60, deadline=None)
@_given(n=_st.integers(0, 300), seed=_st.integers(0, 2**32 - 1), holes=_st.integers(0, 40))
def test_block_baseline_equals_a_per_point_reference(n, seed, holes):
    """The vectorised running baseline (median and robust sigma of the previous full block) against a plain
    loop with numpy's nanmedian per block, with and without NaN holes (the fast np.median branch and the
    nanmedian one)."""
    from gradtool.suggest import BLOCK, MAD_TO_SIGMA, _block_baseline

    rng = np.random.default_rng(seed)
    logs = rng.standard_normal(n)
    if n and holes:
        logs[rng.integers(0, n, holes)] = np.nan
    med, sig = _block_baseline(logs)
    for j in range(n):
        b = j // BLOCK - 1
        if b < 0 or (b + 1) * BLOCK > n:
            assert np.isnan(med[j]) and np.isnan(sig[j])
            continue
        block = logs[b * BLOCK:(b + 1) * BLOCK]
        if np.isfinite(block).sum() < 8:
            assert np.isnan(med[j])
            continue
        m = np.nanmedian(block)
        assert med[j] == m and sig[j] == pytest.approx(MAD_TO_SIGMA * np.nanmedian(np.abs(block - m)), rel=1e-12)


@_settings(max_examples=80, deadline=None)
@_given(rows=_st.integers(1, 40), width=_st.integers(1, 40), seed=_st.integers(0, 2**32 - 1),
        ties=_st.booleans())
def test_row_medians_equal_numpy_median(rows, width, seed, ties):
    """The one-partition row median against np.median (odd and even widths, ties): equal values."""
    from gradtool.suggest import _row_medians

    rng = np.random.default_rng(seed)
    a = rng.integers(-3, 3, (rows, width)).astype(np.float64) if ties else rng.standard_normal((rows, width))
    np.testing.assert_array_equal(_row_medians(a), np.median(a, axis=1))


_norm_value = _st.one_of(_st.floats(1e-3, 1e3), _st.sampled_from([math.nan, math.inf, 0.0]))
_logged = _st.one_of(_st.none(), _st.floats(0.1, 10.0), _st.sampled_from([math.nan, math.inf]))


@_settings(max_examples=60, deadline=None)
@_given(data=_st.data(), n=_st.integers(1, 300),
        method=_st.sampled_from(["robust", "percentile", "zscore", "pascanu"]))
def test_array_columns_give_the_list_columns_results(data, n, method):
    """analyze_history and suggest_threshold on arrays (int64 steps, float64 norms, masked loss and lr, as
    NormHistory.arrays() hands them over) say exactly what they say on lists with None holes."""
    from gradtool.suggest import SuggestConfig, masked_column, step_array

    rng = np.random.default_rng(data.draw(_st.integers(0, 2**32 - 1)))
    norms = np.exp(rng.normal(0, 0.5, n)).tolist()
    for i in data.draw(_st.lists(_st.integers(0, n - 1), max_size=5)):
        norms[i] = data.draw(_norm_value)
    steps = sorted(set(rng.integers(0, 10 * n, n).tolist()))
    norms = norms[:len(steps)]
    loss = [data.draw(_logged) if i % 17 == 0 else 2.0 - i / n for i in range(len(steps))]
    lr = data.draw(_st.one_of(_st.none(), _st.just([None if i % 5 else 1e-3 for i in range(len(steps))])))
    cfg = SuggestConfig(method=method, current=1.5)
    as_lists = (steps, norms, loss, lr)
    as_arrays = (step_array(steps), np.asarray(norms), masked_column(loss),
                 None if lr is None else masked_column(lr))
    f1, f2 = analyze_history(*as_lists), analyze_history(*as_arrays)
    assert repr(f1.as_dict()) == repr(f2.as_dict())
    s1 = suggest_threshold(*as_lists, config=cfg, facts=f1)
    s2 = suggest_threshold(*as_arrays, config=cfg, facts=f2)
    assert (repr(s1.threshold), s1.reason, repr(s1.evidence)) == (repr(s2.threshold), s2.reason,
                                                                   repr(s2.evidence))


def _torch_style_clipped_norms(seed, n, max_norm, dtype=np.float32):
    """The global norms a loop sees when it takes them after PyTorch's clip_grad_norm_: each step's
    gradients (three tensors) scaled by max_norm / (total + 1e-6) when that is below 1, then measured
    again in ``dtype`` (an independent float64 reference for the pre-clip total)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        grads = [rng.normal(0, s, size).astype(dtype) for s, size in ((0.02, 300), (0.05, 100), (0.3, 10))]
        grads = [g * dtype(np.exp(rng.normal(0, 0.6))) for g in grads]
        total = math.sqrt(sum(math.fsum(float(v) ** 2 for v in g) for g in grads))
        coef = max_norm / (total + 1e-6)
        if coef < 1:
            grads = [g * dtype(coef) for g in grads]
        out.append(float(np.sqrt(sum(np.sum(g * g, dtype=dtype) for g in grads), dtype=dtype)))
    return np.array(out)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_norms_taken_after_clipping_are_named(dtype):
    """A loop that logs (or a Recorder placed after) clip_grad_norm_ gives norms capped at max_norm: the
    threshold derived from them rests on a series whose spikes were cut off. The history says so."""
    x = _torch_style_clipped_norms(0, 400, 0.5, dtype)
    reference_at_cap = int(np.sum(x >= 0.5 * (1 - 1e-3)))
    assert reference_at_cap >= 40  # the premise: the cap is hit often
    facts = analyze_history(range(400), x)
    said = [w for w in facts.warnings if "after clipping" in w]
    assert len(said) == 1 and f"in {reference_at_cap} of 400 observations" in said[0]
    assert said[0].startswith(f"the norm is at its largest value, {float(x.max()):.6g},")


@pytest.mark.parametrize("seed", range(5))
def test_norms_not_clipped_are_not_called_clipped(seed):
    """The same gradients measured before clipping, a synthetic history with spikes, and series printed
    with few digits (each value repeated, the largest no more than the others) say nothing of clipping."""
    before = _torch_style_clipped_norms(seed, 400, math.inf)
    _, x, *_ = synthetic(seed)
    rounded = np.round(np.exp(np.random.default_rng(seed).normal(0, 0.2, 500)), 1)
    cyclic = np.array([1.0 + s % 3 for s in range(60)])
    for series in (before, x, rounded, cyclic):
        facts = analyze_history(range(len(series)), series)
        assert not [w for w in facts.warnings if "after clipping" in w]


@pytest.mark.skipif(not os.path.isdir(REAL), reason="../shared/real-logs not present")
def test_real_logs_are_not_called_clipped():
    """Every stack logs the norm before clipping: no real log may be taken for one logged after it."""
    for name in sorted(f for f in os.listdir(REAL) if f.endswith(".json")):
        h = read_norm_log(os.path.join(REAL, name))
        assert not [w for w in analyze_history(h.steps, h.norms).warnings if "after clipping" in w], name


def _per_tensor_reference(steps, series, facts, config, divisors=None, cap=None):
    """suggest_per_tensor as it was: every tensor's whole suggestion (evidence and all), and the clip
    rate of each tensor at its own τ counted tensor by tensor."""
    per = {}
    for name, values in series.items():
        t = suggest_threshold(steps, values, config=config, facts=facts).threshold
        per[name] = t / max(divisors.get(name, 1), 1) if t is not None and divisors else t
    found = {k: v for k, v in per.items() if v is not None}
    if not found:
        return None, per, None
    best_name = max(found, key=found.__getitem__)
    tau = min(found[best_name], cap) if cap is not None else found[best_name]
    if cap is not None and found[best_name] > cap:
        per = {k: (min(v, cap) if v is not None else None) for k, v in per.items()}
    hits = tot = 0
    for name, vals in series.items():
        if per.get(name) is None:
            continue
        v = np.asarray(vals, dtype=np.float64)[facts.window]
        if divisors:
            v = v / max(divisors.get(name, 1), 1)
        v = v[np.isfinite(v)]
        hits += int(np.sum(v > per[name]))
        tot += v.size
    return tau, per, hits / tot if tot else math.nan


_series_value = _st.one_of(_st.floats(1e-3, 1e3), _st.sampled_from([0.0, math.nan, math.inf, -1.0]))


@_settings(max_examples=150, deadline=None)
@_given(n=_st.integers(8, 40), tensors=_st.integers(1, 6), data=_st.data(),
        method=_st.sampled_from(["robust", "percentile", "zscore", "pascanu"]),
        cap=_st.one_of(_st.none(), _st.floats(0.1, 100)), divide=_st.booleans())
def test_per_tensor_thresholds_and_clip_rate_are_the_tensor_by_tensor_ones(n, tensors, data, method, cap, divide):
    """τ of each tensor without its evidence, and the per-tensor clip rate counted a block of tensors at
    a time, are what each tensor's whole suggestion and a count tensor by tensor give."""
    steps = list(range(n))
    rng = np.random.default_rng(data.draw(_st.integers(0, 2**16)))
    glob = np.exp(rng.normal(0, 0.3, n))
    series = {f"t{k}": np.array([data.draw(_series_value) if rng.random() < 0.2 else float(v)
                                  for v in np.exp(rng.normal(k * 0.2, 0.4, n))]) for k in range(tensors)}
    config = SuggestConfig(method=method, burn_in=0).validate()
    facts = analyze_history(steps, glob, burn_in=0, window=config.window)
    divisors = {name: k + 1 for k, name in enumerate(series)} if divide else None
    s, per = suggest_per_tensor(steps, series, facts, config, divisors=divisors, cap=cap)
    tau, per_ref, rate = _per_tensor_reference(steps, series, facts, config, divisors, cap)
    assert per == per_ref and s.threshold == tau
    if tau is not None and "clip_rate_window_per_tensor" in s.evidence:
        got = s.evidence["clip_rate_window_per_tensor"]
        assert got == rate or (math.isnan(got) and math.isnan(rate))
    for name, values in series.items():  # the τ without evidence is the τ with it
        whole = suggest_threshold(steps, values, config=config, facts=facts)
        bare = suggest_threshold(steps, values, config=config, facts=facts, with_evidence=False)
        assert bare.threshold == whole.threshold and bare.reason == whole.reason
        assert "spikes" not in bare.evidence


def _zscore_reference(v, z, alpha, warmup=25):
    """ZClip's EMA as written in the docs, in float64 Python floats (the square as a product)."""
    v = [float(a) for a in v]
    w0 = v[:warmup]
    mu = math.fsum(w0) / len(w0)
    var = math.fsum((a - mu) ** 2 for a in w0) / len(w0)
    for g in v[len(w0):]:
        sd = math.sqrt(var)
        if sd > 0 and (g - mu) / sd > z:
            g = mu + z * sd
        mu = alpha * mu + (1 - alpha) * g
        var = alpha * var + (1 - alpha) * (g - mu) * (g - mu)
    return mu + z * math.sqrt(var)


@_settings(max_examples=100, deadline=None)
@_given(rows=_st.integers(1, 40), width=_st.integers(1, 120), seed=_st.integers(0, 2**32 - 1),
        spiky=_st.booleans(), flat=_st.booleans())
def test_zscore_rows_are_the_one_row_ema_bit_for_bit(rows, width, seed, spiky, flat):
    """The EMA run down the columns for every row at once gives each row's value as the loop over one row
    does, to the bit (spikes fed back, a flat start of zero variance), and both are the float64 reference's
    to rounding."""
    from gradtool.suggest import _zscore, _zscore_rows

    rng = np.random.default_rng(seed)
    v = np.exp(rng.normal(0, 0.5, (rows, width)))
    if spiky:
        v[rng.random(v.shape) < 0.05] *= 100
    if flat:
        v[:, :25] = 1.0
    got = _zscore_rows(v, 2.5, 0.97)
    for r in range(rows):
        one = _zscore(v[r], 2.5, 0.97)[0]
        assert got[r] == one
        assert one == pytest.approx(_zscore_reference(v[r], 2.5, 0.97), rel=1e-9)


@_settings(max_examples=120, deadline=None)
@_given(n=_st.integers(8, 80), tensors=_st.integers(1, 40), data=_st.data(),
        method=_st.sampled_from(["robust", "percentile", "zscore", "pascanu"]),
        block=_st.integers(1, 50), explosion=_st.one_of(_st.none(), _st.floats(0.05, 20), _st.just(math.nan)))
def test_per_tensor_thresholds_in_blocks_are_each_series_own(n, tensors, data, method, block, explosion):
    """τ of series a block at a time (:func:`_thresholds_of_rows`: clean rows at once, the others one by
    one, blocks of any size) is each series' own suggest_threshold τ, to the bit: None where it has none
    (too few usable points, explosions at ordinary norms), the guard rails of a divergence applied."""
    import dataclasses

    from gradtool.suggest import _per_tensor_thresholds

    steps = list(range(n))
    rng = np.random.default_rng(data.draw(_st.integers(0, 2**16)))
    glob = np.exp(rng.normal(0, 0.3, n))
    rare = data.draw(_st.sampled_from([0.0, 0.01, 0.2]))
    series = {}
    for k in range(tensors):
        v = np.exp(rng.normal(rng.uniform(-1, 1), rng.uniform(0, 1), n))
        if rng.random() < 0.1:
            v = np.round(v, 1)  # ties, zeros
        v[rng.random(n) < rare] = data.draw(_series_value)
        series[f"t{k}"] = v if k % 3 else v.tolist()
    config = SuggestConfig(method=method, burn_in=data.draw(_st.sampled_from([None, 0]))).validate()
    facts = analyze_history(steps, glob, burn_in=config.burn_in, window=config.window)
    if explosion is not None:
        facts = dataclasses.replace(facts, divergence={"index": facts.healthy_end, "step": n, "norm": explosion,
                                                       "norm_before": data.draw(_st.sampled_from([None, 0.5, 3.0]))})
    want = {name: suggest_threshold(steps, v, config=config, facts=facts, with_evidence=False).threshold
            for name, v in series.items()}
    assert _per_tensor_thresholds(steps, series, facts, config, block=block) == want
    assert _per_tensor_thresholds(steps, series, facts, config) == want
    assert list(_per_tensor_thresholds(steps, series, facts, config, block=block)) == list(series)


# ---- the divergence detector's non-finite norms, decided in blocks (suggest._first_nonfinite_break) ------
def _divergence_one_by_one(x, L, given, steps, has_loss, w):
    """suggest._find_divergence as it was written before its non-finite norms were decided in blocks: each
    candidate in turn, three np.median calls a point (the reference for the block form)."""
    from gradtool.suggest import _finite_loss, _last_finite, _surge_breaks, _surges

    def loss_diverged(j):
        after = slice(j + 1, j + 1 + w)
        bad_after = given[after] & ~np.isfinite(L[after])
        if bad_after.any() and bad_after.sum() >= max(1, given[after].sum() // 2):
            return True, {"loss_after": "non-finite"}
        pre, post, tail = (_finite_loss(L, a, b) for a, b in ((j - w, j), (j + 1, j + 1 + w), (L.size - w, L.size)))
        if pre.size < 3 or post.size < 1:
            return False, {}
        p, q = float(np.median(pre)), float(np.median(post))
        t = float(np.median(tail)) if tail.size else math.nan
        return bool(q > p + 0.25 * abs(p) + 1e-12 and t > p + 0.1 * abs(p)), {
            "loss_before": p, "loss_after": q, "loss_at_end": t}

    n = x.size
    logs, base_m, surge = _surges(x)  # (the candidates: the same as the block form's)
    for j in np.flatnonzero(surge | ~np.isfinite(x)):
        j = int(j)
        if j < 1:
            continue
        if not np.isfinite(x[j]):
            rest = x[j: j + w]
            lasting = np.mean(~np.isfinite(rest)) >= 0.5 and rest.size >= 2
            loss_bad, info = loss_diverged(j) if has_loss else (False, {})
            if lasting or loss_bad or j == n - 1:
                return {"index": j, "step": steps[j], "norm": float(x[j]), "trigger": "non-finite norm",
                        "norm_before": _last_finite(x, j), **info}
            continue
        m = float(base_m[j])  # (a surge: as the block form decides it, not what is under test here)
        bad, info = _surge_breaks(x, logs, L, given, j, m, has_loss, w)
        if bad:
            return {"index": j, "step": steps[j], "norm": float(x[j]), "trigger": "norm surge",
                    "norm_before": float(math.exp(m)), **info}
    return "no break among the candidates"


_NORM_POINTS = _st.one_of(_st.floats(0.5, 2.0), _st.floats(0.5, 2.0), _st.floats(0.5, 2.0),
                          _st.sampled_from([math.nan, math.nan, math.inf, -math.inf, 0.0, 50.0, 1e3]))
_LOSS_POINTS = _st.one_of(_st.floats(1.0, 3.0), _st.sampled_from(
    [None, math.nan, math.inf, -math.inf, 1.0, 2.0, 2.0, 2.5, 3.0, -0.0, 0.0, -1.0]))


@_st.composite
def _broken_histories(draw):
    """(norms, loss or None): norms around 1 with NaN, inf, zeros and surges, alone or in runs (a loss scale
    collapsing); a loss that may step up (to 1.3-3x) and stay, with NaN, inf, ties and points not logged."""
    points = draw(_st.lists(_st.tuples(_NORM_POINTS, _LOSS_POINTS), min_size=2, max_size=300))
    runs = draw(_st.sampled_from([None, 1, 3, 17]))
    if runs:
        points = [(math.nan if i % (runs + 3) < runs else v, lo) for i, (v, lo) in enumerate(points)]
    if draw(_st.booleans()):
        at, factor = draw(_st.integers(0, len(points))), draw(_st.sampled_from([1.3, 1.0 + 2 ** -40, 3.0]))
        points = [(v, lo * factor if i >= at and lo is not None else lo) for i, (v, lo) in enumerate(points)]
    x = np.array([v for v, _ in points])
    return x, ([lo for _, lo in points] if draw(_st.booleans()) else None)


def _columns_of(x, loss):
    from gradtool.suggest import BLOCK, _optional_column

    L, given = _optional_column(loss, x.size)
    return L, given, np.isfinite(L).sum() >= 6, max(5, min(BLOCK, x.size // 10 or 5))


@_settings(max_examples=400, deadline=None)
@_given(_broken_histories())
def test_nonfinite_norms_decided_in_blocks_break_where_one_by_one_does(history):
    """_find_divergence, which decides its non-finite norms in blocks (running counts, row medians), finds
    the break a candidate at a time finds, with the same evidence (norm before, loss before, after and at
    the end): NaN and inf norms, alone or in runs, losses that are NaN, inf, not logged, jumping or tied."""
    from gradtool.suggest import _find_divergence

    x, loss = history
    L, given, has_loss, w = _columns_of(x, loss)
    steps = list(range(100, 100 + x.size))
    got = _find_divergence(x, L, given, steps, has_loss, w)
    want = _divergence_one_by_one(x, L, given, steps, has_loss, w)
    if want == "no break among the candidates":
        assert got is None or got["trigger"] == "non-finite loss"
    else:
        assert repr(got) == repr(want)


@_settings(max_examples=300, deadline=None)
@_given(_broken_histories(), _st.integers(1, 4))
def test_each_nonfinite_norm_breaks_or_not_as_one_by_one_decides(history, first):
    """_first_nonfinite_break on each non-finite norm alone says what the one-by-one detector says of it,
    and on all of them, in blocks of 1-4 growing fourfold, gives the first of those."""
    from gradtool.suggest import _first_nonfinite_break

    x, loss = history
    L, given, has_loss, w = _columns_of(x, loss)
    at = np.flatnonzero(~np.isfinite(x))
    at = at[at >= 1]
    breaks = []
    for j in at:
        only = np.zeros_like(x)  # the one-by-one detector on j alone: every other norm finite and level
        only[:] = 1.0
        only[j:] = np.where(np.isfinite(x[j:]), 1.0, x[j:])
        alone = _divergence_one_by_one(only, L, given, list(range(x.size)), has_loss, w)
        by_blocks = _first_nonfinite_break(x, L, given, np.array([j]), has_loss, w)
        assert (by_blocks == j) == (alone != "no break among the candidates" and alone["index"] == j)
        if by_blocks is not None:
            breaks.append(int(j))
    got = _first_nonfinite_break(x, L, given, at, has_loss, w, first=first)
    assert got == (breaks[0] if breaks else None)


@_settings(max_examples=300, deadline=None)
@_given(_st.lists(_st.one_of(_st.floats(-1e3, 1e3), _st.sampled_from([math.nan, math.inf, -math.inf, 0.0,
                                                                      -0.0, 1.0, 2.0])), max_size=60),
        _st.lists(_st.tuples(_st.integers(0, 70), _st.integers(0, 12)), min_size=1, max_size=20))
def test_window_medians_are_numpys_medians_of_the_finite_values(values, windows):
    """_window_medians gives, bit for bit, np.median of the finite values of each window (NaN for none),
    and their count: odd and even counts, windows past the end, empty ones, -0.0 beside 0.0."""
    from gradtool.suggest import _window_medians

    v = np.array(values, dtype=np.float64)
    lo = np.array([a for a, _ in windows])
    hi = np.array([a + k for a, k in windows])
    med, count = _window_medians(v, lo, hi, 12)
    for r, (a, k) in enumerate(windows):
        finite = v[a:a + k][np.isfinite(v[a:a + k])]
        assert count[r] == finite.size
        assert repr(float(med[r])) == repr(float(np.median(finite)) if finite.size else math.nan) or (
            med[r] == 0 and np.median(finite) == 0)  # -0.0 and 0.0 tie: either sign


def test_a_log_of_many_nonfinite_norms_breaks_where_the_first_lasting_run_starts():
    """A long log with a NaN norm every seventh step (skipped fp16 steps) and a run of them at the end:
    no isolated NaN breaks training, the run does, with the loss that turned non-finite after it."""
    n = 20_000
    x = np.exp(np.random.default_rng(7).normal(0, 0.2, n))
    x[:18_900:7] = np.nan
    x[19_000:] = np.nan
    loss = np.linspace(3, 2, n)
    loss[19_001:] = np.nan
    f = analyze_history(list(range(n)), x, list(loss))
    assert f.divergence["index"] == 19_000 and f.divergence["trigger"] == "non-finite norm"
    assert f.divergence["loss_after"] == "non-finite" and f.nonfinite_steps[:2] == [0, 7]


@pytest.mark.parametrize("after, end, breaks", [(2.54, 2.6, True), (2.5, 2.6, False), (2.6, 2.2, False),
                                                (2.6, 2.2000000000000006, True)])
def test_a_nonfinite_norm_breaks_when_the_loss_jumps_past_a_quarter_and_ends_above_a_tenth(after, end, breaks):
    """A lone NaN norm breaks training when the loss after it (median of w points) is more than 1.25x the
    loss before it (2.0) and the loss at the end more than 1.1x: at the bounds, by the same comparisons."""
    from gradtool.suggest import _first_nonfinite_break

    n, w = 200, 20
    x = np.ones(n)
    x[100] = np.nan
    loss = np.r_[np.full(100, 2.0), np.full(80, after), np.full(20, end)]
    got = _first_nonfinite_break(x, loss, np.ones(n, dtype=bool), np.array([100]), True, w)
    assert got == (100 if breaks else None)


@pytest.mark.parametrize("after, breaks", [(3.5, False), (4.5, True)])
def test_a_surge_without_a_loss_breaks_when_the_norms_after_it_stay_past_four_times_the_baseline(after, breaks):
    """With no loss logged, a surge breaks training when the median of the next norms is more than 4x the
    baseline (the block's median) — 3.5x is a burst that passed; or when most of them are non-finite."""
    from gradtool.suggest import _surge_breaks

    x = np.r_[np.ones(40), 100.0, np.full(20, after)]
    logs = np.log(x)
    assert _surge_breaks(x, logs, np.full(x.size, np.nan), np.zeros(x.size, bool), 40, 0.0, False, 10) == (breaks, {})
    x[41:46] = np.nan  # half of the next ten norms non-finite: broken whatever the rest
    assert _surge_breaks(x, np.log(x), np.full(x.size, np.nan), np.zeros(x.size, bool), 40, 0.0, False, 10)[0]


@pytest.mark.parametrize("sigmas, surge", [(5.5, False), (6.5, True)])
def test_a_surge_is_a_norm_more_than_six_robust_sigmas_above_the_block_before(sigmas, surge):
    """A point is a surge when its log norm is more than max(6 robust sigma, log 4) above the median of the
    previous full block (a block of wide spread: 6 sigma is the larger)."""
    from gradtool.suggest import BLOCK, MAD_TO_SIGMA, _surges

    spread = np.tile([-1.0, 1.0], BLOCK // 2)  # log norms ±1: median 0, MAD 1, sigma 1.4826
    logs = np.r_[spread, spread, [sigmas * MAD_TO_SIGMA]]
    _, _, surges = _surges(np.exp(logs))
    assert bool(surges[-1]) == surge and not surges[:-1].any()
