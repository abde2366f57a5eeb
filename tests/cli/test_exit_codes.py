"""Walk the exit-code table: every documented code has a scenario that produces it, and the README and
`gradtool --help` list exactly the table in gradtool/errors.py."""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

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


def _interrupted_exit_code(tmp_path) -> int:
    big = str(tmp_path / "big.npz")
    save_dump(big, {f"w{i}": np.ones((1024, 1024), np.float32) for i in range(60)})
    out = tmp_path / "int.npz"
    exe = os.path.join(os.path.dirname(sys.executable), "gradtool")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "gradtool"]
    proc = subprocess.Popen(cmd + ["clip", big, "-o", str(out), "--mode", "global-norm", "--max", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.4)
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


def test_readme_and_help_list_the_table(run):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = sorted(int(c) for c in re.findall(r"^\| (\d+) \|", section, flags=re.M))
    assert documented == sorted(code for code, _ in EXIT_CODE_TABLE)
    helptext = run("--help").stdout
    for code, text in EXIT_CODE_TABLE:
        assert re.search(rf"^\s+{code}\s", helptext, flags=re.M), code
