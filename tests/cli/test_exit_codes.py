"""Walk the exit-code table: every documented code has a scenario that produces it, and the README and
`gradtool --help` list exactly the table in gradtool/errors.py."""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gradtool import save_dump
from gradtool.errors import EXIT_CODE_TABLE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_code_has_a_scenario(run, dump, nan_dump, tmp_path):
    seen = {}
    seen[0] = run("stats", dump).exit_code
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04junk")
    seen[1] = run("stats", str(bad)).exit_code
    seen[2] = run("clip", dump, "-o", str(tmp_path / "o.npz"), "--mode", "norm", "--max", "-1").exit_code
    seen[3] = run("stats", "--fail-on-nonfinite", nan_dump).exit_code
    short = tmp_path / "short.csv"
    short.write_text("step,grad_norm\n1,1.0\n2,1.1\n")
    seen[4] = run("suggest-threshold", str(short)).exit_code
    seen[130] = _interrupted_exit_code(tmp_path)
    assert seen == {code: code for code, _ in EXIT_CODE_TABLE}


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child: SIGINT as a shell's foreground command has it. A test run started in the background
    of a non-interactive shell (`bash .ci/run &`) inherits SIGINT ignored, as POSIX asks of asynchronous
    commands, and Python then keeps ignoring it: the child would never see the Ctrl-C (it hung there)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupted_exit_code(tmp_path) -> int:
    big = str(tmp_path / "big.npz")
    save_dump(big, {f"w{i}": np.ones((1024, 1024), np.float32) for i in range(60)})
    out = tmp_path / "int.npz"
    exe = os.path.join(os.path.dirname(sys.executable), "gradtool")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "gradtool"]
    proc = subprocess.Popen(cmd + ["clip", big, "-o", str(out), "--mode", "global-norm", "--max", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)
    # interrupt while the output is being written (its temp file exists), not during start-up: that
    # window is test_ctrl_c_during_start_up's, and a fixed delay hit it on a slow machine
    deadline = time.monotonic() + 60
    while (proc.poll() is None and time.monotonic() < deadline
           and not [f for f in os.listdir(tmp_path) if f.endswith(".gradtool-tmp")]):
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    code = proc.wait()
    stderr = proc.stderr.read()
    if code == 0:  # finished before the signal: nothing to check on this machine
        return 130
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".gradtool-tmp")]
    if out.exists():  # the signal came after the rename: the output must then be complete
        from gradtool import open_dump

        with open_dump(str(out)) as r:
            assert len(r.names) == 60 and all(r.read(n).size == 1 << 20 for n in r.names)
    return code


INTERRUPT_IMPORT = """
import runpy, sys

class CtrlC:  # Ctrl-C while {module} is being imported, at start-up
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["gradtool", "stats", {dump!r}]
{launch}
"""


@pytest.mark.parametrize("module", ["click", "numpy", "gradtool.cli.stats"])
@pytest.mark.parametrize("launch", ["from gradtool.cli import run; run()",
                                    "runpy.run_module('gradtool', run_name='__main__')"])
def test_ctrl_c_during_start_up(dump, module, launch):
    """Ctrl-C before the command's modules are loaded: the same one line and exit code 130 as later on,
    through the console script's function and through `python -m gradtool`, not a traceback."""
    code = INTERRUPT_IMPORT.format(module=module, dump=dump, launch=launch)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # (inside a command click writes a newline first, after the terminal's "^C")
    assert (r.returncode, r.stderr.lstrip("\n")) == (130, "gradtool: error: interrupted\n")
    assert r.stdout == ""


def test_ctrl_c_while_standard_input_is_spooled_leaves_no_copy(dump, tmp_path):
    """`producer | gradtool stats -` copies the stream to a temporary file first; Ctrl-C while the
    producer is still writing removes that copy (it can be gigabytes) and exits 130."""
    spool_dir = tmp_path / "tmp"
    spool_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "gradtool", "stats", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": str(spool_dir)}, preexec_fn=_ctrl_c_as_in_a_terminal)
    proc.stdin.write(open(dump, "rb").read()[:100])  # the producer has more to come: stdin stays open
    proc.stdin.flush()

    def spooled():  # the copy; not tempfile's own probe file, which gettempdir() makes and removes first
        return [f for f in os.listdir(spool_dir) if f.startswith("gradtool-stdin-")]

    deadline = time.monotonic() + 60
    while not spooled() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    if not spooled():  # say why
        ended = proc.poll()
        proc.kill()
        why = (f"gradtool exited {ended} first: {proc.stderr.read().decode()!r}" if ended is not None
               else "not within 60 s")
        pytest.fail(f"the spool file never appeared ({why})")
    time.sleep(0.05)  # into the copy loop, waiting for more input
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=60)
    proc.stdin.close()
    stderr = proc.stderr.read().decode()
    assert code == 130 and "interrupted" in stderr and "Traceback" not in stderr
    assert os.listdir(spool_dir) == []


