"""The Dask engine gives the local engine's results, and survives a worker that dies mid-run."""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import numpy as np
import pytest

from gradtool import save_dump

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster():
    from dask.distributed import Client, LocalCluster

    os.environ["GRADTOOL_TEST_TASK_DELAY"] = "0.15"  # inherited by the workers: tasks last long enough to kill one
    try:
        c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=50)
    finally:
        os.environ.pop("GRADTOOL_TEST_TASK_DELAY", None)
    client = Client(c)
    yield client
    client.close()
    c.close()


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    d = tmp_path_factory.mktemp("hist")
    rng = np.random.default_rng(0)
    for s in range(16):
        save_dump(str(d / f"step_{s:03d}.npz"), {"w": rng.standard_normal((300, 200)).astype(np.float32),
                                                  "b": rng.standard_normal(7).astype(np.float64),
                                                  "n": np.array([1.0, np.nan] if s == 5 else [1.0, 2.0])})
    return str(d)


def _same(a, b):
    assert [x.step for x in a] == [x.step for x in b]
    for x, y in zip(a, b):
        assert x.global_norm == y.global_norm or (math.isnan(x.global_norm) and math.isnan(y.global_norm))
        for (n1, s1), (n2, s2) in zip(x.tensors, y.tensors):
            assert n1 == n2 and s1.size == s2.size and s1.nan_count == s2.nan_count and s1.zero_count == s2.zero_count
            for k in ("norm", "mean", "std", "max_abs"):
                u, v = getattr(s1, k), getattr(s2, k)
                assert (u is None and v is None) or math.isnan(u) and math.isnan(v) or math.isclose(u, v, rel_tol=1e-12), (n1, k)


def test_dask_equals_local(cluster, history, tmp_path):
    from gradtool.engine import _summarize_dask, summarize_refs
    from gradtool.io.history import expand_inputs

    refs = expand_inputs([history])
    _same(summarize_refs(refs), _summarize_dask(refs, (), (), 2.0, None, None, client=cluster))
    # sharded steps: partials of every shard merge on the client
    from tests.sharded.test_sharded import make_run

    flat, sharded = make_run(tmp_path)
    srefs = expand_inputs([sharded])
    _same(summarize_refs(srefs), _summarize_dask(srefs, (), (), 2.0, None, None, client=cluster))


def test_a_worker_dying_mid_run_is_survived(cluster, history):
    from gradtool.engine import _summarize_dask, summarize_refs
    from gradtool.io.history import expand_inputs

    refs = expand_inputs([history])
    result: dict = {}

    def work():
        result["dask"] = _summarize_dask(refs, (), (), 2.0, None, None, client=cluster)

    t = threading.Thread(target=work)
    t.start()
    time.sleep(0.5)
    pids = cluster.run(os.getpid)
    victim = sorted(pids.values())[0]
    os.kill(victim, signal.SIGKILL)  # the nanny restarts it; the scheduler reruns its tasks
    t.join(timeout=120)
    assert not t.is_alive()
    assert len(result["dask"]) == 16
    _same(summarize_refs(refs), result["dask"])


def test_cli_engine_dask_equals_local(run, history):
    a = run("stats", history, "--format", "json").json()["dumps"]
    b = run("stats", history, "--format", "json", "--engine", "dask").json()["dumps"]
    assert [x["global_norm"] for x in a] == [x["global_norm"] for x in b]
    r = run("stats", history, "--engine", "dask", "--scheduler", "tcp://127.0.0.1:1")
    assert r.exit_code == 2 and "scheduler" in r.stderr


def test_a_dump_history_on_dask_is_the_local_one(cluster, history):
    """suggest-threshold's series (``dump_history``) from the Dask engine's summaries, as from the local
    engine's summaries taken one at a time."""
    from gradtool.io.history import expand_inputs
    from gradtool.summarize import dump_history

    local = dump_history(expand_inputs([history], resolve_steps=False))
    far = dump_history(expand_inputs([history], resolve_steps=False), engine="dask",
                       scheduler=cluster.scheduler.address)
    assert (far.steps, far.tensor_sizes, far.repeated_steps) == (local.steps, local.tensor_sizes, [])
    np.testing.assert_allclose(far.global_norms, local.global_norms, rtol=1e-12)
    for name in local.tensor_norms:
        np.testing.assert_allclose(far.tensor_norms[name], local.tensor_norms[name], rtol=1e-12)
        np.testing.assert_array_equal(far.tensor_max_abs[name], local.tensor_max_abs[name])
    assert math.isnan(local.tensor_norms["n"][5]) and local.steps == list(range(16))
