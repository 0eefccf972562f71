"""The wheel ships the kernel models and the measurements they were fitted on (nothing
else under models/), and an installed copy finds both through importlib.resources."""

from __future__ import annotations

import json
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


def test_wheel_contains_models_and_only_their_training_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    manifest = yaml.safe_load((ROOT / "models" / "manifest.yaml").read_text())
    want = {"planner/_models/manifest.yaml"} | {
        f"planner/_models/{rec['file']}" for rec in manifest["models"].values()}
    assert want <= names
    # the eleven files the manifest lists (models/data/... -> planner/_models/data/...),
    # each beside the README giving its source and licence, and no other measurement
    training = {"planner/_models/" + rec["file"].removeprefix("models/")
                for rec in manifest["training_data"]}
    assert len(training) == 11
    assert {n for n in names if n.endswith(".csv")} == training
    assert {n for n in names if n.startswith("planner/_models/data/")} == training | {
        f"planner/_models/data/{d}/README.md" for d in ("neusight", "deepbench", "h100", "h200")}


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


def test_installed_wheel_refits_with_its_shipped_data(wheel, tmp_path):
    """`kernels eval --shipped-data` and `kernels fit --shipped-data MINE` from an installed
    wheel, away from any checkout: the eval reads the seven shipped files (the same figures
    as the checkout's eval of them); the fit adds a user's file to them and records all
    eight, the shipped ones by their shipped names and checksums."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PLANNER_MODELS"}
    env["PYTHONPATH"] = str(target)

    def planner(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True,
                              text=True, env=env, cwd=str(tmp_path), check=True).stdout

    got = json.loads(planner("kernels", "eval", "--shipped-data", "--split", "test",
                             "--device", "H100-SXM", "--format", "json"))
    manifest = yaml.safe_load((ROOT / "models" / "manifest.yaml").read_text())
    recorded = [r for r in manifest["accuracy"]["results"] if r["device"] == "H100-SXM"]
    assert got["results"] == recorded  # the shipped models on their own held-out rows
    mine = tmp_path / "mine.csv"  # a user's measurements: 40 of the H100's fp16 rows
    lines = (ROOT / "models" / "data" / "h100" / "h100_fp16.csv").read_text().splitlines()
    mine.write_text("\n".join(lines[:41]) + "\n")
    planner("kernels", "fit", "--shipped-data", "mine.csv", "--only", "gemm", "--members", "1",
            "--max-iter", "3", "-o", str(tmp_path / "cal"), "--format", "json")
    fitted = yaml.safe_load((tmp_path / "cal" / "manifest.yaml").read_text())
    shipped = [dict(r, shipped=True) for r in manifest["training_data"]]
    assert fitted["training_data"][:11] == shipped
    assert fitted["training_data"][11]["file"] == "mine.csv"
    assert fitted["accuracy"]["command"].startswith(
        "planner kernels eval --shipped-data mine.csv --split test")
