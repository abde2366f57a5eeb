"""Choosing one run of a store of several (--run NAME|ID|latest): the pure rule under the readers."""

import pytest

from gradtool.errors import UsageError
from gradtool.io.runs import Run, choose_run, newest_first

RUNS = [Run("3f2a9c1e00", "bright-owl-7", 1_763_630_520.0), Run("3f2b000000", "calm-fox-2", 1_763_716_920.0),
        Run("aaaa", "aaaa"), Run("bbbb0000", "calm-fox-2", 1_763_700_000.0)]


def test_labels_and_order():
    assert RUNS[0].label() == "'bright-owl-7' (3f2a9c1e, 2025-11-20 09:22 UTC)"
    assert RUNS[2].label() == "'aaaa'"  # the ID is the name; no start known
    assert [r.id for r in newest_first(RUNS)] == ["3f2b000000", "bbbb0000", "3f2a9c1e00", "aaaa"]


@pytest.mark.parametrize("wanted, chosen", [("bright-owl-7", "3f2a9c1e00"), ("3f2a", "3f2a9c1e00"),
                                            ("latest", "3f2b000000"), ("bbbb0000", "bbbb0000"),
                                            ("aaaa", "aaaa")])
def test_a_run_is_chosen_by_id_name_prefix_or_latest(wanted, chosen):
    assert choose_run(RUNS, wanted, "s", "runs").id == chosen


@pytest.mark.parametrize("wanted, message", [
    (None, r"s: holds 4 runs \('calm-fox-2' \(3f2b0000, .*\), 'calm-fox-2' \(bbbb0000, .*\), "
           r"'bright-owl-7' .*, 'aaaa'\); choose one with --run NAME, --run ID or --run latest"),
    ("calm-fox-2", r"2 runs are named 'calm-fox-2' .*; choose one by its ID"),
    ("3f", r"--run '3f' is the start of 2 run IDs"),
    ("zzz", r"no run 'zzz' among its 4 runs")])
def test_what_cannot_be_chosen_is_a_usage_error_listing_the_runs(wanted, message):
    with pytest.raises(UsageError, match=message):
        choose_run(RUNS, wanted, "s", "runs")


def test_one_run_needs_no_choice_and_none_is_an_error():
    assert choose_run(RUNS[:1], None, "s", "runs") is RUNS[0]
    with pytest.raises(UsageError, match="s: holds no runs"):
        choose_run([], None, "s", "runs")
