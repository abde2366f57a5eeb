import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from gradtool.backend import get_namespace, is_floating_dtype, to_host
from gradtool.errors import BackendError, ExitCode


def test_numpy_default_and_env(monkeypatch):
    monkeypatch.delenv("GRADTOOL_BACKEND", raising=False)
    assert get_namespace().__name__.endswith("numpy")
    monkeypatch.setenv("GRADTOOL_BACKEND", "numpy")
    assert get_namespace().__name__.endswith("numpy")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="cupy installed")
def test_cupy_missing_is_a_usage_error():
    with pytest.raises(BackendError) as e:
        get_namespace("cupy")
    assert e.value.exit_code == ExitCode.USAGE and "gradtool[cupy]" in str(e.value)


def test_auto_falls_back_to_numpy_without_gpu():
    if importlib.util.find_spec("cupy") is None:
        assert get_namespace("auto").__name__.endswith("numpy")


def test_unknown_backend():
    with pytest.raises(BackendError):
        get_namespace("torch")


def test_float_dtype_detection():
    import ml_dtypes

    assert is_floating_dtype(np.dtype(ml_dtypes.bfloat16)) and is_floating_dtype(np.dtype("float16"))
    assert not is_floating_dtype(np.dtype("int8")) and not is_floating_dtype(np.dtype("V2"))


def test_to_host_roundtrip(xp):
    a = xp.asarray([1.0, 2.0])
    assert to_host(a).tolist() == [1.0, 2.0]


def test_import_gradtool_does_not_import_click_rich_h5py_cupy():
    code = ("import sys, gradtool; gradtool.clip_by_norm; "
            "bad=[m for m in ('click','rich','h5py','cupy') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_reading_a_float32_safetensors_dump_does_not_import_ml_dtypes(tmp_path):
    """ml_dtypes (bfloat16, float8) is imported only for a file that has such a tensor."""
    import gradtool

    plain, bf16 = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    gradtool.save_dump(plain, {"w": np.ones(3, np.float32)})
    import ml_dtypes

    gradtool.save_dump(bf16, {"w": np.ones(3, ml_dtypes.bfloat16)})
    code = ("import sys, gradtool; r = gradtool.open_dump(sys.argv[1]); r.read('w'); "
            "print('ml_dtypes' in sys.modules, r.info('w').dtype)")
    out = [subprocess.run([sys.executable, "-c", code, p], capture_output=True, text=True, check=True).stdout.split()
           for p in (plain, bf16)]
    assert out == [["False", "float32"], ["True", "bfloat16"]]
