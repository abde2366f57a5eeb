"""The JSON renderer's fast paths (the C encoder on the document as it is, msgspec laying out the
indentation) give exactly the text of the simple definition, json.dumps(strict(doc), indent=...)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool.cli import render

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.floats(width=32).map(np.float32), st.integers(-(2**40), 2**40).map(np.int64),
    st.booleans().map(np.bool_))
_docs = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=8), inner, max_size=5)), max_leaves=40)


def _reference(doc, indent):
    return json.dumps(render.strict(doc), allow_nan=False, indent=indent, ensure_ascii=False)


@settings(max_examples=300, deadline=None)
@given(doc=_docs, indent=st.sampled_from([None, 2, 4]), msgspec=st.booleans())
def test_dumps_json_is_the_simple_definition(doc, indent, msgspec):
    """With msgspec laying out every document (threshold 0), and without it."""
    if msgspec:
        pytest.importorskip("msgspec")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(render, "MSGSPEC_LAYOUT_BYTES", 0)
        if not msgspec:
            m.setattr(render, "_msgspec_layout", lambda: None)
        assert render.dumps_json(doc, indent=indent) == _reference(doc, indent)


def test_a_big_document_is_laid_out_by_msgspec_and_a_small_one_is_not(monkeypatch):
    pytest.importorskip("msgspec")
    calls = []
    real = render._msgspec_layout
    monkeypatch.setattr(render, "_msgspec_layout", lambda: calls.append(1) or real())
    monkeypatch.delitem(__import__("sys").modules, "msgspec", raising=False)
    small = {"tensors": [{"name": "w", "norm": 1.5}]}
    big = {"tensors": [{"name": f"t{i}", "norm": i / 7, "shape": [i, 3]} for i in range(10_000)]}
    assert render.dumps_json(small) == _reference(small, 2) and calls == []
    assert render.dumps_json(big) == _reference(big, 2) and calls == [1]


def test_non_finite_floats_and_numpy_scalars_are_still_strict():
    doc = {"a": float("nan"), "b": [float("inf"), -float("inf")], "c": np.float32(0.5), "d": (1, np.int64(2))}
    assert json.loads(render.dumps_json(doc)) == {"a": "NaN", "b": ["Infinity", "-Infinity"], "c": 0.5, "d": [1, 2]}
