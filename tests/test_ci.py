"""What CI relies on: property tests on a fixed seed there (a red CI is a regression, not a new draw)."""

import os

from hypothesis import settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ci_runs_the_property_tests_on_a_fixed_seed():
    profile = settings.get_profile("ci")
    assert profile.derandomize and profile.database is None
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert "export HYPOTHESIS_PROFILE=ci" in ci
    assert ci.index("export HYPOTHESIS_PROFILE=ci") < ci.index("python -m pytest")
