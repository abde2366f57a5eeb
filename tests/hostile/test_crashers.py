"""Replays every input the fuzzer (fuzz/fuzz_readers.py) ever crashed on: each must now fail cleanly."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CRASHERS = os.path.join(HERE, "crashers")
FILES = sorted(f for f in os.listdir(CRASHERS) if not f.endswith(".txt")) if os.path.isdir(CRASHERS) else []


@pytest.mark.parametrize("name", FILES)
def test_crasher_is_fixed(name, tmp_path):
    sys.path.insert(0, os.path.join(HERE, "..", "..", "fuzz"))
    from fuzz_readers import check

    with open(os.path.join(CRASHERS, name), "rb") as f:
        data = f.read()
    check(data, name.rsplit(".", 1)[1], str(tmp_path))


def test_fuzz_harness_smoke(tmp_path):
    """A few seconds of the fuzzer itself, so the harness cannot rot."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "fuzz"))
    from fuzz_readers import run_random

    execs, crashes = run_random(2.0, seed=1)
    assert execs > 20 and crashes == 0
