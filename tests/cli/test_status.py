"""The spinner shown while a training log is read: on a terminal's stderr only, gone when the read ends."""

import io
import sys

import pytest

from gradtool.cli import common


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_status_spins_on_a_terminal_only(monkeypatch, terminal):
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with common.status("reading run.log"):
        pass
    assert ("reading run.log" in err.getvalue()) is terminal


def test_suggest_threshold_says_which_log_it_reads(monkeypatch, tmp_path, capsys):
    """A terminal's stderr shows "reading LOG" while suggest-threshold reads it; the answer is unchanged."""
    from click.testing import CliRunner

    from gradtool.cli.main import cli

    log = tmp_path / "train.jsonl"
    log.write_text("".join(f'{{"step": {i}, "grad_norm": {1 + i % 7}}}\n' for i in range(200)))
    plain = CliRunner().invoke(cli, ["suggest-threshold", str(log), "--format", "value"])
    shown = []
    real = common.status

    def spy(description):
        shown.append(description)
        return real(description)

    monkeypatch.setattr(common, "status", spy)
    import gradtool.cli.suggest as suggest_cli

    monkeypatch.setattr(suggest_cli, "status", spy)
    again = CliRunner().invoke(cli, ["suggest-threshold", str(log), "--format", "value"])
    assert plain.exit_code == again.exit_code == 0 and plain.output == again.output
    assert shown == [f"reading {log}"]
