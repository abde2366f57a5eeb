"""Shared fixtures: the `xp` fixture runs numeric tests on every available Array API backend."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import settings

# CI runs the property tests on a fixed seed (HYPOTHESIS_PROFILE=ci, set by .ci/run): the same examples
# on every run, so a red CI is a regression, never a new draw; a failure prints the blob to reproduce it.
# Elsewhere each run draws new examples, and saves failing ones in .hypothesis/. Neither profile has a
# deadline: Hypothesis' default (200 ms an example) is a timing in a test, which a loaded machine can fail.
settings.register_profile("dev", deadline=None)
settings.register_profile("ci", derandomize=True, print_blob=True, database=None, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

from gradtool.cli.main import main

BACKENDS = ["numpy", "numpy-main", "array_api_strict"]  # numpy-main: NumPy's own namespace (the host fast paths')
if importlib.util.find_spec("cupy") is not None:  # pragma: no cover - only on GPU machines
    BACKENDS.append("cupy")


@pytest.fixture(params=BACKENDS)
def xp(request):
    if request.param == "numpy":
        import array_api_compat.numpy as m
    elif request.param == "numpy-main":
        from gradtool.backend import host_namespace

        m = host_namespace()
        if m is not np:
            pytest.skip("NumPy 1.x: the host fast paths use array_api_compat.numpy (the 'numpy' case)")
    elif request.param == "array_api_strict":
        m = pytest.importorskip("array_api_strict")
    else:  # pragma: no cover
        try:
            from gradtool.backend import get_namespace

            m = get_namespace("cupy")
        except Exception as exc:
            pytest.skip(f"cupy unusable here: {exc}")
    return m


def to_np(a) -> np.ndarray:
    from gradtool.backend import to_host

    return np.asarray(to_host(a))


@pytest.fixture
def tmp(tmp_path):
    return tmp_path


class Result:
    def __init__(self, code, stdout, stderr):
        self.exit_code, self.stdout, self.stderr = code, stdout, stderr

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def run():
    """Run the real main() (error mapping included) in-process; stdout and stderr kept apart."""

    def _run(*args, input=None):
        import click

        @click.command()
        def entry():  # main() itself, so its error-to-exit-code mapping is under test too
            main(list(args))

        r = CliRunner().invoke(entry, [], input=input, catch_exceptions=False)
        return Result(r.exit_code, r.stdout, r.stderr)

    return _run