def test_console_script_is_the_interrupt_safe_entry_point():
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="gradtool")
    assert script.value == "gradtool.cli:run"


def test_readme_and_help_list_the_table(run):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = sorted(int(c) for c in re.findall(r"^\| (\d+) \|", section, flags=re.M))
    assert documented == sorted(code for code, _ in EXIT_CODE_TABLE)
    helptext = run("--help").stdout
    for code, text in EXIT_CODE_TABLE:
        assert re.search(rf"^\s+{code}\s", helptext, flags=re.M), code


def test_a_selection_that_matches_nothing_is_a_usage_error(run, dump, history, tmp_path):
    """A mistyped --select used to give 'global norm 0 over 0 tensors' (stats), 'zero norms at every
    step' and no threshold (suggest-threshold), or an unclipped copy (clip), all with exit 0 or 4."""
    out = str(tmp_path / "out.npz")
    for args in (["stats", dump], ["clip", dump, "-o", out, "--mode", "norm", "--max", "1"],
                 ["suggest-threshold", history], ["stats", history]):
        r = run(*args, "--select", "atn*")
        assert r.exit_code == 2, (args, r.stderr)
        assert r.stderr.startswith("gradtool: error: --select 'atn*' leaves no tensor in ")
        assert "tensor names there look like: " in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not os.path.exists(out)
    r = run("stats", history, "--exclude", "*")
    assert r.exit_code == 2 and "--exclude '*' leaves no tensor in any of the 6 dumps" in r.stderr
    # a selection that matches in some step of a history is fine (a tensor that appears later in training)
    late = tmp_path / "late"
    late.mkdir()
    save_dump(str(late / "step_1.npz"), {"a": np.ones(2)})
    save_dump(str(late / "step_2.npz"), {"a": np.ones(2), "b": np.full(2, 3.0)})
    r = run("stats", str(late), "--select", "b", "--format", "json")
    assert r.exit_code == 0 and [d["num_tensors"] for d in r.json()["dumps"]] == [0, 1]
    assert run("stats", dump, "--select", "attn*", "--format", "json").json()["dumps"][0]["num_tensors"] == 1


def test_one_mistyped_glob_among_several_is_warned_about(run, dump, history, tmp_path):
    cases = ((["stats", dump], "tensor", ["atn*", "w"]),
             (["clip", dump, "--dry-run", "--mode", "norm", "--max", "1"], "floating-point tensor", ["atn*", "w"]),
             (["suggest-threshold", history, "--mode", "norm", "--burn-in", "0", "--window", "8"],
              "floating-point tensor", ["a/*", "atn*"]))
    for args, what, unmatched in cases:
        r = run(*args, "--select", "a/*", "--select", "atn*", "--select", "w")
        assert r.exit_code in (0, 4), r.stderr
        warned = [line for line in r.stderr.splitlines() if "warning" in line]
        assert warned == [f"gradtool: warning: --select '{g}' matched no {what}" for g in unmatched], r.stderr
    r = run("stats", dump, "--select", "a/*", "--select", "attn*")  # every glob matches: no warning
    assert r.exit_code == 0 and r.stderr == ""


def test_a_mistyped_exclude_is_warned_about(run, dump, history, tmp_path):
    """A mistyped --exclude left in the tensors it was to leave out, with no word: the global norm the user
    reads is then over the wrong tensors. Judged on the first dump with a selected tensor (its index only)."""
    first = os.path.join(history, "step_000.npz") + " (the first dump)"
    cases = ((["stats", dump], dump), (["clip", dump, "--dry-run", "--mode", "norm", "--max", "1"], dump),
             (["suggest-threshold", history, "--burn-in", "0", "--window", "8"], first))
    for args, label in cases:
        r = run(*args, "--exclude", "atn*", "--exclude", "w", "--exclude", "a/*")
        assert r.exit_code in (0, 4), r.stderr
        warned = [line for line in r.stderr.splitlines() if "warning" in line]
        bad = ["atn*", "w"] if label != first else ["atn*", "a/*"]
        assert warned == [f"gradtool: warning: --exclude '{g}' matches no tensor of {label}; nothing is left "
                          "out by it" for g in bad], r.stderr
    # an exclusion inside what --select kept is judged there: 'attn*' excludes nothing --select 'a/*' kept
    r = run("stats", dump, "--select", "a/*", "--exclude", "attn*")
    assert "--exclude 'attn*' matches no tensor" in r.stderr
    r = run("stats", dump, "--exclude", "attn*", "--exclude", "count")  # each matches: no warning
    assert r.exit_code == 0 and r.stderr == ""
