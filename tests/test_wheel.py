"""The wheel ships the kernel models (not their training data) and an installed copy finds
them through importlib.resources."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT

pytestmark = pytest.mark.slow  # builds a wheel: ~10-20 s; still runs in CI


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(out)], check=True,
                   cwd=str(out))
    (path,) = out.glob("planner-*.whl")
    return path


def test_wheel_contains_models_but_not_their_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    manifest = yaml.safe_load((ROOT / "models" / "manifest.yaml").read_text())
    want = {"planner/_models/manifest.yaml"} | {
        f"planner/_models/{rec['file']}" for rec in manifest["models"].values()}
    assert want <= names
    assert not [n for n in names if n.startswith("planner/_models/data")]
    assert not [n for n in names if n.endswith(".csv")]


def test_installed_wheel_finds_and_uses_its_models(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True)
    code = (
        "import planner.kernels.store as s, planner.kernels as k;"
        "from planner.cluster import lookup_device; from planner.ops import Gemm;"
        "d = s.find_models_dir(); print(d);"
        "t = k.LearnedEstimator().estimate([Gemm(1024, 1024, 1024)],"
        " lookup_device('H100-SXM'), 'float32');"
        "print(t.source[0], t.seconds[0])")
    env = {k: v for k, v in os.environ.items() if k != "PLANNER_MODELS"}
    env["PYTHONPATH"] = str(target)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path), check=True)
    where, line = res.stdout.strip().splitlines()
    assert Path(where).resolve() == (target / "planner" / "_models").resolve()
    source, seconds = line.split()
    assert source == "mlp:gemm-fp32" and float(seconds) > 0
