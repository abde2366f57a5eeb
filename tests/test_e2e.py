"""End to end: the README's commands on sample_data/, through the real installed entry point."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "sample_data")
SPIKES = {365, 366}  # the mid-training explosion of the sample run (step 1 is the initialisation transient)


def gradtool_exe() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "gradtool")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "gradtool"]


def sh(cmd: str, cwd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=os.path.dirname(gradtool_exe()[0]) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def workdir(tmp_path):
    shutil.copytree(SAMPLE, tmp_path / "sample_data")
    return str(tmp_path)


def gt(args: list[str], cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(gradtool_exe() + args, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_entry_point_installed():
    r = subprocess.run(gradtool_exe() + ["--version"], capture_output=True, text=True)
    assert r.returncode == 0 and "gradtool" in r.stdout
    from importlib.util import find_spec

    assert ("compiled stats kernel: built" in r.stdout) == (find_spec("gradtool.core._kernels") is not None)
    if find_spec("gradtool.core._kernels") is not None and not os.environ.get("GRADTOOL_NO_KERNELS"):
        from gradtool.core._kernels import SIMD

        assert f"compiled stats kernel: built, {SIMD};" in r.stdout  # the SIMD build this CPU runs
    built = find_spec("gradtool.io._logscan") is not None
    assert ("(W&B, TensorBoard, MLflow, Trackio, JSON Lines, CSV, text): built" in r.stdout) == built
    inflater = find_spec("gradtool.io._inflate_many") is not None
    assert ("compiled npz inflater: built" in r.stdout) == inflater
    assert ("python-isal" in r.stdout) == (find_spec("isal") is not None)
    assert ("msgspec" in r.stdout) == (find_spec("msgspec") is not None)


def test_nan_dump_fails_stats(workdir):
    r = gt(["stats", "--fail-on-nonfinite", "sample_data/nan_step.npz"], workdir)
    assert r.returncode == 3 and "rnn/W_hh" in r.stderr
    assert gt(["stats", "--fail-on-nonfinite", "sample_data/run.h5"], workdir).returncode == 0


def test_suggested_threshold_clips_the_spikes_and_few_others_then_stats_confirms(workdir):
    r = gt(["suggest-threshold", "sample_data/run.h5", "--mode", "global-norm", "--format", "value"], workdir)
    assert r.returncode == 0, r.stderr
    tau = float(r.stdout)
    before = json.loads(gt(["stats", "sample_data/run.h5", "--format", "json"], workdir).stdout)["dumps"]
    above = {d["step"] for d in before if d["global_norm"] > tau}
    assert SPIKES <= above
    assert len(above) <= 0.05 * len(before)
    r = gt(["clip", "sample_data/run.h5", "-o", "clipped.h5", "--mode", "global-norm", "--max", repr(tau),
            "--format", "json"], workdir)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)["dumps"]
    assert {d["step"] for d in report if d["clipped_tensors"]} == above
    after = json.loads(gt(["stats", "clipped.h5", "--format", "json"], workdir).stdout)["dumps"]
    assert all(d["global_norm"] <= tau * (1 + 1e-6) for d in after)
    # steps that were not clipped are bit-identical
    import h5py

    with h5py.File(os.path.join(workdir, "sample_data/run.h5")) as a, h5py.File(os.path.join(workdir, "clipped.h5")) as b:
        for d in before:
            if d["step"] in above:
                continue
            g = d["group"]
            for name in a[g]:
                if isinstance(a[g][name], h5py.Group):
                    for leaf in a[g][name]:
                        assert a[g][name][leaf][()].tobytes() == b[g][name][leaf][()].tobytes()


def test_json_pipeline_through_jq_or_python(workdir):
    if shutil.which("jq"):
        r = sh("gradtool stats sample_data/dumps --format json | jq -r '.dumps[].step'", workdir)
        steps = [int(x) for x in r.stdout.split()]
    else:
        r = sh("gradtool stats sample_data/dumps --format json | "
               f"{sys.executable} -c 'import json,sys; [print(d[\"step\"]) for d in json.load(sys.stdin)[\"dumps\"]]'",
               workdir)
        steps = [int(x) for x in r.stdout.split()]
    assert r.returncode == 0, r.stderr
    assert sorted(set(steps)) == [33, 365, 366]


def test_clip_to_stdout_into_stats_from_stdin(workdir):
    r = sh("gradtool clip sample_data/dumps/step_00366.npz -o - --mode global-norm --max 1 --format json 2>/dev/null "
           "| gradtool stats - --format json", workdir)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["dumps"][0]["global_norm"] == pytest.approx(1.0, rel=1e-6)


def test_find_xargs_recipe(workdir):
    r = sh("find sample_data/dumps -name 'step_*.safetensors' -print0 | xargs -0 gradtool stats --format csv", workdir)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("path,") and len(lines) == 1 + 3 * 5


def test_logs_of_the_sample_run_agree_with_the_dumps(workdir):
    a = float(gt(["suggest-threshold", "sample_data/run.h5", "--mode", "global-norm", "--format", "value"], workdir).stdout)
    b = float(gt(["suggest-threshold", "sample_data/trainer_state.json", "--format", "value"], workdir).stdout)
    c = float(gt(["suggest-threshold", "sample_data/metrics.csv", "--format", "value"], workdir).stdout)
    assert a == pytest.approx(b, rel=1e-6) and b == pytest.approx(c, rel=1e-12)


def _console_blocks(readme: str) -> list[tuple[str, str]]:
    """(command, expected output) for each ```console block of the README whose command is one line."""
    out = []
    for block in re.findall(r"```console\n(.*?)```", readme, flags=re.S):
        lines = block.rstrip("\n").split("\n")
        cmd_lines = []
        while lines and (lines[0].startswith("$ ") or (cmd_lines and cmd_lines[-1].endswith("\\"))):
            cmd_lines.append(lines.pop(0).removeprefix("$ "))
        out.append(("\n".join(cmd_lines), "\n".join(lines)))
    return out


def test_readme_walkthrough_output_is_real(workdir):
    """The README shows output copied from a real run: re-run every console block and compare."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    blocks = _console_blocks(readme)
    assert len(blocks) >= 5
    for cmd, expected in blocks:
        r = sh("{ " + cmd + "\n} 2>&1", workdir)
        got = "\n".join(line.rstrip() for line in r.stdout.rstrip("\n").split("\n"))
        want = "\n".join(line.rstrip() for line in expected.rstrip("\n").split("\n"))
        assert got == want, f"README block differs for: {cmd}\n--- got ---\n{got}\n--- README ---\n{want}"


def test_sample_data_is_what_the_script_documents():
    import gradtool

    with gradtool.open_dump(os.path.join(SAMPLE, "nan_step.npz")) as r:
        assert any(np.isnan(r.read(n)).any() for n in r.names)
    from gradtool.io.history import expand_inputs

    refs = expand_inputs([os.path.join(SAMPLE, "run.h5")])
    assert [r.step for r in refs] == list(range(1, 401))
    sizes = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(SAMPLE) for f in fs)
    assert sizes < 8 * 1024 * 1024


def _after_command(args: list[str], cwd: str, report: str, env: dict[str, str] | None = None,
                   unset: tuple[str, ...] = ()) -> str:
    """What ``report`` (a Python expression) says in a fresh interpreter after it ran ``gradtool ARGS``
    successfully (the entry point's own code path; its output, not a terminal, is discarded), with the
    variables ``unset`` taken out of the environment and ``env`` added to it."""
    environ = {k: v for k, v in os.environ.items() if k not in unset}
    probe = ("import io, os, sys, contextlib\n"
             "from gradtool.cli.main import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    try:\n"
             "        main(sys.argv[1:])\n"
             "    except SystemExit as e:\n"
             "        assert e.code in (0, None), e.code\n"
             f"sys.__stdout__.write(str({report}))\n")
    out = subprocess.run([sys.executable, "-c", probe, *args], cwd=cwd, capture_output=True, text=True,
                         timeout=120, env={**environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    return out.stdout


def _modules_after(args: list[str], cwd: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules imported after ``gradtool ARGS`` (:func:`_after_command`), rich's FORCE_COLOR and
    TTY_COMPATIBLE taken out of the environment."""
    report = "' '.join(sorted(sys.modules))"
    return set(_after_command(args, cwd, report, env, ("FORCE_COLOR", "TTY_COMPATIBLE")).split())


def test_start_up_imports_stay_lazy(tmp_path):
    """Target 6 of the performance issue: heavy modules are imported only by the commands that use them.
    ``--help`` needs click alone; reading a safetensors dump for JSON needs neither h5py, rich (tables),
    array-api-compat's NumPy wrapper (which star-imports all of NumPy's submodules; device backends only),
    msgspec, nor the modules that only writing dumps uses."""
    from gradtool import save_dump

    path = str(tmp_path / "d.safetensors")
    save_dump(path, {"w": np.ones(10, np.float32)})
    help_modules = _modules_after(["--help"], str(tmp_path))
    assert not help_modules & {"numpy", "h5py", "rich", "array_api_compat"}, help_modules
    stats_modules = _modules_after(["stats", path, "--format", "json"], str(tmp_path))
    assert "numpy" in stats_modules  # the probe really ran the command
    heavy = {"h5py", "rich", "array_api_compat.numpy", "msgspec", "tempfile", "zipfile", "ml_dtypes"}
    assert not stats_modules & heavy, stats_modules & heavy


@pytest.mark.parametrize("env,expected", [({}, "1"), ({"OPENBLAS_NUM_THREADS": "2"}, "2"),
                                          ({"OMP_NUM_THREADS": "2"}, None), ({"OPENBLAS_NUM_THREADS": ""}, "1")])
def test_the_command_line_asks_openblas_for_no_threads_of_its_own(tmp_path, env, expected):
    """OpenBLAS's threads, started at NumPy's import, spun through a run's first ~0.1 s and took a core
    from gradtool's own two (clip of 500 MB 0.264 -> 0.234 s): the command line sets
    OPENBLAS_NUM_THREADS=1 before NumPy is imported, unless the user chose a number (OpenBLAS's variables:
    OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, OMP_NUM_THREADS). Then NumPy's import starts no thread (Linux:
    the process's threads counted)."""
    from gradtool import save_dump

    path = str(tmp_path / "d.safetensors")
    save_dump(path, {"w": np.ones(10, np.float32)})
    report = ("(os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in sys.modules, "
              "len(os.listdir('/proc/self/task')) if os.path.isdir('/proc/self/task') else 1)")
    got = _after_command(["stats", path, "--format", "json"], str(tmp_path), report, env,
                         ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"))
    import ast

    value, numpy_imported, tasks = ast.literal_eval(got)
    assert numpy_imported
    assert value == expected
    if expected == "1":
        assert tasks == 1  # (the stats of a tiny dump start no thread of gradtool's either)


def test_tables_off_a_terminal_need_no_rich(tmp_path):
    """A table written to a file or a pipe is plain text, written without importing rich (its ~15 ms were
    5 % of a 500 MB clip); told by FORCE_COLOR that the pipe is a terminal, rich draws it (bold, colour)."""
    from gradtool import save_dump

    path = str(tmp_path / "d.safetensors")
    save_dump(path, {"w": np.ones(10, np.float32)})
    history = [{"step": i, "grad_norm": 1 + (i % 7) / 10, "loss": 2.0} for i in range(1, 200)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    for args in (["stats", path], ["clip", path, "--mode", "norm", "--max", "1", "-o", "out.safetensors"],
                 ["suggest-threshold", "trainer_state.json"]):
        modules = _modules_after(args, str(tmp_path))
        assert "gradtool.cli.render" in modules and "rich" not in modules, args
    assert "rich" in _modules_after(["stats", path], str(tmp_path), {"FORCE_COLOR": "1"})
