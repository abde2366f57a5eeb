"""GRADTOOL_NO_KERNELS: one reading of it for the stats kernel, the log readers, the npz inflater and
`gradtool --version` (which once called "0" off while the code paths called it on)."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import find_spec

import pytest

from gradtool.kernel_switch import kernels_turned_off
from gradtool.io import compiled


@pytest.mark.parametrize(("value", "off"), [(None, False), ("", False), ("0", False), (" 0 ", False),
                                            ("1", True), ("yes", True), (" 1", True)])
def test_the_switch_reads_the_variable(monkeypatch, value, off):
    if value is None:
        monkeypatch.delenv("GRADTOOL_NO_KERNELS", raising=False)
    else:
        monkeypatch.setenv("GRADTOOL_NO_KERNELS", value)
    assert kernels_turned_off() is off
    if find_spec("gradtool.io._logscan") is not None:
        assert (compiled.log_readers() is None) is off
    if find_spec("gradtool.io._inflate_many") is not None:
        assert (compiled.member_inflater() is None) is off


@pytest.mark.parametrize(("value", "off"), [("0", False), ("1", True)])
def test_version_and_the_stats_kernel_agree_with_the_switch(value, off):
    if find_spec("gradtool.core._kernels") is None:
        pytest.skip("gradtool.core._kernels not built")
    env = {**os.environ, "GRADTOOL_NO_KERNELS": value}
    version = subprocess.run([sys.executable, "-m", "gradtool", "--version"], capture_output=True, text=True,
                             env=env, check=True).stdout
    assert ("turned off by GRADTOOL_NO_KERNELS" in version) is off
    built = subprocess.run([sys.executable, "-c", "from gradtool.core import kernels; print(kernels.BUILT)"],
                           capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert built == str(not off)
