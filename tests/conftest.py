"""Shared fixtures: the `xp` fixture runs numeric tests on every available Array API backend."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

BACKENDS = ["numpy", "array_api_strict"]
if importlib.util.find_spec("cupy") is not None:  # pragma: no cover - only on GPU machines
    BACKENDS.append("cupy")


@pytest.fixture(params=BACKENDS)
def xp(request):
    if request.param == "numpy":
        import array_api_compat.numpy as m
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
