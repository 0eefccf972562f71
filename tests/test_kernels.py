"""Learned kernel-time models: loading, checks, bounds, fallbacks, CLI, determinism."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from planner.cluster import lookup_device, registered_devices
from planner.costs.compute import kernel_arrays, roofline_seconds
from planner.errors import InputError, ModelDataError
from planner.kernels import LearnedEstimator, load_models
from planner.kernels.data import PROFILE_COLUMNS, detect_layout, parse_csv, read_csv
from planner.kernels.estimator import TIME_BITS, conv_rows, reproducible, scale_rows
from planner.kernels.features import DeviceSpecs
from planner.kernels.model import RANGE_TOLERANCE_LOG2
from planner.kernels.pipeline import fit_tables
from planner.kernels.store import (
    MANIFEST,
    ModelSet,
    find_models_dir,
    load_dir,
    sha256_file,
    shipped_training_data,
)
from planner.kernels.train import (
    FitOptions,
    _mono_pairs,
    _Pairs,
    _Problem,
    fit_family,
    hat_basis,
)
from planner.ops import Conv, Elementwise, Gemm

from .conftest import CLUSTERS, NETWORKS, ROOT, invoke

MODELS = ROOT / "models"
DATA = MODELS / "data"
LINEAR = DATA / "neusight" / "neusight_linear_fp32.csv"
BMM = DATA / "neusight" / "neusight_bmm_fp32_test.csv"
CONV = DATA / "neusight" / "neusight_conv2d_fwd_fp32.csv"
DB_GEMM = DATA / "deepbench" / "deepbench_gemm.csv"
H100 = (DATA / "h100" / "h100_fp32.csv", DATA / "h100" / "h100_bf16.csv")
#: the GEMM files of the two Hopper GPUs measured (the sweep, FP32 and bf16)
HOPPER = (*H100, DATA / "h200" / "h200_fp32.csv", DATA / "h200" / "h200_bf16.csv")
DB_CONV = DATA / "deepbench" / "deepbench_conv.csv"
TRAINING = [LINEAR, BMM, CONV, DB_GEMM, DB_CONV]

#: how far apart rounding to TIME_BITS significant bits (up, :func:`reproducible`) can put
#: a kernel time from the exact value, or two exactly proportional times from their ratio
ROUNDING = 2.0 ** (1 - TIME_BITS)


@pytest.fixture(scope="module")
def est() -> LearnedEstimator:
    return LearnedEstimator(load_dir(MODELS))


def _roofline_bound(kernels, device, dtype: str) -> np.ndarray:
    """The datasheet roofline: max(FLOPs / peak, bytes / bandwidth), no efficiencies."""
    from planner.kernels.features import conv_work, winograd_saving

    out = []
    eb = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    peak = device.peak({"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[dtype])
    for k in kernels:
        if isinstance(k, Conv):
            row = np.array([[k.n, k.c, k.h, k.w, k.k, k.r, k.s, k.stride_h, k.stride_w,
                             k.pad_h, k.pad_w, k.dil_h, k.dil_w, k.groups]])
            f, b = conv_work(row, np.array([float(eb)]))
            f = f / winograd_saving(row)
            out.append(max(f[0] / peak, b[0] / device.memory_bandwidth))
        else:
            out.append(max(k.flops / peak, k.bytes_moved(eb) / device.memory_bandwidth))
    return np.array(out)


# --- loading -----------------------------------------------------------------------------


def test_shipped_models_load_and_match_their_checksums():
    models = load_models(MODELS)
    assert set(models.models) == {"gemm", "conv"}
    for family, rec in models.manifest["models"].items():
        assert sha256_file(MODELS / rec["file"]) == rec["sha256"], family
        assert rec["features"] == list(models.models[family].features)


def test_shipped_model_files_are_small():
    files = [MODELS / MANIFEST] + [MODELS / r["file"] for r in
                                   yaml.safe_load((MODELS / MANIFEST).read_text())["models"]
                                   .values()]
    assert sum(f.stat().st_size for f in files) < 5 * 2**20  # issue 4: under 5 MB


def test_lookup_order_env_then_package_or_checkout(tmp_path, monkeypatch):
    shutil.copytree(MODELS, tmp_path / "m", ignore=shutil.ignore_patterns("data"))
    monkeypatch.setenv("PLANNER_MODELS", str(tmp_path / "m"))
    assert find_models_dir() == tmp_path / "m"
    assert find_models_dir(MODELS) == MODELS  # --models-dir beats the environment
    monkeypatch.delenv("PLANNER_MODELS")
    assert (find_models_dir() / MANIFEST).is_file()
    monkeypatch.setenv("PLANNER_MODELS", str(tmp_path / "nowhere"))
    with pytest.raises(ModelDataError, match="nowhere"):
        find_models_dir()


@pytest.fixture
def model_copy(tmp_path) -> Path:
    dst = tmp_path / "models"
    shutil.copytree(MODELS, dst, ignore=shutil.ignore_patterns("data"))
    return dst


def test_eval_never_writes_over_the_models_it_reads(runner, model_copy):
    before = (model_copy / MANIFEST).read_bytes()
    r = invoke(runner, "kernels", "eval", DB_GEMM, "--models-dir", model_copy, "-o",
               model_copy / MANIFEST)
    assert r.exit_code == 2 and "it is one of this command's inputs" in r.stderr
    assert (model_copy / MANIFEST).read_bytes() == before


def test_eval_output_format_follows_the_files_suffix(runner, tmp_path):
    """As for plan, cost and the other commands with -o: a .json file gets JSON, .yaml
    YAML, anything else the table (eval wrote a table into x.json before); --format
    still wins."""
    got = {}
    for name in ("x.json", "x.yaml", "x.txt"):
        r = invoke(runner, "kernels", "eval", DB_GEMM, "--split", "test", "-o",
                   tmp_path / name)
        assert r.exit_code == 0, r.stderr
        got[name] = (tmp_path / name).read_text(encoding="utf-8")
    doc = json.loads(got["x.json"])
    assert doc == yaml.safe_load(got["x.yaml"])
    assert {"device", "op", "n", "mape"} <= set(doc["results"][0])
    assert got["x.txt"].lstrip().startswith("kernel-time error")
    r = invoke(runner, "kernels", "eval", DB_GEMM, "--split", "test", "--format", "table",
               "-o", tmp_path / "y.json")
    assert r.exit_code == 0 and not (tmp_path / "y.json").read_text().startswith("{")


def test_a_model_set_without_a_family_says_so(runner, model_copy):
    """A fit with --only gemm writes no conv model: convolutions are timed by the
    roofline and say why, and evaluating convolution data is an error, not []."""
    doc = yaml.safe_load((model_copy / MANIFEST).read_text())
    assert "conv" in str(doc)
    (model_copy / "conv.npz").unlink()
    text = (model_copy / MANIFEST).read_text()
    families = yaml.safe_load(text)
    key = next(k for k in ("families", "models") if k in families)
    del families[key]["conv"]
    (model_copy / MANIFEST).write_text(yaml.safe_dump(families))
    est = LearnedEstimator(models_dir=model_copy)
    conv = Conv(32, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1)
    assert est.estimate([conv], lookup_device("V100-SXM2"), "float32").source == (
        "roofline (no conv model)",)
    r = invoke(runner, "kernels", "eval", DB_CONV, "--models-dir", model_copy)
    assert r.exit_code == 2 and "time none of these rows (they have gemm models)" in r.stderr


def _gemm_only(model_copy: Path) -> Path:
    """``model_copy`` without its conv model (as a fit with --only gemm writes it)."""
    (model_copy / "conv.npz").unlink()
    doc = yaml.safe_load((model_copy / MANIFEST).read_text())
    del doc["models"]["conv"]
    (model_copy / MANIFEST).write_text(yaml.safe_dump(doc))
    return model_copy


def test_eval_says_which_rows_no_model_times(runner, model_copy, tmp_path):
    """Rows of a family the models lack were left out of eval silently (an audit): said
    on standard error and in the JSON (`skipped`, `notes`), and the rows judged are the
    other family's, as before."""
    models = _gemm_only(model_copy)
    convs = tmp_path / "conv.csv"
    lines = DB_CONV.read_text().splitlines()
    convs.write_text("\n".join(lines[:1] + lines[1:30]) + "\n")
    n_conv = len(read_csv(convs).conv)
    assert n_conv > 0
    r = invoke(runner, "kernels", "eval", DB_GEMM, convs, "--models-dir", models,
               "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    note = (f"{n_conv:,} convolution rows left out: the models in {models} have no conv "
            "model (they have gemm); fit it with `planner kernels fit` to judge them")
    assert doc["skipped"] == {"conv": n_conv}
    assert doc["notes"] == [note] and doc["roofline_devices"] == []
    assert f"planner: note: {note}\n" in r.stderr
    assert sum(x["n"] for x in doc["results"]) == len(read_csv(DB_GEMM).gemm)
    assert not any(x["op"].startswith("conv") for x in doc["results"])
    # nothing left out: no note
    r = invoke(runner, "kernels", "eval", DB_GEMM, "--models-dir", models, "--format", "json")
    assert json.loads(r.stdout)["skipped"] == {} and "note" not in r.stderr


def _cpu_rows(device: str) -> tuple[str, list[tuple[int, int, int, int, float]]]:
    """A profile CSV of GEMMs and bmm on ``device`` and its rows (m, n, k, batch, ms)."""
    rows = [(512, 512, 512, 1, 0.9), (1024, 256, 2048, 1, 2.5), (64, 64, 64, 1, 0.02),
            (128, 128, 64, 8, 0.15)]
    head = ",".join(PROFILE_COLUMNS)
    body = [f"{device},float32,{'bmm' if b > 1 else 'gemm'},{m},{n},{k},{b}"
            + "," * 14 + f",{t},3,profile" for m, n, k, b, t in rows]
    return "\n".join([head, *body]) + "\n", rows


@pytest.mark.parametrize("cluster", [False, True])
def test_eval_times_a_device_the_models_do_not_cover_by_the_roofline(runner, tmp_path,
                                                                      cluster):
    """A CPU the models have no measurements of: predict refuses it and plans time it
    by the roofline, but eval printed the GPU models' errors on it (an audit). It is
    judged by the roofline plans use (the catalog's, or the cluster file's, achievable
    fractions of peak and bandwidth), every row out of the models' range, and says so."""
    name, extra = "cori-knl", []
    if cluster:
        name = "my-cpu"
        clus = tmp_path / "cpu.yaml"
        clus.write_text("kind: cluster\ndevices_per_node: 1\ndevice: {base: cori-knl, "
                        "name: my-cpu, peak_flops: {fp32: 2 TFLOPS}}\nnetwork:\n  "
                        "inter_node: {latency: 2 us, bandwidth: 6 GB/s}\n")
        extra = ["--cluster", clus]
    text, rows = _cpu_rows(name)
    data = tmp_path / "cpu.csv"
    data.write_text(text)
    r = invoke(runner, "kernels", "eval", data, *extra, "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    dev = lookup_device(name)
    assert dev.kind == "cpu"
    peak = dev.peak("fp32") * dev.compute_efficiency
    bw = dev.memory_bandwidth * dev.memory_efficiency
    want = {}
    for m, n, k, b, ms in rows:
        t = max(2.0 * m * n * k * b / peak, 4.0 * b * (m * k + k * n + m * n) / bw)
        want.setdefault("bmm" if b > 1 else "gemm", []).append(abs(t - ms / 1e3) / (ms / 1e3))
    got = {x["op"]: x for x in doc["results"]}
    assert set(got) == set(want)
    for op, errs in want.items():
        assert got[op]["device"] == dev.name and got[op]["n"] == len(errs)
        assert got[op]["mape"] == pytest.approx(100 * np.mean(errs), abs=0.006)
        assert got[op]["out_of_range"] == len(errs) and got[op]["in_band"] is None
    note = (f"{dev.name} is a cpu the models have no measurements of: its rows are timed by "
            "the roofline at its achievable fractions of peak and bandwidth, as plans on it "
            "are (fit a model on its measurements to time it)")
    assert doc["roofline_devices"] == [dev.name] and doc["notes"] == [note]
    assert f"planner: note: {note}\n" in r.stderr


def test_bad_checksum_names_the_file(model_copy):
    path = model_copy / "gemm.npz"
    raw = bytearray(path.read_bytes())
    raw[-20] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ModelDataError, match=r"gemm\.npz: error: sha256 checksum"):
        load_dir(model_copy)


def test_a_weights_file_that_is_not_one_names_it(runner, model_copy):
    """A weights file that is not an npz archive, its checksum edited into the manifest
    to match, was an internal error (BadZipFile, exit 3: an audit); it is a model-data
    error naming the file, exit 2."""
    import hashlib

    path = model_copy / "gemm.npz"
    old = hashlib.sha256(path.read_bytes()).hexdigest()
    junk = b"PK\x03\x04" + bytes(200)
    path.write_bytes(junk)
    manifest = model_copy / MANIFEST
    manifest.write_text(manifest.read_text().replace(old, hashlib.sha256(junk).hexdigest()))
    with pytest.raises(ModelDataError, match=r"gemm\.npz: error: not a readable weights "
                                             r"file \(File is not a zip file\); refit"):
        load_dir(model_copy)
    r = invoke(runner, "kernels", "predict", "--device", "H100", "--gemm", "64,64,64",
               "--models-dir", model_copy)
    assert r.exit_code == 2 and "gemm.npz: error: not a readable weights file" in r.stderr, \
        r.stderr


def test_missing_weights_file_names_it(model_copy):
    (model_copy / "conv.npz").unlink()
    with pytest.raises(ModelDataError, match=r"conv\.npz: error: cannot read"):
        load_dir(model_copy)


def test_feature_mismatch_is_refused(model_copy):
    doc = yaml.safe_load((model_copy / MANIFEST).read_text())
    doc["models"]["gemm"]["features"][0] = "log2_something_else"
    (model_copy / MANIFEST).write_text(yaml.safe_dump(doc))
    with pytest.raises(ModelDataError, match=r"manifest\.yaml:\d+:\d+: error: the model was "
                                             r"fitted on features .*\(at \$\.models\.gemm"
                                             r"\.features\)"):
        load_dir(model_copy)


def test_manifest_problem_without_positions_names_its_key(model_copy):
    """A manifest PyYAML reads but the located loader does not (a duplicate key) still
    names the key of a bad value: FILE: KEY: MESSAGE, exit 2 (not a position it lacks)."""
    path = model_copy / MANIFEST
    doc = yaml.safe_load(path.read_text())
    doc["models"]["gemm"]["file"] = "../gemm.npz"
    path.write_text(yaml.safe_dump(doc) + f"kind: {doc['kind']}\n")  # the key twice
    with pytest.raises(ModelDataError) as err:
        load_dir(model_copy)
    assert str(err.value) == (f"{path}: models.gemm.file: expected a file name in the model "
                              "directory")


def test_zero_normalisation_spread_is_refused(model_copy):
    """A spread of 0 divides by zero at every prediction (nan times, silently)."""
    doc = yaml.safe_load((model_copy / MANIFEST).read_text())
    doc["models"]["conv"]["normalisation"]["std"][2] = 0.0
    (model_copy / MANIFEST).write_text(yaml.safe_dump(doc))
    with pytest.raises(ModelDataError, match=r"error: expected positive numbers.*\(at "
                                             r"\$\.models\.conv\.normalisation\.std\)"):
        load_dir(model_copy)


@pytest.mark.parametrize("bad", [5, {"neusight-conv": [0.1, 0.2]},
                                 {"neusight-conv": {"T4": ["fast"]}}])
def test_malformed_overhead_drift_is_refused(model_copy, bad):
    """A member's ``sweep_overhead_drift`` that is not sweep -> device -> numbers names the
    member in the manifest (it was read without a check before it existed)."""
    doc = yaml.safe_load((model_copy / MANIFEST).read_text())
    doc["models"]["conv"]["members"][3]["sweep_overhead_drift"] = bad
    (model_copy / MANIFEST).write_text(yaml.safe_dump(doc))
    with pytest.raises(ModelDataError, match=r"error: malformed levels, overheads, sweep "
                                             r"factors or drifts \(at \$\.models\.conv"
                                             r"\.members\[3\]\)"):
        load_dir(model_copy)


def test_fit_of_one_family_never_drops_the_other(runner, model_copy):
    """--only gemm into a model set with a conv model would write a manifest without it:
    refused before fitting, and the set is untouched."""
    before = {p.name: p.read_bytes() for p in model_copy.iterdir() if p.is_file()}
    r = invoke(runner, "kernels", "fit", BMM, "--only", "gemm", "--max-iter", "2", "-o",
               model_copy)
    assert r.exit_code == 2
    assert r.stderr == (f"planner: error: {model_copy / MANIFEST} has conv models that "
                        "--only gemm would drop from it; write to another directory (and "
                        "fit both families to replace the set)\n")
    assert {p.name: p.read_bytes() for p in model_copy.iterdir() if p.is_file()} == before


def test_a_fit_of_data_without_a_family_never_drops_it(runner, model_copy, tmp_path):
    """Without --only, GEMM measurements alone fitted into a model set with a conv model
    wrote a manifest listing only gemm (an audit: predict then timed convolutions by
    "roofline (no conv model)"): refused as --only gemm is, before fitting, and the set
    is untouched. A new folder, and a set of the families fitted, are written."""
    gemms = tmp_path / "gemm.csv"
    lines = DB_GEMM.read_text().splitlines()
    gemms.write_text("\n".join(lines[:1] + lines[1::8]) + "\n")
    before = {p.name: p.read_bytes() for p in model_copy.iterdir() if p.is_file()}
    r = invoke(runner, "kernels", "fit", gemms, "--max-iter", "2", "-o", model_copy)
    assert r.exit_code == 2
    assert r.stderr == (f"planner: error: {model_copy / MANIFEST} has conv models that this "
                        "fit would drop from it (the data give no convolution rows to fit); "
                        "write to another directory, or fit both families to replace the "
                        "set (add convolution measurements, e.g. --shipped-data)\n")
    assert "fitted" not in r.stderr  # refused before any network was fitted
    assert {p.name: p.read_bytes() for p in model_copy.iterdir() if p.is_file()} == before
    out = tmp_path / "new"
    r = invoke(runner, "kernels", "fit", gemms, "--max-iter", "2", "--members", "1", "-o",
               out, "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert set(load_dir(out).models) == {"gemm"}
    # the same family again into it: nothing of it is dropped
    r = invoke(runner, "kernels", "fit", gemms, "--max-iter", "2", "-o", out)
    assert r.exit_code == 0, r.stderr


def test_neusight_run_nuisances_belong_to_neusight_runs(runner, tmp_path):
    """The drift along NeuSight's conv sweep and its slower linear train sweep are facts
    of those runs: the shipped files carry them (their sha256 is listed), while the same
    rows in another order, or a user's file in the same layout, are read without them,
    so that evaluating them does not depend on row order."""
    import hashlib

    from planner.kernels.data import NEUSIGHT_RUNS

    for path in (LINEAR, BMM, CONV):
        assert NEUSIGHT_RUNS[hashlib.sha256(path.read_bytes()).hexdigest()] == path.name
    shipped = read_csv(CONV).conv
    assert set(shipped.sweep) == {"neusight-conv"}
    assert "neusight-linear-train" in set(read_csv(LINEAR).gemm.collection)
    lines = CONV.read_text().splitlines(keepends=True)
    head, body = lines[0], lines[1:]
    orders = [body[::-1], body[1::2] + body[0::2]]
    seen = []
    for i, rows in enumerate(orders):
        copy = tmp_path / f"conv{i}.csv"
        copy.write_text(head + "".join(rows))
        table = read_csv(copy).conv
        assert set(table.sweep) == {""} and set(table.collection) == {""}
        r = json.loads(invoke(runner, "kernels", "eval", copy, "--format", "json",
                              "--split", "test").stdout)
        seen.append({(x["device"], x["op"]): x["mape"] for x in r["results"]})
    assert seen[0] == pytest.approx(seen[1], rel=1e-9)


def test_neusight_conv_sweep_drift_is_the_hosts_time_per_call():
    """README *Hardware models*: along NeuSight's conv sweep the time each call adds
    outside the kernel grows, while the kernels' own time barely moves. The shipped
    model's curves say so for every network and GPU (fitted: kernel-time drift within
    ±0.045 in log, the overhead 3.9-7.9x larger at the sweep's end than at its start,
    rising knot by knot), and ``kernels eval`` applies both."""
    conv = load_models().get("conv")
    assert conv is not None
    for member in conv.members:
        for dev in ("P100-PCIe", "P4", "T4", "V100-PCIe"):
            kernel = member.drift["neusight-conv"][dev]
            over = member.overhead_drift["neusight-conv"][dev]
            assert max(abs(v) for v in kernel) < 0.05
            assert list(over) == sorted(over)
            assert math.exp(over[-1] - over[0]) > 3.5
            ends = member.drift_factor("neusight-conv", dev, np.array([0.0, 1.0]),
                                       overhead=True)
            assert ends[1] / ends[0] == pytest.approx(math.exp(over[-1] - over[0]), rel=1e-12)
    assert conv.first.drift_factor("", "T4", np.array([0.5]), overhead=True)[0] == 1.0
    gemm = load_models().get("gemm")
    assert gemm is not None and gemm.first.overhead_drift == {}  # the linear sweep: none


def test_unseen_gpu_gets_the_median_sweep_drift():
    """A GPU the model never measured is compared with a sweep's rows through the
    knot-wise median of the curves of the GPUs that ran it (here by hand: the median of
    the four NeuSight GPUs' knots is the mean of the middle two); a GPU with levels but
    no curve of that sweep keeps none (the P4 of NeuSight's dropped linear train sweep)."""
    conv = load_models().get("conv")
    gemm = load_models().get("gemm")
    assert conv is not None and gemm is not None
    member = conv.first
    pos = np.linspace(0.0, 1.0, 11)
    for overhead in (False, True):
        curves = (member.overhead_drift if overhead else member.drift)["neusight-conv"]
        assert len(curves) == 4
        knots = []
        for j in range(len(curves["T4"])):
            vals = sorted(c[j] for c in curves.values())
            knots.append((vals[1] + vals[2]) / 2.0)
        want = np.exp(np.interp(pos, np.linspace(0.0, 1.0, len(knots)), knots))
        got = member.drift_factor("neusight-conv", "A100-PCIe-40GB", pos, overhead=overhead)
        assert got == pytest.approx(want, rel=1e-12)
        assert not np.allclose(got, 1.0)
    assert "P4" not in gemm.first.drift["neusight-linear-train"]
    assert np.all(gemm.first.drift_factor("neusight-linear-train", "P4", pos) == 1.0)


def test_neusight_split_must_be_train_or_test(tmp_path):
    bad = tmp_path / "linear.csv"
    bad.write_text("split,device,B,M,N,K,latency_ms\ntrain,T4,1,64,64,64,0.05\n"
                   "tset,T4,1,64,64,128,0.05\n")
    with pytest.raises(InputError) as err:
        read_csv(bad)
    assert err.value.render().startswith(f"{bad}:3:1: error: expected 'train' or 'test' "
                                         "(NeuSight's sweeps), got 'tset'")


def test_not_a_manifest(tmp_path):
    (tmp_path / MANIFEST).write_text("kind: cluster\n")
    with pytest.raises(ModelDataError, match="not a planner model manifest"):
        load_dir(tmp_path)


def test_models_from_the_environment_are_named_so(runner, tmp_path, monkeypatch):
    """A bad $PLANNER_MODELS is reported as the variable's, not as a --models-dir the
    user never gave; --models-dir still beats the variable."""
    monkeypatch.setenv("PLANNER_MODELS", str(tmp_path / "nowhere"))
    args = ("plan", NETWORKS / "alexnet.yaml", CLUSTERS / "dgx-h100.yaml", "-p", "8", "-b", "8")
    r = invoke(runner, *args)
    assert r.exit_code == 2 and "(given by $PLANNER_MODELS)" in r.stderr, r.stderr
    r = invoke(runner, *args, "--models-dir", tmp_path / "elsewhere")
    assert r.exit_code == 2 and "elsewhere" in r.stderr and "(given by --models-dir)" in r.stderr


def test_predict_phase_is_for_convolutions(runner):
    r = invoke(runner, "kernels", "predict", "--device", "T4", "--gemm", "64,64,64", "--phase",
               "bwd_data")
    assert r.exit_code == 2 and "--phase is a convolution's pass; a GEMM has none" in r.stderr
    fwd = invoke(runner, "kernels", "predict", "--device", "T4", "--conv", "8,64,56,56,64,3,3,1,1",
                 "--format", "json")
    same = invoke(runner, "kernels", "predict", "--device", "T4", "--conv",
                  "8,64,56,56,64,3,3,1,1", "--phase", "fwd", "--format", "json")
    assert fwd.exit_code == 0 and fwd.stdout == same.stdout


def test_binary_csv_is_called_csv(runner, tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_bytes(b"\x00\x01")
    r = invoke(runner, "kernels", "eval", bad)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{bad}:1:1: error: found a NUL byte: this looks like a binary "
                               "file, not CSV text")


def test_corrupt_manifest_is_reported_at_its_line(runner, model_copy):
    """A manifest that is not YAML is reported at file:line:col with what to do, exit 2
    (it was PyYAML's own multi-line text)."""
    path = model_copy / MANIFEST
    path.write_text("kind: planner-kernel-models\nmodels: [gemm-fp32,\n  {bad\n")
    r = invoke(runner, "kernels", "predict", "--device", "T4", "--gemm", "64,64,64",
               "--models-dir", model_copy)
    assert r.exit_code == 2
    # libyaml and the pure-Python parser word the problem differently
    assert r.stderr.startswith(f"{path}:4:1: error: the manifest is not valid YAML (while "
                               "parsing a flow mapping: "), r.stderr
    assert r.stderr.endswith("); rebuild the models with `planner kernels fit`, or reinstall "
                             "the planner for the shipped ones\n"), r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1


def test_bad_error_bands_name_the_manifest(model_copy):
    doc = yaml.safe_load((model_copy / MANIFEST).read_text())
    doc["error_bands"]["ops"]["gemm"]["edges"].reverse()  # no longer ascending
    (model_copy / MANIFEST).write_text(yaml.safe_dump(doc))
    # located at the key, as the user's own inputs are
    with pytest.raises(ModelDataError, match=r"manifest\.yaml:\d+:\d+: error: expected "
                                             r"ascending edges .*\(at \$\.error_bands\.ops"
                                             r"\.gemm\)"):
        load_dir(model_copy)


def test_bad_error_bands_exit_2_from_the_command_line(runner, model_copy):
    doc = yaml.safe_load((model_copy / MANIFEST).read_text())
    doc["error_bands"]["ops"]["conv_fwd"]["bands"][0]["low"] = "wide"
    (model_copy / MANIFEST).write_text(yaml.safe_dump(doc))
    r = invoke(runner, "kernels", "predict", "--device", "T4", "--gemm", "64,64,64",
               "--models-dir", model_copy)
    assert r.exit_code == 2 and "error_bands.ops.conv_fwd" in r.stderr
    assert "Traceback" not in r.stderr


# --- features ----------------------------------------------------------------------------


def test_output_tile_waste_features_by_hand():
    """A 3×3, stride-1, pad-1 convolution on a 17×17 map has a 17×17 output. Square tiles
    of edge t cover it with ⌈17/t⌉² tiles: t = 4: 25 tiles of 16 = 400 outputs for 289,
    t = 8: 9 × 64 = 576, t = 16: 4 × 256 = 1024; the feature is log2 of that over 289.
    A 16×16 output wastes nothing. The backward passes get zeros (forward-only feature)."""
    from planner.kernels.features import CONV_FEATURES, SPATIAL_TILES, features

    names = [f"log2_spatial_waste_{t}" for t in SPATIAL_TILES]
    cols = [CONV_FEATURES.index(n) for n in names]
    dev = lookup_device("V100-SXM2")
    assert dev is not None
    shape = np.array([[8, 64, 17, 17, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1],
                      [8, 64, 16, 16, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1]] * 3, dtype=np.int64)
    ops = ["conv_fwd"] * 2 + ["conv_bwd_data"] * 2 + ["conv_bwd_filter"] * 2
    x, _, _ = features("conv", shape, ops, DeviceSpecs.single(dev, "float32", 6))
    want = np.log2(np.array([400.0, 576.0, 1024.0]) / 289.0)
    np.testing.assert_allclose(x[0, cols], want, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(x[1, cols], 0.0)
    np.testing.assert_array_equal(x[2:, cols], 0.0)


# --- the estimator -----------------------------------------------------------------------


def test_every_kernel_names_its_estimator(est):
    dev = lookup_device("A100-SXM-80GB")
    ks = [Gemm(1024, 1024, 1024), Gemm(128, 128, 64, 48),
          Conv(32, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, phase="bwd_filter"),
          Elementwise(1e6, 1e5), Conv(32, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, groups=64)]
    src = est.estimate(ks, dev, "float32").source
    assert src == ("mlp:gemm-fp32", "mlp:bmm-fp32", "mlp:conv_bwd_filter-fp32", "roofline",
                   "roofline (out of range)")  # no grouped convolution in the data
    assert est.estimate(ks[:1], dev, "float16").source == ("mlp:gemm-fp16",)
    assert est.estimate(ks[:1], dev, "bfloat16").source == ("mlp:gemm-bf16",)
    assert est.estimate(ks[:1], dev, "float64").source == ("roofline (no float64 data)",)
    # without data for the dtype the roofline still pays the launch floor: a 64³ float64
    # GEMM took 32.6 ns on the H100 against 6.8 µs in float32
    h100 = lookup_device("H100-SXM")
    small = [Gemm(64, 64, 64), Conv(1, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1)]
    for family, k in zip(("gemm", "conv"), small, strict=True):
        floor = min(x.floor_s for x in est.models.get(family).members)
        t64 = float(est.estimate([k], h100, "float64").seconds[0])
        roof = float(roofline_seconds(*kernel_arrays([k], 8), h100, "float64")[0])
        assert t64 == pytest.approx(roof + floor, rel=ROUNDING) and floor > 1e-6


def test_elementwise_passes_pay_the_least_launch_floor(est):
    """A ReLU over 8 bytes is not 2.7 ps on an H100: an elementwise pass is its roofline
    plus the least launch floor fitted to any measured kernel family (1.5 µs, a
    convolution pass's), in every dtype."""
    h100 = lookup_device("H100-SXM")
    least = min(m.floor_s for fam in ("gemm", "conv") for m in est.models.get(fam).members)
    assert 1e-6 < least < 2e-6
    for k in (Elementwise(8.0, 2.0, "relu"), Elementwise(1e9, 1e8, "layernorm")):
        for dtype, size in (("float32", 4), ("bfloat16", 2)):
            t = float(est.estimate([k], h100, dtype).seconds[0])
            roof = float(roofline_seconds(*kernel_arrays([k], size), h100, dtype)[0])
            assert t == pytest.approx(roof + least, rel=ROUNDING)


def test_kernel_times_keep_24_significant_bits_rounded_up():
    # by hand: 1.0 is 0.5 · 2^1, whose 24-bit step is 2^-23; 1 + 2^-30 rounds up to the
    # next step, 1 + 2^-23; 3 · 2^-20 (mantissa 0.75, exact) is kept; 1/3 rounds up to
    # ceil(2^24 · 2/3) · 2^-25 = 11,184,811 · 2^-25
    assert TIME_BITS == 24
    got = reproducible(np.array([1.0, 1.0 + 2.0 ** -30, 3 * 2.0 ** -20, 1 / 3]))
    assert got.tolist() == [1.0, 1.0 + 2.0 ** -23, 3 * 2.0 ** -20, 11_184_811 * 2.0 ** -25]
    rng = np.random.default_rng(0)
    t = 10.0 ** rng.uniform(-7, 1, 10_000)
    r = reproducible(t)
    assert np.all(r >= t) and np.all(r - t < t * ROUNDING)  # up, by less than a step
    assert np.array_equal(reproducible(r), r)  # idempotent
    assert np.array_equal(reproducible(4 * t), 4 * r)  # powers of two commute
    # values 4 ulps apart (what two CPUs' BLAS and SIMD loops give) land on one step
    # unless a step's edge falls between them: 4 · 2^-52 · 2^24, 1.5 in 10^8, so none of
    # these 10,000
    near = t * (1 + 4 * np.finfo(float).eps)
    assert np.count_nonzero(reproducible(near) != r) == 0


def test_out_of_range_falls_back_to_the_roofline(est):
    dev = lookup_device("V100-SXM2")
    # a 15 x 15 filter: beyond every measured filter, and no split shrinks a filter (a
    # GEMM too large is always split: its rows, columns, batch and reduction all split)
    huge = Conv(32, 64, 56, 56, 64, 15, 15, 1, 1, 7, 7)
    times = est.estimate([huge], dev, "float32")
    assert times.source == ("roofline (out of range)",)
    floor = min(x.floor_s for x in est.models.get("conv").members)  # a launch is not free
    np.testing.assert_allclose(times.seconds, roofline_seconds(
        np.array([huge.flops]), np.array([huge.bytes_moved(4)]), dev, "float32") + floor,
        rtol=ROUNDING)


def test_a_kernel_below_the_data_is_timed_as_the_smallest_answered(est):
    # GEMM rows: the least measured M is 3 (log2 1.58), answered down to 2^0.58 = 1.5, so
    # 2. A per-GPU batch of 1 (M = 1) is timed as M = 2, not scaled down (launch-bound),
    # where it used to fall back to the bare roofline (5.6 ns for 1x64x64 on the H100,
    # a thousandth of the 6.8 us of M = 2, which made one sample a GPU look free)
    dev = lookup_device("H100-SXM")
    m = est.models.get("gemm").first
    assert math.ceil(2.0 ** (m.lo[m.features.index("log2_m")] - RANGE_TOLERANCE_LOG2)) == 2
    t = est.estimate([Gemm(1, 64, 64), Gemm(2, 64, 64)], dev, "float32")
    assert t.source == ("mlp:gemm-fp32 (padded)", "mlp:gemm-fp32")
    assert t.seconds[0] == pytest.approx(t.seconds[1], rel=ROUNDING)  # rounding apart
    assert t.seconds[0] >= min(x.floor_s for x in est.models.get("gemm").members)
    pred = est.explain(Gemm(1, 64, 64), dev, "float32")
    assert (pred.scale, pred.in_range, pred.seconds) == (0.5, False, t.seconds[0])
    # a small convolution is grown along its batch until its FLOPs and bytes are in range
    small = Conv(2, 3, 32, 32, 16, 3, 3, 1, 1, 1, 1)
    (src,) = est.estimate([small], dev, "float32").source
    assert src == "mlp:conv_fwd-fp32 (padded)"
    # what no padding brings in (a grouped convolution: no data) is the roofline plus
    # the launch floor every measured kernel paid
    grouped = Conv(2, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1, groups=64)
    t = est.estimate([grouped], dev, "float32")
    assert t.source == ("roofline (out of range)",)
    floor = min(x.floor_s for x in est.models.get("conv").members)
    np.testing.assert_allclose(t.seconds, roofline_seconds(
        np.array([grouped.flops]), np.array([grouped.bytes_moved(4)]), dev, "float32")
        + floor, rtol=ROUNDING)


def _answered_max(est, family: str, feature: str) -> int:
    """The largest value of a dimension the model answers for: the training maximum
    widened by RANGE_TOLERANCE_LOG2 (a factor of 2)."""
    m = est.models.get(family).first
    return round(2.0 ** (m.hi[m.features.index(feature)] + RANGE_TOLERANCE_LOG2))


def test_a_batch_beyond_the_data_is_scaled_from_the_largest_answered(est):
    # conv data stop at N = 128 (the H100 sweep; DeepBench's at 64); answered to 256.
    # N = 3·256 is timed as 3 × t(N = 256), exactly, and N = 257 as 257/256 × t(256): no
    # jump where scaling starts.
    dev = lookup_device("H100-SXM")
    n_max = _answered_max(est, "conv", "log2_n")
    assert n_max == 256

    def conv(n):
        return Conv(n, 256, 14, 14, 256, 3, 3, 1, 1, 1, 1, phase="bwd_filter")

    t = est.estimate([conv(n_max), conv(n_max + 1), conv(3 * n_max)], dev, "bfloat16")
    assert t.source == ("mlp:conv_bwd_filter-bf16",) + ("mlp:conv_bwd_filter-bf16 "
                                                        "(scaled)",) * 2
    np.testing.assert_allclose(t.seconds[1:], t.seconds[0] * np.array([257 / 256, 3.0]),
                               rtol=ROUNDING)
    # GEMM rows: trained to 65,536, answered to 131,072
    m_max = _answered_max(est, "gemm", "log2_m")
    g = est.estimate([Gemm(m_max, 4096, 4096), Gemm(4 * m_max, 4096, 4096)], dev, "float16")
    assert g.source == ("mlp:gemm-fp16", "mlp:gemm-fp16 (scaled)")
    np.testing.assert_allclose(g.seconds[1], 4 * g.seconds[0], rtol=ROUNDING)


def test_batch_scaling_also_brings_bytes_into_range(est):
    # a batched GEMM whose batch count is answered but whose bytes are not (128 Ki
    # products of 512x64 by 64x512 in fp16: 86 GB against 82 GB answered): the batch is
    # reduced until the bytes are in range, and the time scaled back by the same factor
    dev = lookup_device("A100-SXM-80GB")
    model = est.models.get("gemm")
    big = Gemm(512, 512, 64, 131072)
    rows = np.array([[big.m, big.n, big.k, big.batch]])
    assert not model.predict_raw(rows, ["bmm"], DeviceSpecs.single(dev, "float16", 1),
                                 [dev.name], ["float16"])[2][0]
    factor, part = scale_rows(model, rows, ["bmm"], DeviceSpecs.single(dev, "float16", 1))
    assert part[0, :3].tolist() == [512, 512, 64] and factor[0] == 131072 / part[0, 3]
    t = est.estimate([big, Gemm(512, 512, 64, int(part[0, 3]))], dev, "float16")
    assert t.source == ("mlp:bmm-fp16 (scaled)", "mlp:bmm-fp16")
    np.testing.assert_allclose(t.seconds[0], factor[0] * t.seconds[1], rtol=ROUNDING)


def test_a_convolution_is_scaled_when_its_implicit_gemm_outgrows_the_data(est):
    # VGG's first convolution at batch 64 (within the answered 128): its backward-filter
    # reduction N·P·Q = 64·224·224 = 3.2 M is beyond the answered 1.7 M (2 × 862,048),
    # so the batch is reduced to bring it in, and the time scaled back
    dev = lookup_device("H100-SXM")
    model = est.models.get("conv")
    k = Conv(64, 3, 224, 224, 64, 3, 3, 1, 1, 1, 1, phase="bwd_filter")
    factor, part = scale_rows(model, conv_rows([k]), [k.op],
                              DeviceSpecs.single(dev, "float32", 1))
    assert part[0, 0] == 64 * 862048 * 2 // (64 * 224 * 224) == 34
    assert factor[0] == 64 / 34
    small = Conv(34, 3, 224, 224, 64, 3, 3, 1, 1, 1, 1, phase="bwd_filter")
    _scaled_from(est, k, small, dev, 64 / 34)


def _scaled_from(est, big, small, dev, ratio):
    """``big`` is timed as the backward-filter pass ``small`` times ``ratio`` (fp32)."""
    t = est.estimate([big, small], dev, "float32")
    assert t.source == ("mlp:conv_bwd_filter-fp32 (scaled)", "mlp:conv_bwd_filter-fp32")
    np.testing.assert_allclose(t.seconds[0], ratio * t.seconds[1], rtol=ROUNDING)


def test_an_image_beyond_the_data_is_timed_on_bands_of_output_rows(est):
    # one 2048x2048 image (the data's largest map is 700x161 = 112,700 pixels, answered
    # to twice that): the output is cut into bands of rows, as domain parallelism would
    # cut it, the bands stacked into the batch (so the kernel timed is as large as the
    # original, not one idle band), the batch reduced to what the model answers for, and
    # the time scaled by the output rows of the image over those of the timed bands
    dev = lookup_device("H100-SXM")
    model = est.models.get("conv")
    cap = model.first.hi + model.first.tolerance()
    max_out, max_in = (2.0 ** cap[model.first.features.index(f)]
                       for f in ("log2_out_hw", "log2_hw"))
    for phase, pad, stride, r in (("fwd", 1, 1, 3), ("bwd_data", 1, 1, 3),
                                  ("bwd_filter", 1, 1, 3), ("fwd", 3, 2, 7)):
        k = Conv(1, 64, 2048, 2048, 64, r, r, stride, stride, pad, pad, phase=phase)
        factor, part = scale_rows(model, conv_rows([k]), [k.op],
                                  DeviceSpecs.single(dev, "float32", 1))
        n, _, h, w = (int(v) for v in part[0, :4])
        out_rows = (2048 + 2 * pad - r) // stride + 1
        band_rows = (h + 2 * pad - r) // stride + 1
        assert w == 2048 and n > 1, (phase, part[0])
        # the largest band the model answers for (in output and in input pixels),
        # reading exactly the input rows its output rows need
        assert band_rows == min(int(max_out // out_rows),
                                int((max_in / 2048 - r + 2 * pad) // stride + 1))
        assert h == (band_rows - 1) * stride + r - 2 * pad
        assert factor[0] == out_rows / (n * band_rows)
        band = Conv(n, 64, h, 2048, 64, r, r, stride, stride, pad, pad, phase=phase)
        t = est.estimate([k, band], dev, "float32")
        assert t.source == (f"mlp:conv_{phase}-fp32 (scaled)", f"mlp:conv_{phase}-fp32")
        np.testing.assert_allclose(t.seconds[0], factor[0] * t.seconds[1], rtol=ROUNDING)
    # with stacking, one big image costs what the same pixels in a batch of bands cost
    one = Conv(1, 32, 2048, 2048, 32, 3, 3, 1, 1, 1, 1)
    stacked = Conv(32, 32, 64, 2048, 32, 3, 3, 1, 1, 1, 1)
    t = est.estimate([one, stacked], dev, "float32").seconds
    assert 0.9 < t[0] / t[1] < 1.1


def test_what_no_split_can_bring_in_stays_on_the_roofline(est):
    dev = lookup_device("H100-SXM")
    # a 15 x 15 filter (225 taps against the data's 100, answered to 200): neither the
    # batch, the image nor the channels make this convolution answerable
    wide = Conv(512, 64, 56, 56, 64, 15, 15, 1, 1, 7, 7)
    assert est.estimate([wide], dev, "float32").source == ("roofline (out of range)",)


@pytest.mark.parametrize("phase", ["fwd", "bwd_data", "bwd_filter"])
@pytest.mark.parametrize("dim", ["c", "k"])
def test_channels_beyond_the_data_are_split_and_scaled(est, phase, dim):
    # The data's widest convolution has 2,048 channels, answered to 4,096. A wider one is
    # timed as the 4,096-channel part and scaled by the channels (a sum of partial
    # convolutions, or independent ones): doubling the channels beyond the data doubles
    # the time exactly. Before, it fell back to the roofline: the review found a
    # bwd_filter pass predicted 7.6x faster for twice the input channels.
    dev = lookup_device("H100-SXM")
    t = []
    for ch in (4096, 8192, 16384, 65536):
        kw = {"c": 64, "k": 64, dim: ch}
        k = Conv(16, kw["c"], 14, 14, kw["k"], 1, 1, phase=phase)
        times = est.estimate([k], dev, "bfloat16")
        label = f"mlp:conv_{phase}-bf16"
        assert times.source[0] == (label if ch == 4096 else f"{label} (scaled)")
        t.append(float(times.seconds[0]))
    np.testing.assert_allclose(np.array(t[1:]) / t[0], [2.0, 4.0, 16.0], rtol=ROUNDING)


def test_a_convolution_whose_filter_makes_its_gemm_too_wide_is_split_by_channels(est):
    # 1,024 input channels of a 7 x 7 backward-filter pass: each channel count is in
    # range but the implicit GEMM's C·R·S = 50,176 is beyond the answered 41,600 (2 x
    # 20,800); the input channels are split until it is in, and the time scaled back
    dev = lookup_device("V100-SXM2")
    model = est.models.get("conv")
    k = Conv(1, 1024, 8, 8, 512, 7, 7, 1, 1, 3, 3, phase="bwd_filter")
    factor, part = scale_rows(model, conv_rows([k]), [k.op],
                              DeviceSpecs.single(dev, "float32", 1))
    # the most channels in range: 848 · 49 = 41,552 (849 · 49 = 41,601 is not)
    assert part[0, 1] == 848 and part[0].tolist()[2:] == conv_rows([k])[0].tolist()[2:]
    assert factor[0] == 1024 / 848
    small = Conv(1, 848, 8, 8, 512, 7, 7, 1, 1, 3, 3, phase="bwd_filter")
    _scaled_from(est, k, small, dev, 1024 / 848)


def test_a_gemm_reduction_beyond_the_data_is_split(est):
    # A weight gradient over 2 M tokens (K = 2^21 against the data's 500,000, answered
    # to 1 M): timed as parts of the largest K answered and scaled; it was on the roofline
    dev = lookup_device("H100-SXM")
    model = est.models.get("gemm")
    factor, part = scale_rows(model, np.array([[1024, 1024, 2 ** 21, 1]]), ["gemm"],
                              DeviceSpecs.single(dev, "bfloat16", 1))
    cap_k = 1_000_000  # twice the data's largest K, 500,000
    assert part.tolist() == [[1024, 1024, cap_k, 1]] and factor[0] == 2 ** 21 / cap_k
    big = Gemm(1024, 1024, 2 ** 21)
    t = est.estimate([big, Gemm(1024, 1024, cap_k)], dev, "bfloat16")
    assert t.source == ("mlp:gemm-bf16 (scaled)", "mlp:gemm-bf16")
    np.testing.assert_allclose(t.seconds[0], 2 ** 21 / cap_k * t.seconds[1], rtol=ROUNDING)


@pytest.mark.parametrize("device", ["T4", "A100-PCIe-40GB", "H100-SXM", "H200", "L4"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_never_faster_than_the_datasheet_roofline(est, device, dtype):
    rng = np.random.default_rng(1)
    dev = lookup_device(device)
    ks: list = [Gemm(*(int(v) for v in rng.integers(1, 8192, 3)), int(rng.integers(1, 64)))
                for _ in range(200)]
    for _ in range(200):
        c, k = (int(v) for v in rng.integers(1, 1024, 2))
        hw = int(rng.integers(7, 128))
        r = int(rng.choice([1, 3, 5]))
        ks.append(Conv(int(rng.integers(1, 64)), c, hw, hw, k, r, r, 1, 1, r // 2, r // 2,
                       phase=rng.choice(["fwd", "bwd_data", "bwd_filter"])))
    # beyond the data's batch: timed scaled
    ks += [Conv(int(rng.integers(129, 2048)), 256, 14, 14, 256, 3, 3, 1, 1, 1, 1,
                phase=rng.choice(["fwd", "bwd_data", "bwd_filter"])) for _ in range(20)]
    ks += [Gemm(int(rng.integers(2**17, 2**20)), 4096, 1024) for _ in range(20)]
    # beyond the data's image size: timed on bands of rows
    ks += [Conv(int(rng.integers(1, 4)), 64, int(hw), int(hw), 64, 3, 3, 1, 1, 1, 1,
                phase=rng.choice(["fwd", "bwd_data", "bwd_filter"]))
           for hw in rng.integers(1024, 4096, 20)]
    t = est.estimate(ks, dev, dtype)
    assert all(s.endswith("(scaled)") for s in t.source[-60:])
    mlp = np.array([s.startswith("mlp:") for s in t.source])
    assert mlp.mean() > 0.5  # the rest: out of the measured range, timed by the roofline
    bound = _roofline_bound(ks, dev, dtype)
    # by construction t = max(t_flop / e, t_byte)·(1 + exp(−z)) with e ≤ 1
    assert np.all(t.seconds[mlp] >= bound[mlp] * (1 - 1e-12))


def test_bigger_gemm_is_never_much_faster(est):
    # Doubling one dimension doubles the work, and the fit penalises a halved kernel
    # predicted slower than the whole (train.py, _Pairs). Kernels of 20 µs and more: never
    # more than 3% faster doubled (the step a wave-quantisation feature may still take;
    # shipped: worst 1.00). Under 20 µs, since the H100's graph-timed rows took the launch
    # floor from 6.8 to 2.2 µs: two pairs of 576 under 0.97, the T4's (0.932) and the
    # V100's (0.965) 64³ GEMM against 64 × 128 × 64 (μ = 30 brings the worst to 0.98 but
    # the leave-one-GPU-out T4 and P100 over 20%; README "Monotone in the work"); without
    # the penalty 0.80. Since the H200's rows, one pair: the V100's 512 × 64 × 64 (6.6 µs)
    # against 1,024 × 64 × 64, 0.911.
    worst_big, worst_small = 1.0, 1.0
    for device in ("T4", "V100-PCIe", "A100-PCIe-40GB", "H100-SXM"):
        dev = lookup_device(device)
        base = [Gemm(m, n, k) for m in (64, 512, 2048, 8192) for n in (64, 512, 2048, 8192)
                for k in (64, 512, 4096)]
        t0 = est.estimate(base, dev, "float32").seconds
        for axis in range(3):
            big = [Gemm(*(d * 2 if i == axis else d for i, d in enumerate((g.m, g.n, g.k))))
                   for g in base]
            ratio = est.estimate(big, dev, "float32").seconds / t0
            long = t0 >= 20e-6
            worst_big = min(worst_big, float(np.min(ratio[long])))
            worst_small = min(worst_small, float(np.min(ratio[~long])))
    assert worst_big > 0.97
    assert worst_small > 0.90


def test_doubled_gemms_are_rarely_much_faster_on_any_fitted_gpu(est):
    """Every GPU the GEMM model was fitted on, across the answered range, not only where
    each was measured (README "Monotone in the work"): of 1,500 random FP32 GEMMs of
    20 µs or more, those predicted over 20% faster with M, N or K doubled. Fitted on
    each GPU's own kernels alone the P4 had 112 (worst 0.18x: its data start at 512
    rows), the M40 65 and the TITAN X (Maxwell) 64 (0.21x); with pairs drawn across
    the range on every GPU, measured 9 (0.31x), 3 and 5, 0-2 elsewhere."""
    from .benchmarks.monotone import doubled_faster

    got = doubled_faster(est)
    assert len(got) == 13  # 13 GPUs, the H100 and H200 among them
    # the README's row, as the benchmark prints it today
    row = next(line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| with the cross-GPU pairs (shipped) |"))
    order = [["P4"], ["M40"], ["TITAN-X-Maxwell"], ["T4"], ["GTX-1080-Ti"],
             ["TITAN-X-Pascal"], ["P100-PCIe"], ["TITAN-Xp"], ["V100-PCIe", "V100-SXM2"],
             ["A100-PCIe-40GB", "H100-SXM", "H200"]]
    cells = [c.strip() for c in row.split("|")[2:-1]]
    for names, cell in zip(order, cells, strict=True):
        counts = ", ".join(str(got[n][0]) for n in names)
        if len(set(counts.split(", "))) == 1 and len(names) == 3:
            counts = counts.split(", ")[0]  # "0" for the three alike
        shown = cell.split(" (")[0]
        assert shown == counts, (names, cell, counts)
        if "×" in cell:
            assert cell.endswith(f"({got[names[0]][1]:.2f}×)"), (names, cell)
    assert max(n for n, _ in got.values()) <= 12, got
    assert sum(n for n, _ in got.values()) <= 30, got
    assert min(w for _, w in got.values()) > 0.25, got


def test_readme_small_gemms_on_gpus_measured_large_are_current(est):
    """The README's P4 and M40 GEMMs below their measurements ("Monotone in the work":
    "With the cross-GPU pairs these are ...") are what the shipped model predicts, to the
    0.1 µs they show."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    m = re.search(r"With the cross-GPU pairs these are ([\d.]+) and ([\d.]+) µs, ([\d.]+) "
                  r"against ([\d.]+) µs, and ([\d.]+), ([\d.]+), ([\d.]+) µs", text)
    assert m is not None
    quoted = [float(v) for v in m.groups()]
    p4 = est.estimate([Gemm(202, 42, 170), Gemm(202, 84, 170), Gemm(16, 1024, 1024),
                       Gemm(64, 1024, 1024)], lookup_device("P4"), "float32").seconds
    m40 = est.estimate([Gemm(m, 1024, 1024) for m in (16, 32, 64)], lookup_device("M40"),
                       "float32").seconds
    got = [round(float(t) * 1e6, 1) for t in (*p4, *m40)]
    assert got == quoted


def test_a_bigger_batch_of_convolutions_is_rarely_faster(est):
    # ResNet-like layers (32-512 channels, 7-56 pixels, 1x1 and 3x3, batch 1-64) against
    # twice the batch. DeepBench's measured batch pairs: 0.3-1.3% over 5% faster at twice
    # the batch (cuDNN switches algorithm). Shipped models: 0.0-0.1% per GPU and pass
    # (4 GPUs, 3 passes); before the harness overhead's drift along NeuSight's conv
    # sweep was fitted (2026-11-28) 0.1-3.1%, before the monotonicity penalty 2.1-7.2%.
    for device in ("T4", "V100-SXM2", "A100-PCIe-40GB", "H100-SXM"):
        dev = lookup_device(device)
        for phase in ("fwd", "bwd_data", "bwd_filter"):
            base = [Conv(n, c, hw, hw, k, r, r, 1, 1, r // 2, r // 2, phase=phase)
                    for n in (1, 4, 16, 64) for c in (32, 64, 128, 256, 512)
                    for k in (32, 64, 128, 256, 512) for hw in (7, 14, 28, 56) for r in (1, 3)]
            big = [Conv(2 * b.n, b.c, b.h, b.w, b.k, b.r, b.s, 1, 1, b.r // 2, b.s // 2,
                        phase=phase) for b in base]
            ratio = est.estimate(big, dev, "float32").seconds / \
                est.estimate(base, dev, "float32").seconds
            assert np.mean(ratio < 1 / 1.05) <= 0.01, (device, phase)


def _energy_by_hand(model, dtype: str = "float32") -> float:
    """E_min = min over measured GPUs of TDP / (e · peak), from the catalog and levels."""
    out = []
    for key, e in model.levels.items():
        if key.count("|") != 1 or not key.endswith(f"|{dtype}"):
            continue
        dev = lookup_device(key.split("|")[0])
        if dev.tdp_w:
            out.append(dev.tdp_w / (e * dev.peak("fp32")))
    return min(out)


@pytest.mark.parametrize("name", ["L4"])  # the H100 was measured on 2026-11-27
def test_unseen_gpu_level_comes_from_its_datasheet(est, name):
    """A GPU with no measurements and no measured sibling die: the class median, capped by
    what its TDP pays for at the least energy per FLOP measured, floored at base/boost."""
    model = est.models.get("gemm").first  # one network for GEMM
    median = model.unseen_levels["float32"]
    e_min = _energy_by_hand(model)
    assert model.unseen_energy["float32"] == pytest.approx(e_min, rel=1e-12)
    dev = lookup_device(name)
    pred = est.explain(Gemm(8192, 8192, 8192), dev, "float32")
    assert pred.gpu_seen is False
    want = min(median, dev.tdp_w / (e_min * dev.peak("fp32")))
    if dev.base_clock_hz:
        want = max(want, min(dev.base_clock_hz / dev.clock_hz, median))
    assert pred.sustained_fraction == pytest.approx(want, rel=1e-12)
    assert 0.3 < pred.bound_s / pred.seconds <= 1.0


@pytest.mark.parametrize("name, sibling", [("A100-SXM-80GB", "A100-PCIe-40GB"),
                                           ("P100-SXM2", "P100-PCIe"),
                                           ("H100-PCIe", "H100-SXM")])
def test_unseen_board_of_a_measured_die_gets_its_sustained_flops(est, name, sibling):
    model = est.models.get("gemm").first
    dev, sib = lookup_device(name), lookup_device(sibling)
    assert dev.chip == sib.chip != ""
    e_0 = min(model.levels[f"{sibling}|float32"] * sib.peak("fp32") / dev.peak("fp32"), 1.0)
    want = min(e_0, dev.tdp_w / (_energy_by_hand(model) * dev.peak("fp32")))
    if dev.base_clock_hz:
        want = max(want, min(dev.base_clock_hz / dev.clock_hz, e_0))
    pred = est.explain(Gemm(8192, 8192, 8192), dev, "float32")
    assert pred.gpu_seen is False
    assert pred.sustained_fraction == pytest.approx(want, rel=1e-12)


def test_a_board_without_a_base_clock_takes_its_same_clock_siblings():
    """The base/boost floor of the unseen-GPU prior: the catalog's own base clock where it
    has one; the H200 SXM has none we could confirm and takes the H100 SXM's (one GH100
    die at 1,980 MHz boost and 700 W: 1,590 / 1,980, datasheet); a board with no such
    sibling stays unknown."""
    import dataclasses
    import math

    from planner.kernels.features import clock_ratio

    assert clock_ratio(lookup_device("A100-SXM-80GB")) == pytest.approx(1275 / 1410, rel=1e-12)
    assert lookup_device("H200").base_clock_hz is None
    assert clock_ratio(lookup_device("H200")) == pytest.approx(1590 / 1980, rel=1e-12)
    h200 = lookup_device("H200")
    # more power than the sibling: still its floor; less power, or another boost clock,
    # or no die named: no sibling
    assert clock_ratio(dataclasses.replace(h200, tdp_w=1000.0)) == pytest.approx(1590 / 1980)
    # at the H100 PCIe's boost clock (350 W, base 1,125 MHz): its ratio
    assert clock_ratio(dataclasses.replace(h200, clock_hz=1755e6)) == pytest.approx(1125 / 1755)
    for other in (dataclasses.replace(h200, tdp_w=600.0),
                  dataclasses.replace(h200, clock_hz=1800e6),
                  dataclasses.replace(h200, chip="")):
        assert math.isnan(clock_ratio(other))


def test_catalog_clocks_and_power_are_consistent():
    from planner.cluster import catalog

    for dev in catalog().values():
        if dev.kind != "gpu":
            continue
        assert dev.tdp_w and 20 <= dev.tdp_w <= 1500, dev.name
        assert dev.clock_hz and dev.chip, dev.name
        if dev.base_clock_hz:
            assert dev.base_clock_hz <= dev.clock_hz, dev.name


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["T4", "V100-PCIe"])
def test_leave_one_gpu_out(runner, tmp_path, gpu):
    """Issue 4's figure that matters most: a model fitted without any row of the GPU
    predicts its GEMM test rows, issue 4 asks within 20% MAPE (README: T4 and V100-PCIe
    are the two the datasheet prior decides; 100 to 250 s each)."""
    out = tmp_path / "logo"
    invoke(runner, "kernels", "fit", str(LINEAR), str(BMM), str(DB_GEMM), *map(str, HOPPER),
           "--only", "gemm", "--leave-out", gpu, "-o", str(out))
    r = invoke(runner, "kernels", "eval", str(LINEAR), "--models-dir", str(out), "--device",
               gpu, "--split", "test", "--format", "json")
    (row,) = [x for x in json.loads(r.stdout)["results"] if x["op"] == "gemm"]
    assert row["n"] == 335
    # the README's figures within a point: the fit carries the CPU's BLAS rounding into
    # its weights. Measured on AMD EPYCs (2026-12-07): 18.73 and 10.39% where OpenBLAS
    # ran its SkylakeX kernels, 18.72 and 11.04% where OpenBLAS 0.3.31 (numpy 2.4.6)
    # chose its Haswell ones on the same kind of CPU (0.5 points allowed before; the
    # second machine failed it); and within issue 4's 20% either way
    assert row["mape"] == pytest.approx({"T4": 18.73, "V100-PCIe": 10.39}[gpu], abs=1.0)
    assert row["mape"] <= 20.0
    # README "Error bands": on a GPU it has not seen, fewer rows than the 90% of the
    # held-out ones fall in their band (28.1% on the T4, 83.6% on the V100-PCIe under
    # SkylakeX kernels; 30.45 and 80.6% under Haswell ones: 4 points allowed for the
    # CPU's rounding in the fit)
    assert row["in_band"] == pytest.approx({"T4": 28.1, "V100-PCIe": 83.6}[gpu], abs=4.0)
    assert row["in_band"] < 90.0


def _run_benchmark(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Standard output of tests/benchmarks/SCRIPT run in a fresh interpreter."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(ROOT / "tests" / "benchmarks" / script), *args],
                          env=env, capture_output=True, text=True, check=True,
                          timeout=300).stdout


def test_a_thousand_layer_search_is_timed_in_a_fixed_number_of_network_passes():
    """What makes 6,000 kernels take milliseconds (issue 4's 50 ms; the figure is the
    benchmark's, tests/benchmarks/kernels.py, in the README): one call runs every kernel
    through each network once, 11 passes (the GEMM network and the ten convolution
    networks) whatever the kernel count, each over all its rows. This replaces a test
    that timed the benchmark against 50 ms: the same code took 18.3 ms on one 2-core
    machine and 50.8-59.6 ms on a slower one (numpy's tanh at 30 ns an element), so it
    judged the machine (the project's rule: performance goals are checked by
    benchmarks, not timed unit tests)."""
    from unittest import mock

    from planner.kernels.mlp import Mlp

    from .benchmarks.kernels import kernels

    ks = kernels()
    models = load_models()
    dev = lookup_device("H100-SXM")
    rest = Mlp.rest
    passes: dict[int, list[int]] = {}
    for n in (60, 600, 6000):
        rows: list[int] = []

        def counted(self, a1, rows=rows):
            rows.append(a1.shape[0])
            return rest(self, a1)

        with mock.patch.object(Mlp, "rest", counted):
            LearnedEstimator(models=models).estimate(ks[:n], dev, "bfloat16")
        passes[n] = rows
    assert [len(r) for r in passes.values()] == [11, 11, 11]
    # 60 kernels: 30 GEMMs through one network, 30 convolutions through ten
    assert sum(passes[60]) == 30 + 10 * 30


def test_the_readmes_breakdown_by_reduction_length_agrees_with_eval(runner):
    """tests/benchmarks/gemm_by_k.py (the README's leave-one-GPU-out P100 breakdown):
    its all-rows figure is `kernels eval`'s, and its two parts add up to it."""
    out = _run_benchmark("gemm_by_k.py", "P100-PCIe")
    got = {}
    for line in out.splitlines():
        label = line.split(":")[0].split(" ", 1)[1].strip()
        n = int(line.split("n =")[1].split()[0])
        mape = float(line.split("MAPE")[1].split("%")[0])
        got[label] = (n, mape)
    assert set(got) == {"all", "K < 16,384", "K >= 16,384"}
    r = invoke(runner, "kernels", "eval", DATA / "neusight" / "neusight_linear_fp32.csv",
               "--split", "test", "--device", "P100-PCIe", "--format", "json")
    (rec,) = json.loads(r.stdout)["results"]
    assert got["all"][0] == rec["n"] == got["K < 16,384"][0] + got["K >= 16,384"][0]
    assert got["all"][1] == pytest.approx(rec["mape"], abs=0.051)  # printed to 0.1
    weighted = (got["K < 16,384"][0] * got["K < 16,384"][1]
                + got["K >= 16,384"][0] * got["K >= 16,384"][1]) / got["all"][0]
    assert weighted == pytest.approx(got["all"][1], abs=0.1)


def test_the_readmes_convolution_residuals_agree_with_eval(runner):
    """tests/benchmarks/conv_residuals.py (the README's account of the NeuSight forward
    misses): per GPU its all-rows MAPE is `kernels eval`'s and the calls under and over
    1 ms add up to it; the four GPUs ran the shapes in one order (positions correlate
    1.000), and with the harness overhead's drift fitted the same shape's errors no longer
    move together across GPUs (measured 0.11-0.39; 0.81-0.90 before), its 20 nearest
    training shapes explain little (measured 0.5-1.1 points) and no tenth of the sweep is
    off on average by more than 8% (short calls) or 3% (long ones: the T4's worst tenth,
    2% before the H200's rows)."""
    out = _run_benchmark("conv_residuals.py").splitlines()
    r = invoke(runner, "kernels", "eval", DATA / "neusight" / "neusight_conv2d_fwd_fp32.csv",
               "--split", "test", "--format", "json")
    evals = {x["device"]: x for x in json.loads(r.stdout)["results"]}
    head = out.index("held-out MAPE by measured time")
    for line in out[head + 1:head + 5]:
        every, short, long_ = [(float(m), int(n)) for m, n in
                               re.findall(r"([\d.]+)% \(n = (\d+)\)", line)]
        rec = evals[line.split()[0]]
        assert every[1] == rec["n"] == short[1] + long_[1]
        assert every[0] == pytest.approx(rec["mape"], abs=0.051)  # printed to 0.1
        weighted = (short[0] * short[1] + long_[0] * long_[1]) / rec["n"]
        assert weighted == pytest.approx(rec["mape"], abs=0.1)
    corr = out.index("correlation of the log error of the same shape on two GPUs "
                     "(< 1 ms on both)")
    values = [float(v) for line in out[corr + 1:corr + 5]
              for v in line.split()[1::2]]
    assert sorted(values)[-4:] == [1.0] * 4 and max(sorted(values)[:-4]) < 0.5
    pos = out.index("correlation of the same shape's position in the two sweeps")
    assert all(float(v) > 0.999 for line in out[pos + 1:pos + 5] for v in line.split()[1:])
    knn_head = out.index("held-out MAPE corrected by the 20 nearest training shapes")
    knn = [line.split() for line in out[knn_head + 1:knn_head + 5]]
    assert all(0.0 <= float(a.rstrip("%")) - float(b.rstrip("%")) < 1.5
               for _, a, _, b in knn)
    tenths = out.index("mean error (%, measured / predicted - 1) by tenth of the sweep, "
                       "all rows")
    for line in out[tenths + 1:tenths + 9]:
        worst = max(abs(float(v)) for v in line.split()[-10:])
        assert worst <= (8.0 if "< 1 ms" in line else 3.0), line


def test_deepbench_convolution_misses_are_the_shapes():
    """tests/benchmarks/deepbench_shapes.py (the README's account of the DeepBench misses):
    two boards of one die agree within 5% on held-out shapes (measured 1.5-3.8% for
    M40 -> TITAN X (Maxwell) and TITAN Xp -> GTX 1080 Ti), and the same shape's error on
    the other GPUs takes each Maxwell and Pascal GPU's backward-data MAPE under 11.5%
    (measured 7.0-10.7%, from 15.1-19.1%), while the T4 and the V100, whose libraries
    chose otherwise, stay over 15% (21.8 / 17.7%)."""
    out = _run_benchmark("deepbench_shapes.py").splitlines()
    for line in out:
        if line.startswith(("M40 -> ", "TITAN-Xp -> GTX")):
            assert all(float(v) < 5.0 for v in re.findall(r"([\d.]+)% \(", line)), line
    head = out.index("device                       conv_fwd        conv_bwd_data      "
                     "conv_bwd_filter")
    table = {line.split()[0]: [(float(a), float(b)) for a, b in
                               re.findall(r"([\d.]+) -> +([\d.]+)%", line)]
             for line in out[head + 1:head + 9]}
    assert len(table) == 8
    for dev, passes in table.items():
        before, after = passes[1]  # backward-data
        if dev in ("T4", "V100-SXM2"):
            assert after > 15.0, dev
        else:
            assert after < 11.5 < before, dev
    # about 29 held-out shapes a GPU: backward-data's per-GPU MAPE has a standard error of
    # 2 points or more (measured 2.7-5.1), and the mean's 90% interval is wide (measured
    # 14.6-23.7% around 19.0%)
    figures = r"standard error ([\d.]+)-([\d.]+) points; mean ([\d.]+)% \(90%: ([\d.]+)-([\d.]+)%\)"
    sampling = {line.split()[0]: [float(v) for v in re.search(figures, line).groups()]
                for line in out if line.startswith(("conv_fwd ", "conv_bwd_"))}
    assert set(sampling) == {"conv_fwd", "conv_bwd_data", "conv_bwd_filter"}
    for op, (se_lo, se_hi, mean, lo, hi) in sampling.items():
        assert 0 < se_lo <= se_hi and lo < mean < hi, op
    se_lo, _, _, lo, hi = sampling["conv_bwd_data"]
    assert se_lo >= 2.0 and hi - lo > 6.0


def test_the_scaling_check_reads_the_shipped_data():
    """tests/benchmarks/scaling.py (the README's check of scaling by the work) runs on
    the repository's data: four distributions with pairs in each, and the medians the
    README quotes (rounded there to 0.01)."""
    out = _run_benchmark("scaling.py")
    medians = [float(line.split("median")[1].split()[0]) for line in out.splitlines()]
    pairs = [int(line.split("pairs")[1].split()[0]) for line in out.splitlines()]
    assert pairs == [264, 249, 264, 3038]
    assert medians == pytest.approx([1.14, 1.11, 1.15, 1.00], abs=0.005)

# --- data --------------------------------------------------------------------------------


def test_layouts_are_detected_from_the_header():
    assert detect_layout(["split", "device", "B", "M", "N", "K", "latency_ms"]) == "neusight"
    assert detect_layout(["device", "batch", "in_channels", "out_channels", "kernel_size",
                          "input_size", "stride", "padding", "latency_ms"]) == "neusight-conv"
    assert detect_layout(["gpu", "precision", "M", "N", "K", "time_ms"]) == "deepbench-gemm"
    assert detect_layout(["a", "b"]) is None


def test_csv_readers_map_shapes():
    lin = parse_csv("split,device,B,M,N,K,latency_ms\ntrain,Tesla T4,1,8,16,32,0.1\n",
                    "neusight_linear_x.csv").gemm
    assert lin.shape == [(8, 32, 16, 1)] and lin.op == ["gemm"] and lin.device == ["T4"]
    bmm = parse_csv("split,device,B,M,N,K,latency_ms\ntest,Tesla T4,4,8,16,32,0.1\n",
                    "bmm.csv").gemm
    assert bmm.shape == [(8, 32, 16, 4)] and bmm.op == ["bmm"]
    db = read_csv(DB_CONV)
    assert set(db.conv.op) == {"conv_fwd", "conv_bwd_data", "conv_bwd_filter"}
    with DB_CONV.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(db.conv) == sum(1 for row in rows for c in ("fwd_ms", "bwd_data_ms",
                                                           "bwd_filter_ms") if row[c])


def test_unknown_device_is_an_input_error_with_position():
    text = "split,device,B,M,N,K,latency_ms\ntrain,Tesla T5,1,8,16,32,0.1\n"
    with pytest.raises(InputError) as info:
        parse_csv(text, "x.csv")
    assert str(info.value).startswith("x.csv:2:7: error: unknown device 'Tesla T5'")


def test_unknown_device_is_reported_once_with_its_row_count():
    """A file of a GPU the catalog lacks gets one error a device, at its first row, with
    how many more rows name it (it was the same error on every row, up to 50)."""
    rows = "".join(f"train,Tesla T5,1,8,16,{32 * (i + 1)},0.1\n" for i in range(60))
    text = ("split,device,B,M,N,K,latency_ms\n" + rows + "train,Tesla T6,1,8,16,32,0.1\n"
            "train,T4,1,8,16,32,-1\n")
    with pytest.raises(InputError) as info:
        parse_csv(text, "x.csv")
    got = [(p.line, p.message) for p in info.value.problems]
    assert [(line, m.split(" (`")[0]) for line, m in got] == [
        (2, "unknown device 'Tesla T5'"),  # T5 is no spelling of T4
        (62, "unknown device 'Tesla T6'"),
        (63, "expected a positive time in milliseconds up to 1,000,000 (one kernel), got '-1'")]
    assert got[0][1].endswith("given with --cluster); 59 more rows name it")
    assert got[1][1].endswith("given with --cluster)")  # one row: no count


def test_a_time_faster_than_the_roofline_is_an_input_error():
    """A row more than 4x under the device's roofline bound at its datasheet peak is not a
    measurement (seconds in the milliseconds column): an error at its time cell, the first
    five and a count (found by an audit: fit trained on them, and one such file moved a
    4096^3 H100 GEMM's prediction by 20%). By hand: 2·4096³ FLOP at the H100's 495
    TFLOP/s TF32 (FP32 rows may have run with TF32 on) is 0.2777 ms, so 1e-06 ms is
    2.78e+05x under it; 2.5 ms is over it. The shipped data reach 1.71x at most (a T4's
    fp16 convolutions)."""
    from planner.kernels.data import MAX_OVER_ROOFLINE

    assert MAX_OVER_ROOFLINE == 4.0
    head = "m,n,k,batch,time_ms,device,dtype,op\n"
    fine = "4096,4096,4096,1,2.5,H100-SXM,float32,gemm\n"
    fast = "".join(f"4096,4096,{4096 + i},1,0.000001,H100-SXM,float32,gemm\n"
                   for i in range(8))
    assert len(parse_csv(head + fine, "x.csv").gemm) == 1
    # FP32 measured with TF32 on (an A100's 4096^3 at 120 TFLOP/s: 1.1453 ms, 6.2x its
    # 19.5 TFLOP/s FP32 peak, under its 156 TFLOP/s TF32 one) is a measurement (found by
    # a review: the check refused it)
    tf32 = "4096,4096,4096,1,1.1453,A100-SXM-80GB,float32,gemm\n"
    assert len(parse_csv(head + tf32, "x.csv").gemm) == 1
    with pytest.raises(InputError) as info:
        parse_csv(head + fine + fast, "x.csv")
    got = info.value.problems
    assert [(p.line, p.column) for p in got] == [(3, 18), (4, 18), (5, 18), (6, 18), (7, 18),
                                                 (8, 18)]
    assert got[0].message.startswith("gemm 4096x4096x4096x1 in 1e-06 ms is 2.78e+05x "
                                     "faster than the H100-SXM's roofline allows at its "
                                     "datasheet peak (495 TFLOP/s in float32, TF32 "
                                     "counted")
    assert got[5].message == "and 3 more rows as fast, from this one on"


# --- error bands -------------------------------------------------------------------------


def test_bands_are_cut_at_quantiles_and_merged_by_hand():
    from planner.kernels.bands import MIN_ROWS, conformal_ranks, cut_bands

    assert MIN_ROWS == 30
    values = np.arange(100.0)
    ratios = np.where(values < 50, 0.75 + 0.01 * values, 2.0 - 0.01 * (values - 50))
    b = cut_bands(values, ratios, (0.5, 0.8, 0.95), "bound_s")
    # numpy's linear quantiles of 0..99 are 49.5, 79.2 and 94.05: 50, 30, 15 and 5 rows.
    # The band of 15 merges with the 5 above it (20 rows), which then merges into the 30
    # below (50 rows): one edge left.
    assert b.edges == (49.5,)
    assert [x.n for x in b.bands] == [50, 50]
    # rows 0-49: ratios 0.75 ... 1.24 in steps of 0.01. Split conformal ranks of 50 rows:
    # floor(51 * 0.05) = 2 and ceil(51 * 0.95) = ceil(48.45) = 49, the 2nd smallest
    # (0.76) and the 49th (1.23)
    assert conformal_ranks(50) == (2, 49)
    assert (b.bands[0].low, b.bands[0].high) == (0.76, 1.23)
    # rows 50-99: ratios 2.00 down to 1.51, the same ranks from the other end
    assert (b.bands[1].low, b.bands[1].high) == (1.52, 1.99)
    # 19 rows: ranks 1 and 19, the extremes; 9 rows: still the extremes (clipped)
    assert conformal_ranks(19) == (1, 19) and conformal_ranks(9) == (1, 9)
    # 1,000 rows: floor(50.05) = 50 and ceil(950.95) = 951
    assert conformal_ranks(1000) == (50, 951)
    assert b.band(49.4) is b.bands[0] and b.band(49.5) is b.bands[1]  # lower edge inclusive


def test_band_records_round_trip_and_are_checked():
    from planner.kernels.bands import Band, OpBands

    b = OpBands("member_spread", (0.05, 0.1), (Band(40, 0.8, 1.2), Band(35, 0.7, 1.3),
                                                Band(31, 0.5, 1.9)))
    assert OpBands.from_record(b.record(), "x") == b
    low, high = b.limits(np.array([0.0, 0.05, 0.099, 3.0]))
    assert low.tolist() == [0.8, 0.7, 0.7, 0.5] and high.tolist() == [1.2, 1.3, 1.3, 1.9]
    for bad, msg in (({**b.record(), "by": "luck"}, "'by' one of"),
                     ({**b.record(), "edges": [0.1, 0.05]}, "ascending edges"),
                     ({**b.record(), "edges": [0.1]}, "one band more than edges"),
                     ({**b.record(), "bands": [{"n": 3}] * 3}, "n, low and high"),
                     ({**b.record(), "bands": [{"n": 3, "low": 1.5, "high": 1.2}] * 3},
                      "0 < low <= high")):
        with pytest.raises(ModelDataError, match=msg):
            OpBands.from_record(bad, "x")


def test_predict_gives_the_band_of_its_kernel(runner):
    manifest = yaml.safe_load((MODELS / MANIFEST).read_text())
    gemm = manifest["error_bands"]["ops"]["gemm"]
    assert gemm["by"] == "bound_s" and len(gemm["bands"]) == len(gemm["edges"]) + 1
    rec = json.loads(invoke(runner, "kernels", "predict", "--device", "V100-PCIe", "--gemm",
                            "4096,4096,4096", "--format", "json").stdout)
    # the band is the one whose edges hold the kernel's roofline bound
    i = int(np.searchsorted(gemm["edges"], rec["bound_s"], side="right"))
    band = gemm["bands"][i]
    assert rec["interval_s"] == pytest.approx([rec["seconds"] * band["low"],
                                               rec["seconds"] * band["high"]], rel=1e-12)
    assert rec["interval_rows"] == band["n"]
    # a bfloat16 GEMM is timed with the bf16 measurements (the H100's), and gets the band
    # of their held-out rows, not the FP32 one
    half = manifest["error_bands"]["ops"]["gemm-bfloat16"]
    rec = json.loads(invoke(runner, "kernels", "predict", "--device", "H100", "--gemm",
                            "4096,4096,4096", "--dtype", "bfloat16", "--format",
                            "json").stdout)
    assert rec["source"] == "mlp:gemm-bf16"
    band = half["bands"][int(np.searchsorted(half["edges"], rec["bound_s"], side="right"))]
    assert rec["interval_s"] == pytest.approx([rec["seconds"] * band["low"],
                                               rec["seconds"] * band["high"]], rel=1e-12)
    assert (band["low"], band["high"]) not in [(b["low"], b["high"]) for b in gemm["bands"]]
    # bf16 convolutions have bands of their own since the H200's DeepBench shapes (37
    # held-out rows a pass with the H100's 4); before, they got FP16's
    conv16 = manifest["error_bands"]["ops"]["conv_fwd-bfloat16"]
    assert [b["n"] for b in conv16["bands"]] == [37]
    rec = json.loads(invoke(runner, "kernels", "predict", "--device", "A100-SXM-80GB", "--conv",
                            "32,64,56,56,64,3,3,1,1", "--dtype", "bfloat16", "--format",
                            "json").stdout)
    assert rec["interval_rows"] == 37
    assert rec["interval_s"] == pytest.approx([rec["seconds"] * conv16["bands"][0]["low"],
                                               rec["seconds"] * conv16["bands"][0]["high"]],
                                              rel=1e-12)
    # a convolution: its band is found by the spread of the five networks
    rec = json.loads(invoke(runner, "kernels", "predict", "--device", "V100-SXM2", "--conv",
                            "32,64,56,56,64,3,3,1,1", "--format", "json").stdout)
    lo, hi = rec["interval_s"]
    assert lo < rec["seconds"] < hi
    assert rec["interval_rows"] in [b["n"] for b in
                                    manifest["error_bands"]["ops"]["conv_fwd"]["bands"]]
    # the roofline has no band
    rec = json.loads(invoke(runner, "kernels", "predict", "--device", "V100-PCIe", "--gemm",
                            "4096,4096,4096", "--dtype", "float64", "--format", "json").stdout)
    assert rec["source"].startswith("roofline") and rec["interval_s"] is None
    table = invoke(runner, "kernels", "predict", "--device", "H100-PCIe", "--gemm",
                   "4096,4096,4096").stdout
    assert "90% of held-out kernels like it" in table and "seen GPUs only" in table
    table = invoke(runner, "kernels", "predict", "--device", "H100", "--gemm",
                   "4096,4096,4096").stdout  # measured since 2026-11-27
    assert "90% of held-out kernels like it" in table and "seen GPUs only" not in table


# --- training ----------------------------------------------------------------------------


def test_training_is_deterministic():
    table = read_csv(DB_GEMM).gemm
    small = table.select([i % 4 == 0 for i in range(len(table))])
    opts = FitOptions(hidden=(8,), max_iter=60)
    a, _ = fit_family(small, opts)
    b, _ = fit_family(small, opts)
    for wa, wb in zip(a.mlp.weights + a.mlp.biases, b.mlp.weights + b.mlp.biases,
                      strict=True):
        assert np.array_equal(wa, wb)
    assert a.levels == b.levels


def _pairs(za_zb_bounds):
    """Memory-bound pairs (t_byte ≫ t_flop) on one GPU, as :class:`_Pairs` holds them."""
    rows = len(za_zb_bounds)
    byte = np.log(np.array([[a, b] for a, b in za_zb_bounds]))
    return _Pairs(np.zeros((rows, 1)), np.zeros((rows, 1)), byte - 10.0, byte,
                  np.zeros(rows, dtype=np.int64), 10.0)


def test_monotonicity_penalty_by_hand():
    # pair 0: the halved kernel's bound is 1.0e-5 s at z = -1, the whole's 1.2e-5 s at
    # z = 3; log u = log bound + log(1 + e^-z), so d = log(1/1.2) + log(1 + e) -
    # log(1 + e^-3) = 1.08235 (the halved kernel predicted 2.95x slower). Pair 1 is
    # monotone (d < 0) and adds nothing. Penalty: mu * mean(max(0, d)^2).
    pairs = _pairs([(1.0e-5, 1.2e-5), (1.0e-5, 2.0e-5)])
    z = np.array([-1.0, 0.0, 3.0, 0.0])  # z_a of both pairs, then z_b
    d = math.log(1 / 1.2) + math.log(1 + math.e) - math.log(1 + math.exp(-3))
    assert d == pytest.approx(1.08235, abs=1e-5)
    pen, g_za, g_zb, g_eta = pairs.penalty(z, np.array([0.0]))
    assert pen == pytest.approx(10.0 * d * d / 2, rel=1e-12)
    # d pen / d z_a = mu * d * d(log(1 + e^-z))/dz = -mu * d * sigmoid(-z) (mean over 2)
    assert g_za == pytest.approx([-10.0 * d / (1 + math.exp(-1.0)), 0.0], rel=1e-12)
    assert g_zb == pytest.approx([10.0 * d / (1 + math.exp(3.0)), 0.0], rel=1e-12)
    # memory-bound: the level does not enter
    assert np.bincount(pairs.lvl_idx, weights=g_eta, minlength=1) == pytest.approx([0.0])


def test_monotonicity_penalty_gradient_matches_finite_differences():
    # compute-bound halves and memory-bound wholes, so the level's gradient is exercised
    rng = np.random.default_rng(3)
    n = 50
    pairs = _Pairs(np.zeros((n, 1)), np.zeros((n, 1)),
                   np.log(rng.uniform(1e-5, 2e-5, (n, 2))) + np.array([0.0, -5.0]),
                   np.log(rng.uniform(1e-5, 2e-5, (n, 2))) - np.array([3.0, 0.0]),
                   rng.integers(0, 3, n), 7.0)
    z = rng.normal(0.0, 2.0, 2 * n)
    eta = rng.normal(0.0, 1.0, 3)
    pen, g_za, g_zb, g_eta = pairs.penalty(z, eta)
    assert pen > 0
    grad = np.concatenate([g_za, g_zb, np.bincount(pairs.lvl_idx, weights=g_eta,
                                                   minlength=3)])
    x = np.concatenate([z, eta])
    h = 1e-6
    for i in range(len(x)):
        e = np.zeros_like(x)
        e[i] = h
        up = pairs.penalty((x + e)[:2 * n], (x + e)[2 * n:])[0]
        down = pairs.penalty((x - e)[:2 * n], (x - e)[2 * n:])[0]
        assert grad[i] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-9)


def test_cross_gpu_pairs_have_their_own_weight_by_hand():
    # three own pairs and two cross pairs, memory-bound (the level does not enter), each
    # d = log u_a - log u_b with z = 0 on both sides: d = log(bound_a / bound_b).
    # Penalty: mu * mean over own of max(0, d)^2 + mu_x * mean over cross of max(0, d)^2
    bounds = [(1.0, 2.0), (3.0, 2.0), (1.0, 1.0), (5.0, 4.0), (1.0, 2.0)]
    byte = np.log(np.array(bounds))
    pairs = _Pairs(np.zeros((5, 1)), np.zeros((5, 1)), byte - 10.0, byte,
                   np.zeros(5, dtype=np.int64), 10.0, n_cross=2, cross_weight=4.0)
    pen, g_za, _, _ = pairs.penalty(np.zeros(10), np.array([0.0]))
    d_own, d_cross = math.log(3 / 2), math.log(5 / 4)
    assert pen == pytest.approx(10.0 * d_own**2 / 3 + 4.0 * d_cross**2 / 2, rel=1e-12)
    # d pen / d z_a = w * 2 d / n * d log(1 + e^-z)/dz at z = 0 (-1/2)
    assert g_za == pytest.approx([0.0, -10.0 * d_own / 3, 0.0, -4.0 * d_cross / 2, 0.0],
                                 rel=1e-12)


def test_cross_gpu_pairs_put_measured_shapes_on_every_gpu_of_the_fit():
    """The penalty's second kind of pair (README "Monotone in the work"): GEMMs whose M,
    N and K are drawn across the measured range, halved, on each level of the fit (here
    one source, DeepBench, so a GPU and dtype each) about equally often, so a GPU
    measured only on large kernels is regularised below them; without the cross weight
    the pairs are the measured kernels' alone, as fitted before (the convolution
    networks are); without the own weight, the cross pairs alone."""
    from planner.kernels.features import features

    table = read_csv(DB_GEMM).gemm
    # the M40 measured only at M of 1,024 and more here
    table = table.select([d != "M40" or s[0] >= 1024
                          for d, s in zip(table.device, table.shape, strict=True)])
    spec = DeviceSpecs.build(table.devices(), table.dtype)

    x = features("gemm", table.shape_array(), table.op, spec)[0]
    mean, std = x.mean(axis=0), np.where(x.std(axis=0) > 1e-9, x.std(axis=0), 1.0)
    keys = list(zip(table.device, table.dtype, strict=True))
    lvl = np.array([sorted(set(keys)).index(k) for k in keys], dtype=np.int64)
    base = FitOptions(mono_pairs=3000).for_family("gemm")
    lo, hi = x.min(axis=0), x.max(axis=0)
    own = _mono_pairs(table, spec, lvl, mean, std,
                      FitOptions(mono_pairs=3000, mono_cross_weight=0.0).for_family("gemm"),
                      lo, hi)
    both = _mono_pairs(table, spec, lvl, mean, std, base, lo, hi)
    assert own is not None and both is not None
    assert base.mono_cross_pairs == 20000 and base.mono_cross_weight == 10.0
    # DeepBench's GEMMs are single (batch 1): the quarter of the pairs that would halve
    # the batch are dropped, of own and cross pairs alike, and of the drawn kernels those
    # beyond the training range, whose FLOPs or bytes the network never answers for
    # (measured: 10,770 of 20,000 kept)
    assert own.n_cross == 0 and 10_000 < both.n_cross < 11_500
    n_own = len(both.xa) - both.n_cross
    # the measured kernels' pairs are drawn as before: the same, first
    assert np.array_equal(both.xa[:n_own], own.xa) and np.array_equal(both.lvl_idx[:n_own],
                                                                      own.lvl_idx)
    # every (GPU, dtype) of the data about equally often (11 of them: 1/11 each)
    share = np.bincount(both.lvl_idx[n_own:], minlength=lvl.max() + 1) / both.n_cross
    assert len(share) == 11 and share.min() > 0.08 and share.max() < 0.1
    # the M40 gets GEMMs of fewer rows than it measured (feature 0: log2 M, normalised),
    # its own pairs none below half its least
    m40 = sorted(set(keys)).index(("M40", "float32"))
    least = (np.log2(512) - mean[0]) / std[0]
    assert np.min(own.xa[own.lvl_idx == m40, 0]) >= least - 1e-9
    cross_m = both.xb[n_own:][both.lvl_idx[n_own:] == m40, 0]
    assert np.mean(cross_m < least - 1e-9) > 0.2
    # all inside the training range, as the model answers them: shape features by the
    # draw, the GPU's (waves, ridge point) clipped
    for xs in (both.xa[n_own:], both.xb[n_own:]):
        raw = xs * std + mean
        assert np.all((raw >= lo - 1e-9) & (raw <= hi + 1e-9))
    # the conv family keeps its pairs: no cross pairs by default, and a weight given
    # (--monotone-cross-weight) gets them (it got none: their count defaulted to 0)
    assert FitOptions().for_family("conv").mono_cross_weight == 0.0
    assert FitOptions(mono_cross_weight=1.0).for_family("conv").mono_cross_pairs == 20000
    # --monotone-weight 0 leaves the cross pairs (it turned both off, while the manifest
    # recorded the cross pairs as fitted)
    alone = _mono_pairs(table, spec, lvl, mean, std,
                        FitOptions(mono_pairs=3000, mono_weight=0.0).for_family("gemm"), lo, hi)
    assert alone is not None and alone.n_cross == len(alone.xa) == both.n_cross
    assert np.array_equal(alone.xa, both.xa[n_own:])
    assert _mono_pairs(table, spec, lvl, mean, std,
                       FitOptions(mono_weight=0.0, mono_cross_weight=0.0).for_family("gemm"),
                       lo, hi) is None
    pen, g_za, _, _ = alone.penalty(np.zeros(2 * len(alone.xa)), np.zeros(lvl.max() + 1))
    assert np.isfinite(pen) and np.all(np.isfinite(g_za))


def test_fit_objective_gradient_matches_finite_differences():
    """The whole objective's gradient (network, harness overheads, sweep factor, levels,
    both drifts of a sweep: kernel time and per-call overhead, launch floor) against
    central differences, on rows where each term matters: compute- and memory-bound
    kernels, a sweep with an overhead comparable to its kernels' times."""
    rng = np.random.default_rng(11)
    n = 60
    x = rng.normal(0.0, 1.0, (n, 3))
    t_flop = rng.uniform(1e-5, 3e-4, n)
    t_byte = t_flop * rng.choice([0.3, 3.0], n)  # both sides of the ridge
    y = np.maximum(t_flop, t_byte) * rng.uniform(1.3, 2.5, n) + 4e-5
    idx = np.arange(n)
    oh_idx = np.where(idx < 40, 0, -1)  # a harness that adds time to 40 rows
    fac_idx = np.where((idx >= 20) & (idx < 30), 0, -1)
    lvl_idx = idx % 2
    drift_idx = np.where(idx < 30, 0, -1)  # one sweep of 30 rows
    basis = hat_basis(np.where(idx < 30, idx / 29.0, 0.0))
    basis[:30] -= basis[:30].mean(axis=0)
    basis[30:] = 0.0
    prob = _Problem(x, t_flop, t_byte, y, rng.uniform(0.5, 1.5, n),
                    FitOptions(hidden=(4,), drift_l2=1e-3), oh_idx, 1, fac_idx, 1, lvl_idx,
                    2, drift_idx, 1, basis, od_idx=drift_idx.copy(), n_od=1)
    p0 = prob.init(0, y / np.maximum(t_flop, t_byte))
    p = p0 + rng.normal(0.0, 0.2, p0.size)  # drifts away from zero, overheads off 50 µs
    _, grad = prob(p)
    h = 1e-6
    for i in range(p.size):
        e = np.zeros_like(p)
        e[i] = h
        numeric = (prob(p + e)[0] - prob(p - e)[0]) / (2 * h)
        assert grad[i] == pytest.approx(numeric, rel=1e-5, abs=1e-9), i
    theta, phi = prob.unpack(p)[4:6]
    assert theta.shape == phi.shape == (1, 6)
    assert np.all(np.abs(grad[-7:-1]) > 1e-6)  # the overhead drift's curve is fitted


def test_the_penalty_makes_a_fit_monotone_in_the_rows():
    # The same small fit (a third of DeepBench's GEMM rows) with and without the penalty,
    # judged on the other two thirds: each V100 FP32 shape against itself with half the
    # rows. Measured: 14 of 80 halved kernels predicted over 5% slower without the
    # penalty (worst 4.3x), 1 with its measured-kernel pairs alone (1.12x), none with the
    # cross-GPU pairs too (0.99x), in one-thread workers and in-process.
    table = read_csv(DB_GEMM).gemm
    small = table.select([i % 3 == 0 for i in range(len(table))])
    shape = table.shape_array()
    other = sorted({tuple(int(v) for v in shape[i][:3]) for i in range(len(table))
                    if i % 3 and shape[i][0] >= 2 and table.device[i] == "V100-SXM2"
                    and table.dtype[i] == "float32"})
    half = [Gemm(m // 2, n, k) for m, n, k in other]
    whole = [Gemm(m, n, k) for m, n, k in other]
    dev = lookup_device("V100-SXM2")
    slower, worst = {}, {}
    for weight in (0.0, 10.0):
        # in one-BLAS-thread workers, as the command fits: the weights' last bits
        # depend on the thread count, and the bound below is what was measured
        # without the penalty: neither kind of pair (--monotone-weight 0 alone keeps the
        # cross-GPU pairs); with it, both, as the command fits
        [(model, _)] = fit_tables([small], FitOptions(hidden=(16,), max_iter=300,
                                                      members=1, mono_weight=weight,
                                                      mono_cross_weight=weight))
        est = LearnedEstimator(ModelSet({"gemm": model}, {}, ""))
        t = est.estimate(half + whole, dev, "float32")
        mlp = np.array([s.startswith("mlp:") for s in t.source])
        both = mlp[:len(other)] & mlp[len(other):]
        assert both.sum() >= 70
        ratio = (t.seconds[:len(other)] / t.seconds[len(other):])[both]
        slower[weight], worst[weight] = int(np.sum(ratio > 1.05)), float(ratio.max())
    assert slower[0.0] >= 10 and worst[0.0] > 2.0
    # measured 1 (1.12x, the next 0.94x); the slack is for other CPUs' BLAS kernels,
    # whose rounding moves an L-BFGS path, and is far from the 14 (4.3x) without it
    assert slower[10.0] <= 3 and worst[10.0] < 1.25


def test_fit_command_writes_a_loadable_model_without_the_left_out_gpu(runner, tmp_path):
    data = tmp_path / "db.csv"
    lines = DB_GEMM.read_text().splitlines()
    data.write_text("\n".join(lines[:1] + lines[1::3]) + "\n")
    out = tmp_path / "m"
    r = invoke(runner, "kernels", "fit", data, "-o", out, "--leave-out", "Tesla M40",
               "--max-iter", "40", "--format", "json")
    assert r.exit_code == 0, r.stderr
    models = load_dir(out)
    assert all("M40|float32" not in m.levels for m in models.get("gemm").members)
    assert models.manifest["fit"]["left_out_devices"] == ["M40"]
    assert {x["device"] for x in json.loads(r.stdout)["results"]}.isdisjoint({"M40"})
    # a GPU the data never measured: nothing would be left out, and the manifest would
    # still record it as a leave-one-GPU-out
    r = invoke(runner, "kernels", "fit", data, "-o", tmp_path / "h", "--leave-out", "H100-SXM")
    assert r.exit_code == 2 and not (tmp_path / "h").exists()
    assert r.stderr.startswith("planner: error: --leave-out H100-SXM: the data have no rows "
                               "of it (they measure GTX-1080-Ti, M40, P100-PCIe"), r.stderr


@pytest.fixture(scope="module")
def two_member_dir(tmp_path_factory) -> Path:
    """A GEMM model of two networks fitted from seeds 0 and 1 on a quarter of DeepBench."""
    from planner.kernels.pipeline import fit_models

    out = tmp_path_factory.mktemp("ens")
    data = out / "db.csv"
    lines = DB_GEMM.read_text().splitlines()
    data.write_text("\n".join(lines[:1] + lines[1::4]) + "\n")
    fit_models([data], out / "m", options=FitOptions(hidden=(8,), max_iter=40, members=2),
               families=("gemm",))
    return out / "m"


def test_ensemble_is_the_geometric_mean_of_its_members(two_member_dir):
    from planner.kernels.features import DeviceSpecs
    from planner.kernels.pipeline import fit_models

    model = load_dir(two_member_dir).get("gemm")
    assert len(model.members) == 2
    # the members are the single fits from seeds 0 and 1 (deterministic). Fitted the same
    # way, in a worker with one BLAS thread: with more threads the sums of a product
    # are taken in another order, and 40 iterations of L-BFGS carry the last bits over
    for seed, member in enumerate(model.members):
        alone = fit_models([two_member_dir.parent / "db.csv"], None, families=("gemm",),
                           options=FitOptions(hidden=(8,), max_iter=40, seed=seed,
                                              members=1)).models["gemm"].first
        for wa, wb in zip(alone.mlp.weights, member.mlp.weights, strict=True):
            assert np.array_equal(wa, wb)
    assert not np.array_equal(model.members[0].mlp.weights[0], model.members[1].mlp.weights[0])
    dev = lookup_device("V100-SXM2")
    rows = np.array([[512, 512, 512, 1], [4096, 1024, 64, 1], [64, 64, 8192, 1]])
    spec = DeviceSpecs.single(dev, "float32", 3)
    args = (rows, ["gemm"] * 3, spec, [dev.name] * 3, ["float32"] * 3)
    t, bound, _ = model.predict_raw(*args)
    each = [m.predict_raw(*args)[0] for m in model.members]
    assert np.allclose(t, np.sqrt(each[0] * each[1]), rtol=1e-12, atol=0.0)
    assert np.all(t >= bound)


def test_ensemble_manifest_lists_members_and_format_1_still_loads(two_member_dir, tmp_path):
    doc = yaml.safe_load((two_member_dir / MANIFEST).read_text())
    assert doc["format_version"] == 2
    rec = doc["models"]["gemm"]
    assert len(rec["members"]) == 2
    assert rec["ensemble"] == "t = exp(mean over members of log t_member)"
    assert doc["fit"]["options"]["families"]["gemm"] == {
        "hidden": [8], "members": 2, "monotone_weight": 10.0, "monotone_pairs": 20000,
        "monotone_cross_pairs": 20000, "monotone_cross_weight": 10.0}
    # a format-1 directory (one network, its fields at the family's top level) loads
    import zipfile

    one = tmp_path / "v1"
    one.mkdir()
    with zipfile.ZipFile(two_member_dir / "gemm.npz") as zf, \
            zipfile.ZipFile(one / "gemm.npz", "w") as out:
        for name in zf.namelist():
            if name.startswith("m0_"):
                out.writestr(name[3:], zf.read(name))
    old = dict(rec)
    old.update(old.pop("members")[0])
    old.pop("ensemble")
    old["sha256"] = sha256_file(one / "gemm.npz")
    doc1 = dict(doc, format_version=1, models={"gemm": old})
    (one / MANIFEST).write_text(yaml.safe_dump(doc1))
    v1 = load_dir(one).get("gemm")
    v2 = load_dir(two_member_dir).get("gemm")
    assert len(v1.members) == 1
    for wa, wb in zip(v1.first.mlp.weights, v2.first.mlp.weights, strict=True):
        assert np.array_equal(wa, wb)
    assert v1.first.levels == v2.first.levels


def test_ensemble_member_missing_weights_is_refused(two_member_dir, tmp_path):
    import zipfile

    bad = tmp_path / "bad"
    shutil.copytree(two_member_dir, bad)
    with zipfile.ZipFile(two_member_dir / "gemm.npz") as zf, \
            zipfile.ZipFile(bad / "gemm.npz", "w") as out:
        for name in zf.namelist():
            if not name.startswith("m1_"):
                out.writestr(name, zf.read(name))
    doc = yaml.safe_load((bad / MANIFEST).read_text())
    doc["models"]["gemm"]["sha256"] = sha256_file(bad / "gemm.npz")
    (bad / MANIFEST).write_text(yaml.safe_dump(doc))
    with pytest.raises(ModelDataError, match=r"gemm\.npz: error: no weights for member 1"):
        load_dir(bad)


def test_fit_output_folder_is_checked_before_fitting(runner, tmp_path):
    """-o "" wrote into the current folder; -o onto a file or under one, and a negative
    seed, were internal errors; a training file named like a model file was replaced."""
    data = tmp_path / "db.csv"
    data.write_text(DB_GEMM.read_text())
    for out, says in (("", "needs a folder name"), (str(data), "is a file"),
                      (str(data / "m"), "is not a folder")):
        r = invoke(runner, "kernels", "fit", data, "-o", out, "--max-iter", "2")
        assert r.exit_code == 2 and says in r.stderr, (out, r.stderr)
    r = invoke(runner, "kernels", "fit", data, "-o", tmp_path / "m", "--seed", "-1")
    assert r.exit_code == 2 and "--seed" in r.stderr
    same = tmp_path / "manifest.yaml"
    same.write_bytes(data.read_bytes())
    r = invoke(runner, "kernels", "fit", same, "-o", tmp_path, "--max-iter", "2")
    assert r.exit_code == 2 and "it is one of the training files" in r.stderr
    assert same.read_bytes() == data.read_bytes()
    assert not (tmp_path / "m").exists() and not (tmp_path / "gemm.npz").exists()
    # a folder's own manifest.yaml of something else was replaced by the fit's (an audit)
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.yaml").write_text("name: my notes\n")
    r = invoke(runner, "kernels", "fit", data, "-o", other, "--max-iter", "2")
    assert r.exit_code == 2 and r.stderr == (
        f"planner: error: refusing to write {other / 'manifest.yaml'}: it is not the manifest "
        "of a planner model set (kind: planner-kernel-models), and the fit would replace it; "
        "choose another output folder\n"), r.stderr
    assert (other / "manifest.yaml").read_text() == "name: my notes\n"


SHIPPED_FILES = ("neusight/neusight_linear_fp32.csv", "neusight/neusight_bmm_fp32_test.csv",
                 "neusight/neusight_conv2d_fwd_fp32.csv", "deepbench/deepbench_gemm.csv",
                 "deepbench/deepbench_conv.csv", "h100/h100_fp32.csv", "h100/h100_bf16.csv",
                 "h200/h200_fp32.csv", "h200/h200_bf16.csv", "h200/h200_deepbench_conv_fp32.csv",
                 "h200/h200_deepbench_conv_bf16.csv")


def test_shipped_data_is_the_eleven_training_files(runner):
    """`--shipped-data` reads what the shipped manifest says the models were fitted on (the
    README's eleven files, in its order), so `kernels eval --shipped-data` is the README's
    command (1) to the byte; a shipped file also named on the command line is read once."""
    assert [p for _, p in shipped_training_data()] == [DATA / f for f in SHIPPED_FILES]
    assert [n for n, _ in shipped_training_data()] == [f"models/data/{f}"
                                                       for f in SHIPPED_FILES]
    explicit = invoke(runner, "kernels", "eval", *(DATA / f for f in SHIPPED_FILES),
                      "--split", "test", "--format", "json")
    for extra in ((), (DATA / SHIPPED_FILES[5],)):
        r = invoke(runner, "kernels", "eval", "--shipped-data", *extra, "--split", "test",
                   "--format", "json")
        assert r.exit_code == 0 and r.stdout == explicit.stdout
    r = invoke(runner, "kernels", "achieved", "--shipped-data", "--format", "json")
    assert r.exit_code == 0 and r.stdout == invoke(
        runner, "kernels", "achieved", *(DATA / f for f in SHIPPED_FILES), "--format",
        "json").stdout


def test_shipped_data_is_checked_against_the_manifest(runner, tmp_path):
    """A shipped file that is missing or changed, or a manifest entry outside models/, is
    an error naming the file (exit 2), before anything is read or fitted; fit and eval
    need files or the flag; fit does not write over the models the flag reads."""
    copy = tmp_path / "models"
    copy.mkdir()
    shutil.copy(MODELS / MANIFEST, copy / MANIFEST)
    for f in SHIPPED_FILES:
        (copy / "data" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA / f, copy / "data" / f)
    assert [p for _, p in shipped_training_data(copy)] == [copy / "data" / f
                                                           for f in SHIPPED_FILES]
    changed = copy / "data" / SHIPPED_FILES[3]
    changed.write_text(changed.read_text().replace("\n", "\r\n"))
    with pytest.raises(ModelDataError, match=r"deepbench_gemm\.csv: error: does not match "
                                             r"the sha256"):
        shipped_training_data(copy)
    changed.unlink()
    with pytest.raises(ModelDataError, match=r"deepbench_gemm\.csv: error: a file the "
                                             r"shipped models were fitted on is missing"):
        shipped_training_data(copy)
    doc = yaml.safe_load((copy / MANIFEST).read_text())
    doc["training_data"][0]["file"] = "models/../../etc/passwd"
    (copy / MANIFEST).write_text(yaml.safe_dump(doc))
    with pytest.raises(ModelDataError, match=r"manifest\.yaml:\d+:\d+: error: expected "
                                             r"\{file: models/<path>, sha256\}.*\(at "
                                             r"\$\.training_data\[0\]\)"):
        shipped_training_data(copy)
    for cmd in (("fit", "-o", tmp_path / "out"), ("eval",), ("achieved",)):
        r = invoke(runner, "kernels", *cmd)
        assert r.exit_code == 2 and "--shipped-data, or both" in r.stderr
    before = sha256_file(MODELS / MANIFEST)
    r = invoke(runner, "kernels", "fit", "--shipped-data", "-o", MODELS, "--max-iter", "1")
    assert r.exit_code == 2 and "holds the shipped models" in r.stderr
    # nor without the flag (a user's file into the models every plan is timed by),
    # unless --replace-shipped says so (not run here: it would replace them)
    small = tmp_path / "small.csv"
    lines = (MODELS / "data" / "h100" / "h100_fp32.csv").read_text().splitlines()
    small.write_text("\n".join(lines[:40]) + "\n")
    r = invoke(runner, "kernels", "fit", small, "-o", MODELS, "--max-iter", "1")
    assert r.exit_code == 2 and "pass --replace-shipped to rebuild them" in r.stderr
    assert sha256_file(MODELS / MANIFEST) == before


def test_a_gpu_the_catalog_lacks_is_fitted_and_timed_from_a_cluster_file(runner, tmp_path,
                                                                          monkeypatch):
    """Measurements naming a GPU the catalog lacks are refused (exit 2, pointing to
    --cluster); with the cluster file that defines it (here an H100's specs under another
    name), fit reads them (in its worker processes too), eval judges them, and predict
    times the GPU as a seen one, as `plan` with that cluster file will."""
    import planner.cluster as cluster_mod

    monkeypatch.setattr(cluster_mod, "_EXTRA", {})  # the registry lasts the process
    lines = (DATA / "h100" / "h100_fp32.csv").read_text().splitlines()
    rows = [line.replace("NVIDIA H100 80GB HBM3", "X-GPU", 1) for line in lines[1:]
            if ",gemm," in line]
    data = tmp_path / "x.csv"
    data.write_text("\n".join([lines[0], *rows]) + "\n")
    clus = tmp_path / "x-cluster.yaml"
    clus.write_text("kind: cluster\ndevices_per_node: 8\ndevice:\n  base: H100-SXM\n"
                    "  name: X-GPU\nnetwork:\n  intra_node: {latency: 2 us, bandwidth: "
                    "450 GB/s}\n  inter_node: {latency: 5 us, bandwidth: 400 Gbit/s}\n")
    r = invoke(runner, "kernels", "eval", data)
    assert r.exit_code == 2 and "unknown device 'X-GPU'" in r.stderr
    assert "given with --cluster" in r.stderr
    out = tmp_path / "m"
    r = invoke(runner, "kernels", "fit", data, "--cluster", clus, "--only", "gemm",
               "--members", "1", "--max-iter", "30", "-o", out, "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert "X-GPU|float32" in load_dir(out).get("gemm").first.levels
    # the manifest's commands repeat --cluster (they could not be run without it) and
    # the fit records the file's sha256 (found by an audit: both were left out)
    manifest = load_dir(out).manifest
    assert manifest["accuracy"]["command"].endswith(f"--cluster {clus} --split test")
    assert manifest["fit"]["clusters"] == [{"file": str(clus),
                                            "sha256": sha256_file(clus)}]
    r = invoke(runner, "kernels", "eval", data, "--cluster", clus, "--models-dir", out,
               "--split", "test", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert {x["device"] for x in json.loads(r.stdout)["results"]} == {"X-GPU"}
    r = invoke(runner, "kernels", "predict", "--device", "X-GPU", "--cluster", clus,
               "--models-dir", out, "--gemm", "1024,1024,1024", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["gpu_seen"] is True
    # a catalog GPU given other specs keeps its name, and replaces the catalog's under
    # its aliases too (a profile writes "NVIDIA H100 80GB HBM3")
    capped = tmp_path / "capped.yaml"
    capped.write_text(clus.read_text().replace("  name: X-GPU\n", "  tdp: 500 W\n"))
    r = invoke(runner, "kernels", "predict", "--device", "NVIDIA H100 80GB HBM3",
               "--cluster", capped, "--gemm", "64,64,64")
    assert r.exit_code == 0, r.stderr
    assert lookup_device("NVIDIA H100 80GB HBM3").tdp_w == 500.0
    assert lookup_device("H100-SXM").tdp_w == 500.0
    assert [d.name for d in registered_devices()] == ["X-GPU", "H100-SXM"]
    # the name a profile writes (what PyTorch reports) may be given as an alias
    named = tmp_path / "named.csv"
    named.write_text(data.read_text().replace("X-GPU,", "NVIDIA X-GPU 80GB,"))
    aliased = tmp_path / "aliased.yaml"
    aliased.write_text(clus.read_text().replace(
        "  name: X-GPU\n", "  name: X-GPU\n  aliases: [NVIDIA X-GPU 80GB]\n"))
    r = invoke(runner, "kernels", "eval", named, "--cluster", aliased, "--models-dir", out,
               "--split", "test", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert {x["device"] for x in json.loads(r.stdout)["results"]} == {"X-GPU"}
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(aliased.read_text().replace("[NVIDIA X-GPU 80GB]", "NVIDIA X-GPU"))
    r = invoke(runner, "kernels", "eval", named, "--cluster", wrong)
    assert r.exit_code == 2 and r.stderr.startswith(f"{wrong}:6:12: error: expected a list "
                                                    "of names"), r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: cluster\ndevice: {base: H100-SXM, name: Y}\n")
    r = invoke(runner, "kernels", "eval", data, "--cluster", bad)
    assert r.exit_code == 2 and r.stderr.startswith(f"{bad}:"), r.stderr


def test_fit_command_monotone_cross_weight(runner, tmp_path):
    """--monotone-cross-weight reaches the fit and its record: 0 turns the cross-GPU
    pairs off (the GEMM fit as before 2026-12-07: the README's figures "before the
    cross-GPU pairs" come from such fits), and the manifest says so; the default is 10
    on 20,000 pairs."""
    data = tmp_path / "db.csv"
    lines = DB_GEMM.read_text().splitlines()
    data.write_text("\n".join(lines[:1] + lines[1::6]) + "\n")
    fams = {}
    for name, extra in (("off", ["--monotone-cross-weight", "0"]), ("on", [])):
        r = invoke(runner, "kernels", "fit", data, "-o", tmp_path / name, "--max-iter", "5",
                   "--hidden", "4", *extra)
        assert r.exit_code == 0, r.stderr
        doc = yaml.safe_load((tmp_path / name / MANIFEST).read_text())
        fams[name] = doc["fit"]["options"]["families"]["gemm"]
    assert (fams["off"]["monotone_cross_pairs"], fams["off"]["monotone_cross_weight"]) == (0, 0)
    assert (fams["on"]["monotone_cross_pairs"], fams["on"]["monotone_cross_weight"]) == \
        (20000, 10.0)
    assert (tmp_path / "off" / "gemm.npz").read_bytes() != \
        (tmp_path / "on" / "gemm.npz").read_bytes()
    r = invoke(runner, "kernels", "fit", data, "-o", tmp_path / "bad",
               "--monotone-cross-weight", "-1")
    assert r.exit_code == 2 and not (tmp_path / "bad").exists()


def test_fit_command_members_and_hidden(runner, tmp_path):
    data = tmp_path / "db.csv"
    lines = DB_GEMM.read_text().splitlines()
    data.write_text("\n".join(lines[:1] + lines[1::6]) + "\n")
    out = tmp_path / "m"
    r = invoke(runner, "kernels", "fit", data, "-o", out, "--max-iter", "20", "--members", "3",
               "--hidden", "4,4", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert "3 networks" in r.stderr
    # each network is reported as it finishes, before the family's summary line
    told = [line for line in r.stderr.splitlines() if line.startswith("gemm: network ")]
    assert [t.split(" fitted")[0] for t in told] == [f"gemm: network {k} of 3"
                                                     for k in (1, 2, 3)]
    assert r.stderr.index(told[-1]) < r.stderr.index("fitted gemm:")
    model = load_dir(out).get("gemm")
    assert len(model.members) == 3
    assert all(m.mlp.weights[0].shape[1] == 4 and len(m.mlp.weights) == 3
               for m in model.members)
    doc = yaml.safe_load((out / MANIFEST).read_text())
    assert doc["fit"]["options"]["families"] == {"gemm": {
        "hidden": [4, 4], "members": 3, "monotone_weight": 10.0, "monotone_pairs": 20000,
        "monotone_cross_pairs": 20000, "monotone_cross_weight": 10.0}}
    assert doc["fit"]["reports"][0]["members"] == 3
    # the whole model directory, manifest included, is the same bytes on a second fit
    again = tmp_path / "again"
    r = invoke(runner, "kernels", "fit", data, "-o", again, "--max-iter", "20", "--members",
               "3", "--hidden", "4,4", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in again.iterdir())
    for path in out.iterdir():
        assert path.read_bytes() == (again / path.name).read_bytes(), path.name
    for bad in ("4,x", "0", "1,2,3,4,5"):
        r = invoke(runner, "kernels", "fit", data, "-o", tmp_path / "n", "--hidden", bad)
        assert r.exit_code == 2 and "--hidden" in r.stderr, r.stderr
    assert not (tmp_path / "n").exists()


# --- the CLI -----------------------------------------------------------------------------


def test_eval_json_schema(runner):
    r = invoke(runner, "kernels", "eval", DB_GEMM, "--split", "test", "--format", "json")
    assert r.exit_code == 0, r.stderr
    results = json.loads(r.stdout)["results"]
    assert results
    for rec in results:
        assert set(rec) == {"device", "op", "n", "mape", "median_ape", "p90_ape",
                            "out_of_range", "in_band"}
        assert 0.0 <= rec["in_band"] <= 100.0
        assert rec["n"] > 0 and 0 <= rec["median_ape"] <= rec["p90_ape"]


def test_manifest_accuracy_matches_a_fresh_eval(runner):
    manifest = yaml.safe_load((MODELS / MANIFEST).read_text())
    recorded = {(r["device"], r["op"]): r for r in manifest["accuracy"]["results"]}
    files = [str(DATA / f) for f in SHIPPED_FILES]
    r = invoke(runner, "kernels", "eval", *files, "--split", "test", "--format", "json")
    assert r.exit_code == 0, r.stderr
    fresh = {(x["device"], x["op"]): x for x in json.loads(r.stdout)["results"]}
    assert fresh.keys() == recorded.keys()
    for key, rec in recorded.items():
        assert fresh[key]["n"] == rec["n"]
        # both rounded to 0.01 percentage points
        assert fresh[key]["mape"] == pytest.approx(rec["mape"], abs=0.011), key
        assert fresh[key]["in_band"] == pytest.approx(rec["in_band"], abs=0.011), key
    # The bands were cut from these rows (all in range) at the split conformal ranks
    # floor(0.05 (n + 1)) and ceil(0.95 (n + 1)) of a band's n sorted ratios, so the rows
    # inside are those between the two ranks, both included. Allowed: one row a band for
    # ties and the ratios' rounding to 4 decimals. Bands are kept per op and dtype, named
    # as eval labels its rows (gemm, gemm-float16).
    # bf16 convolutions have bands of their own since the H200's rows (37 held-out rows
    # a pass, the H100's 4 and the H200's 33; before, they were judged by FP16's)
    inside: dict[str, float] = {}
    for x in fresh.values():
        assert x["out_of_range"] == 0 and x["in_band"] is not None
        inside[x["op"]] = inside.get(x["op"], 0.0) + x["in_band"] / 100.0 * x["n"]
    ops = manifest["error_bands"]["ops"]
    passes = ("conv_fwd", "conv_bwd_data", "conv_bwd_filter")
    assert set(inside) == set(ops) == {"gemm", "gemm-float16", "gemm-bfloat16", "bmm",
                                       "bmm-bfloat16", *passes,
                                       *(f"{p}-float16" for p in passes),
                                       *(f"{p}-bfloat16" for p in passes)}
    for op, rec in ops.items():
        want = sum(math.ceil(0.95 * (b["n"] + 1)) - math.floor(0.05 * (b["n"] + 1)) + 1
                   for b in rec["bands"])
        assert inside[op] == pytest.approx(want, abs=len(rec["bands"])), op


def test_eval_unknown_device_exits_2_with_position(runner, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("gpu,precision,M,N,K,time_ms\nTesla V999,fp32,16,16,16,0.01\n")
    r = invoke(runner, "kernels", "eval", bad)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{bad}:2:1: error: unknown device 'Tesla V999'")


def test_eval_malformed_csv_exits_2_with_position(runner, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("gpu,precision,M,N,K,time_ms\nTesla T4,fp32,16,sixteen,16,0.01\n"
                   "Tesla T4,fp32,16,16\n")
    r = invoke(runner, "kernels", "eval", bad)
    assert r.exit_code == 2
    assert f"{bad}:2:18: error: expected an integer, got 'sixteen'" in r.stderr
    assert f"{bad}:3:1: error: expected 6 fields as in the header, found 4" in r.stderr


def test_eval_unrecognised_header_exits_2(runner, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    r = invoke(runner, "kernels", "eval", bad)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{bad}:1:1: error: unrecognised CSV header")
    # the nearest layout's missing column, and the header's near spelling of it, pointed
    # at (an audit found the header cut short at 120 characters, hiding the wrong one)
    cols = "device,dtype,op,m,n,k,batch,conv_n,conv_c,conv_h,conv_w,conv_k,conv_r,conv_s," \
           "stride_h,stride_w,pad_h,pad_w,dil_h,dil_w,groups,time_us,repeats,harness"
    bad.write_text(cols + "\nH100-SXM,float32,gemm,128,128,256,1" + "," * 14
                   + ",0.0058,50,profile\n")
    r = invoke(runner, "kernels", "eval", bad)
    assert r.exit_code == 2
    col = cols.index("time_us") + 1
    assert r.stderr.startswith(f"{bad}:1:{col}: error: unrecognised CSV header: the nearest "
                               "layout, profile, needs 'time_ms' (the header has 'time_us')")


def test_rows_without_a_time_are_said_at_the_row(runner, tmp_path):
    """A DeepBench convolution row with all three passes' times empty (DeepBench leaves
    a pass it did not time empty) gives nothing to evaluate: said at its line, not as
    "no measurement rows after the header" at the header (found by an audit)."""
    bad = tmp_path / "conv.csv"
    bad.write_text("gpu,precision,W,H,C,N,K,filter_w_S,filter_h_R,pad_w,pad_h,stride_w,"
                   "stride_h,fwd_ms,bwd_data_ms,bwd_filter_ms\n"
                   "Tesla T4,fp32,700,161,1,4,32,20,5,0,0,2,2,,,\n")
    r = invoke(runner, "kernels", "eval", bad)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{bad}:2:1: error: no row gives a time")


def test_eval_refuses_what_it_would_have_to_guess_at(runner, tmp_path):
    # a header naming a column twice (which copy is the time?), a time no kernel takes
    # (1e300 ms), the same file named twice (its rows would count twice): exit 2, located
    twice = tmp_path / "twice.csv"
    twice.write_text("gpu,precision,M,N,K,time_ms,time_ms\nTesla T4,fp32,16,16,16,0.01,5\n")
    r = invoke(runner, "kernels", "eval", twice)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{twice}:1:29: error: column 'time_ms' appears twice in the "
                               "header; keep one")
    huge = tmp_path / "huge.csv"
    huge.write_text("gpu,precision,M,N,K,time_ms\nTesla T4,fp32,16,16,16,1e300\n")
    r = invoke(runner, "kernels", "eval", huge)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{huge}:2:24: error: expected a positive time in milliseconds "
                               "up to 1,000,000 (one kernel), got '1e300'")
    good = tmp_path / "good.csv"
    good.write_text("gpu,precision,M,N,K,time_ms\nTesla T4,fp32,64,64,64,0.01\n")
    assert invoke(runner, "kernels", "eval", good).exit_code == 0
    r = invoke(runner, "kernels", "eval", good, str(tmp_path / "." / "good.csv"))
    assert r.exit_code == 2
    assert "good.csv: error: this file is named twice; name it once" in r.stderr
    copy = tmp_path / "copy.csv"  # a copy under another name counted its rows twice too
    copy.write_bytes(good.read_bytes())
    r = invoke(runner, "kernels", "eval", good, copy)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{copy}: error: has the same contents as {good}: its rows "
                               "would count twice; name one of them")
    other = tmp_path / "other.csv"  # the same shape measured again is a second measurement
    other.write_text("gpu,precision,M,N,K,time_ms\nTesla T4,fp32,64,64,64,0.011\n")
    assert invoke(runner, "kernels", "eval", good, other).exit_code == 0


def test_predict_json(runner):
    r = invoke(runner, "kernels", "predict", "--device", "H100", "--gemm", "4096,4096,4096",
               "--dtype", "bf16", "--format", "json")
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["source"] == "mlp:gemm-bf16" and rec["gpu_seen"] is True  # measured
    r = invoke(runner, "kernels", "predict", "--device", "H100-PCIe", "--gemm", "4096,4096,4096",
               "--dtype", "bf16", "--format", "json")
    rec = json.loads(r.stdout)
    assert rec["source"] == "mlp:gemm-bf16" and rec["gpu_seen"] is False
    assert rec["seconds"] >= rec["bound_s"] > 0
    assert rec["scale"] == 1.0


def test_predict_says_how_a_scaled_kernel_was_timed(runner):
    # batch 1,024: four times the largest batch the convolution model answers for (256)
    args = ("kernels", "predict", "--device", "H100", "--conv", "1024,256,14,14,256,3,3,1,1",
            "--phase", "bwd_filter", "--dtype", "bf16")
    rec = json.loads(invoke(runner, *args, "--format", "json").stdout)
    assert rec["source"] == "mlp:conv_bwd_filter-bf16 (scaled)"
    assert rec["scale"] == 4.0 and rec["in_range"] is False
    table = invoke(runner, *args).stdout
    assert "timed on 1/4 of its work, × 4" in table


def test_predict_usage_errors(runner):
    r = invoke(runner, "kernels", "predict", "--device", "H1OO", "--gemm", "1,2,3")
    assert r.exit_code == 2 and "unknown device 'H1OO'" in r.stderr
    r = invoke(runner, "kernels", "predict", "--device", "T4")
    assert r.exit_code == 2 and "exactly one of --gemm" in r.stderr
    # a number past int64 was an internal error (OverflowError), exit 3
    r = invoke(runner, "kernels", "predict", "--device", "T4", "--gemm", "1" * 25 + ",2,3")
    assert r.exit_code == 2 and "Invalid value for --gemm: " in r.stderr
    assert "is too large (at most 2^40" in r.stderr
    # a negative dimension gets the message zero gets (it said "expected M,N,K[,BATCH]"),
    # a wrong count says how many numbers; padding may be 0 but not negative
    for gemm in ("-1,4096,4096", "0,4096,4096"):
        r = invoke(runner, "kernels", "predict", "--device", "T4", "--gemm", gemm)
        assert r.exit_code == 2 and "GEMM dimensions must be at least 1" in r.stderr
    r = invoke(runner, "kernels", "predict", "--device", "T4", "--gemm", "4096,4096")
    assert r.exit_code == 2 and "expected M,N,K[,BATCH]: 3 to 4 numbers, got 2" in r.stderr
    r = invoke(runner, "kernels", "predict", "--device", "T4", "--conv", "1,3,8,8,4,3,3,1,-1")
    assert r.exit_code == 2 and "padding must be 0 or more" in r.stderr
    # nan passed click's FloatRange (every comparison with nan is false)
    for args in (["kernels", "achieved", LINEAR, "--min-gflop", "nan"],
                 ["kernels", "fit", BMM, "-o", "unused", "--monotone-weight", "nan"],
                 ["check", "x.yaml", "--max-slowdown", "inf"]):
        r = invoke(runner, *args)
        assert r.exit_code == 2 and "is not a finite number" in r.stderr, args


def test_the_gpu_models_do_not_time_a_cpu(runner):
    """The shipped models saw GPUs only: predict refuses a CPU of the catalog, plan with
    --estimator learned refuses it, and auto falls back to the roofline."""
    r = invoke(runner, "kernels", "predict", "--device", "cori-knl", "--gemm", "64,64,64")
    assert r.exit_code == 2
    assert r.stderr.startswith("planner: error: cori-knl is a cpu; the kernel models were "
                               "fitted on GPU measurements and have none of it")
    knl = ROOT / "examples" / "clusters" / "cori-knl.yaml"
    net = ROOT / "examples" / "networks" / "alexnet.yaml"
    args = ["plan", net, knl, "-p", "64", "-b", "512", "--format", "json"]
    r = invoke(runner, *args, "--estimator", "learned")
    assert r.exit_code == 2 and "--estimator learned: cori-knl is a cpu" in r.stderr
    r = invoke(runner, *args)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["problem"]["estimator"] == "roofline"
    assert {rec["compute"]["estimator"] for rec in doc["layers"]} <= {"roofline", "none"}


def test_achieved_with_no_gemm_is_an_error(runner):
    r = invoke(runner, "kernels", "achieved", BMM)
    assert r.exit_code == 2
    assert "no FP32 GEMM (bmm rows are not counted) of at least 1 GFLOP" in r.stderr


def test_achieved_matches_the_catalog(runner):
    r = invoke(runner, "kernels", "achieved", LINEAR, DB_GEMM, H100[0], HOPPER[2], "--format",
               "json")
    assert r.exit_code == 0, r.stderr
    assert "H200" in {rec["device"] for rec in json.loads(r.stdout)["devices"]}
    for rec in json.loads(r.stdout)["devices"]:
        dev = lookup_device(rec["device"])
        # devices.yaml cites this command's output (rounded to 3 decimals; capped at 1.0)
        assert dev.compute_efficiency == pytest.approx(min(rec["p95_fraction"], 1.0),
                                                       abs=0.0011), rec["device"]


@pytest.mark.parametrize("cmd", [["kernels"], ["kernels", "fit"], ["kernels", "eval"],
                                 ["kernels", "predict"], ["kernels", "profile"],
                                 ["kernels", "achieved"], ["comm"], ["comm", "fit"]])
def test_help(runner, cmd):
    r = invoke(runner, *cmd, "--help")
    assert r.exit_code == 0 and "Usage: " in r.stdout


def test_profile_on_cpu_writes_what_fit_and_eval_read(runner, tmp_path):
    out = tmp_path / "prof.csv"
    r = invoke(runner, "kernels", "profile", "--device", "cpu", "--quick", "--repeats", "2",
               "--name", "cori-knl", "-o", out)
    assert r.exit_code == 0, r.stderr
    data = read_csv(out)
    assert set(data.gemm.op) == {"gemm", "bmm"}
    assert set(data.conv.op) == {"conv_fwd", "conv_bwd_data", "conv_bwd_filter"}
    assert all(s > 0 for s in data.gemm.seconds + data.conv.seconds)
    assert "not in the device catalog" not in r.stderr
    r = invoke(runner, "kernels", "eval", out, "--format", "json")
    assert r.exit_code == 0, r.stderr
    # a device the catalog lacks: the profile is written, and says what fit will need
    r = invoke(runner, "kernels", "profile", "--device", "cpu", "--quick", "--repeats", "1",
               "--max-kernels", "2", "--name", "Mystery GPU", "-o", tmp_path / "m.csv")
    assert r.exit_code == 0, r.stderr
    assert ("planner: note: 'Mystery GPU' is not in the device catalog: define it in a "
            "cluster file (a `device:` mapping of its specs, with `aliases: [Mystery GPU]`) "
            "and give that file to `kernels fit` and `eval` with --cluster") in r.stderr


SHAPES_ONLY = ("op,m,n,k,batch,conv_n,conv_c,conv_h,conv_w,conv_k,conv_r,conv_s,stride_h,"
               "stride_w,pad_h,pad_w,dil_h,dil_w,groups\n") + """gemm,64,32,16,1,,,,,,,,,,,,,,
bmm,16,16,8,4,,,,,,,,,,,,,,
conv_fwd,,,,,2,8,12,10,8,3,1,2,1,1,0,1,1,2
conv_bwd_data,,,,,2,8,12,10,8,3,1,2,1,1,0,1,1,2
conv_bwd_filter,,,,,2,8,12,10,8,3,3,1,1,2,2,2,2,1
gemm,64,32,16,1,,,,,,,,,,,,,,
"""


def test_profile_times_the_kernels_of_a_shapes_file(runner, tmp_path):
    """`--shapes` times each distinct kernel of the file once, in its order, with the
    file's strides, padding, dilation and groups (a shapes-only file needs no device,
    dtype or time columns, and their cells may be empty), and writes what `fit` and
    `eval` read."""
    shapes = tmp_path / "shapes.csv"
    lines = SHAPES_ONLY.splitlines()
    shapes.write_text("\n".join([lines[0] + ",device,dtype,time_ms,harness",
                                 *(x + ",,,," for x in lines[1:])]) + "\n")
    out = tmp_path / "prof.csv"
    r = invoke(runner, "kernels", "profile", "--device", "cpu", "--shapes", shapes,
               "--repeats", "1", "--name", "cori-knl", "-o", out)
    assert r.exit_code == 0, r.stderr
    data = read_csv(out)
    assert data.gemm.op == ["gemm", "bmm"]  # the repeated GEMM is timed once
    assert data.gemm.shape == [(64, 32, 16, 1), (16, 16, 8, 4)]
    assert data.conv.op == ["conv_fwd", "conv_bwd_data", "conv_bwd_filter"]
    assert data.conv.shape == [(2, 8, 12, 10, 8, 3, 1, 2, 1, 1, 0, 1, 1, 2)] * 2 + \
        [(2, 8, 12, 10, 8, 3, 3, 1, 1, 2, 2, 2, 2, 1)]
    assert all(t > 0 for t in data.gemm.seconds + data.conv.seconds)
    assert set(data.gemm.device + data.conv.device) == {"cori-knl"}
    r = invoke(runner, "kernels", "profile", "--device", "cpu", "--shapes", shapes,
               "--only", "conv", "--max-kernels", "1", "--repeats", "1", "--name",
               "cori-knl", "-o", tmp_path / "one.csv")
    assert r.exit_code == 0, r.stderr
    one = read_csv(tmp_path / "one.csv")
    assert (len(one.gemm), one.conv.op) == (0, ["conv_fwd"])


def test_shapes_of_deepbench_conv_are_every_pass_of_every_shape():
    """DeepBench's conv file has 90 distinct shapes over its eight GPUs (some rows lack
    a backward time); read for its shapes, every shape gives all three passes."""
    from planner.kernels.data import read_shapes
    from planner.kernels.profile import shapes_of

    kernels = shapes_of(read_shapes([DB_CONV]))
    measured = read_csv(DB_CONV).conv
    distinct = set(measured.shape)
    assert len(distinct) == 90 and len(kernels) == 3 * 90
    assert [k.op for k in kernels[:3]] == ["conv_fwd", "conv_bwd_data", "conv_bwd_filter"]
    assert {k.dims for k in kernels} == distinct
    assert shapes_of(read_shapes([DB_CONV]), "gemm") == []


def test_profile_shapes_problems_exit_2(runner, tmp_path):
    shapes = tmp_path / "shapes.csv"
    shapes.write_text(SHAPES_ONLY)
    out = tmp_path / "x.csv"
    r = invoke(runner, "kernels", "profile", "--device", "cpu", "--shapes", shapes,
               "--quick", "-o", out)
    assert r.exit_code == 2 and "--quick and --shapes" in r.stderr
    r = invoke(runner, "kernels", "profile", "--device", "cpu", "--shapes", DB_CONV,
               "--only", "gemm", "-o", out)
    assert r.exit_code == 2 and "no gemm kernels in" in r.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("op,m,n,k\ngemm,4,4,4\n")
    r = invoke(runner, "kernels", "profile", "--device", "cpu", "--shapes", bad, "-o", out)
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    assert f"{bad}:1:1: error: the header lacks the column batch, which gemm rows need (1 " \
           "row here, the first at line 2;" in r.stderr
    assert not out.exists()


def test_groups_that_do_not_divide_the_channels_point_at_the_groups_cell(runner, tmp_path):
    header = ",".join(("device", "dtype", "op", "m", "n", "k", "batch", "conv_n", "conv_c",
                       "conv_h", "conv_w", "conv_k", "conv_r", "conv_s", "stride_h",
                       "stride_w", "pad_h", "pad_w", "dil_h", "dil_w", "groups", "time_ms",
                       "repeats", "harness"))
    row = "H100,float32,conv_fwd,,,,,1,4,8,8,6,3,3,1,1,0,0,1,1,3,1.0,1,profile"
    bad = tmp_path / "bad.csv"
    bad.write_text(f"{header}\n{row}\n")
    r = invoke(runner, "kernels", "eval", bad)
    col = row.index(",3,1.0") + 2  # 1-based column of the groups cell
    assert r.exit_code == 2
    assert (f"{bad}:2:{col}: error: 4 input and 6 output channels are not both divisible "
            "by 3 groups (at column 'groups')") in r.stderr


def test_a_profile_file_without_a_rows_shape_columns_is_an_input_error(runner, tmp_path):
    """A file with the profile layout's required columns but not the shape columns its
    rows need was an internal error (KeyError) before."""
    bad = tmp_path / "bad.csv"
    bad.write_text("device,dtype,op,time_ms\nH100,float32,gemm,1.0\n"
                   "H100,float32,conv_fwd,1.0\n")
    r = invoke(runner, "kernels", "eval", bad)
    assert r.exit_code == 2 and "internal error" not in r.stderr
    assert f"{bad}:1:1: error: the header lacks the columns m, n, k, batch, which gemm " \
           "rows need (1 row here, the first at line 2;" in r.stderr
    assert f"{bad}:1:1: error: the header lacks the columns conv_n, conv_c," in r.stderr


def test_a_missing_column_is_said_once_at_the_header(runner, tmp_path):
    """A profile file without a column its rows need was an error at every row (an
    audit): once, at line 1, with the ops and rows that need it."""
    text, _ = _cpu_rows("V100-SXM2")
    lines = text.splitlines()
    at = lines[0].split(",").index("batch")
    drop = [",".join(c for i, c in enumerate(ln.split(",")) if i != at) for ln in lines]
    bad = tmp_path / "nobatch.csv"
    bad.write_text("\n".join(drop) + "\n")
    r = invoke(runner, "kernels", "eval", bad)
    assert r.exit_code == 2
    errors = [ln for ln in r.stderr.splitlines() if ": error: " in ln]
    assert errors == [f"{bad}:1:1: error: the header lacks the column batch, which gemm and "
                      f"bmm rows need ({len(lines) - 1} rows here, the first at line 2; the "
                      "layout `planner kernels profile` writes: " + ",".join(PROFILE_COLUMNS)
                      + ") (at $)"]


@pytest.mark.parametrize("source", ["profile", "deepbench"])
def test_a_repeated_header_row_is_said_at_its_line(runner, tmp_path, source):
    """Two files concatenated, the second's header kept: its cells read as an unknown
    device 'device', a dtype 'dtype', ... (an audit): one error, at that line."""
    if source == "profile":
        lines = _cpu_rows("V100-SXM2")[0].splitlines()
    else:
        lines = DB_GEMM.read_text().splitlines()[:6]
    data = tmp_path / "twice.csv"
    data.write_text("\n".join([*lines[:3], lines[0], *lines[3:]]) + "\n")
    r = invoke(runner, "kernels", "eval", data)
    assert r.exit_code == 2
    assert [ln for ln in r.stderr.splitlines() if ": error: " in ln] == [
        f"{data}:4:1: error: repeated header row (a file appended to another?); remove it "
        "(at $)"]


def test_profile_without_torch_is_a_clear_error(runner, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    r = invoke(runner, "kernels", "profile", "-o", tmp_path / "x.csv")
    assert r.exit_code == 2
    assert "needs PyTorch" in r.stderr and not (tmp_path / "x.csv").exists()


def test_fit_with_no_held_out_rows_says_so(runner, tmp_path):
    """NeuSight's 'train' rows are never held out: a fit on them alone has no held-out
    accuracy to print, and says so in a line rather than an empty table."""
    data = tmp_path / "train.csv"
    lines = LINEAR.read_text().splitlines()
    train = [x for x in lines[1:] if x.startswith("train,")][:400]
    data.write_text("\n".join([lines[0], *train]) + "\n")
    r = invoke(runner, "kernels", "fit", data, "--only", "gemm", "-o", tmp_path / "m",
               "--max-iter", "5")
    assert r.exit_code == 0, r.stderr
    assert "no held-out rows" in r.stdout and "┃" not in r.stdout
    r = invoke(runner, "kernels", "fit", data, "--only", "gemm", "-o", tmp_path / "m2",
               "--max-iter", "5", "--format", "json")
    assert json.loads(r.stdout) == {"results": []}


def _fit_workers(mark: str) -> list[int]:
    """Processes whose environment holds ``mark`` (a fit's spawned workers inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux's /proc")
def test_an_interrupted_or_killed_fit_stops_its_workers(tmp_path):
    """Ctrl-C sent to `kernels fit` alone (not its process group) printed Aborted! and
    waited for the running fits, minutes; killed outright, its workers fitted on as
    orphans (an audit found one an hour later). Now an interrupt stops the workers and
    exits 130, and a worker dies with its parent (Linux's parent-death signal)."""
    import signal
    import subprocess
    import sys
    import time

    args = [sys.executable, "-m", "planner", "kernels", "fit", str(DATA / "h100" / "h100_fp32.csv"),
            str(LINEAR),
            "--only", "gemm", "--max-iter", "1000", "-o", str(tmp_path / "m")]
    for sig, code in ((signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)):
        mark = f"PLANNER_TEST_FIT_{os.getpid()}_{int(sig)}"
        env = {**os.environ, mark: "1"}
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while len(_fit_workers(mark)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)  # the command, multiprocessing's resource tracker, a worker
        assert len(_fit_workers(mark)) >= 3, "no fit worker started"
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == code
        deadline = time.monotonic() + 10
        while _fit_workers(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _fit_workers(mark) == [], sig
    assert not (tmp_path / "m").exists()


def test_predict_shows_the_fraction_the_roofline_used(runner):
    """A kernel the models do not answer for (a 15 x 15 filter; FP64) is timed by the
    roofline at the device's achievable fraction of peak, which predict shows (it showed
    the model's fitted level, 'fitted on its measurements': an audit); a kernel the model
    times keeps the fitted level."""
    v100 = lookup_device("V100-SXM2")
    args = ("kernels", "predict", "--device", "V100-SXM2", "--conv", "32,64,56,56,64,15,15,1,7")
    rec = json.loads(invoke(runner, *args, "--format", "json").stdout)
    assert rec["source"] == "roofline (out of range)"
    assert rec["sustained_fraction"] == v100.compute_efficiency
    table = invoke(runner, *args).stdout
    assert f"{v100.compute_efficiency:.3f} (the achievable fraction the roofline used)" in table
    assert "fitted on its measurements" not in table
    a100 = lookup_device("A100")
    rec = json.loads(invoke(runner, "kernels", "predict", "--device", "A100", "--dtype", "fp64",
                            "--gemm", "4096,4096,4096", "--format", "json").stdout)
    assert rec["source"] == "roofline (no float64 data)"
    assert rec["sustained_fraction"] == a100.compute_efficiency
    args = ("kernels", "predict", "--device", "V100-SXM2", "--gemm", "4096,4096,4096")
    rec = json.loads(invoke(runner, *args, "--format", "json").stdout)
    level, _ = load_dir(MODELS).get("gemm").level(
        DeviceSpecs.single(v100, "float32", 1), ["V100-SXM2"], ["float32"])
    assert rec["source"] == "mlp:gemm-fp32"
    assert rec["sustained_fraction"] == pytest.approx(float(level[0]), rel=1e-12)
    assert "(fitted on its measurements)" in invoke(runner, *args).stdout


def test_predict_bound_is_the_datasheet_s_without_a_model(runner):
    """Where no model answers (float64), predict's "roofline bound (datasheet)" was the
    fallback's roofline at the catalog's achievable fraction (an audit): for a 4096³
    FP64 GEMM on the A100 SXM, 2 · 4096³ / 9.7 TFLOPS = 14,168.96 µs is the datasheet's,
    and the time, at 0.839 of it, is the fallback's."""
    r = invoke(runner, "kernels", "predict", "--device", "A100", "--dtype", "fp64",
               "--gemm", "4096,4096,4096", "--format", "json")
    doc = json.loads(r.stdout)
    assert doc["source"] == "roofline (no float64 data)"
    assert doc["bound_s"] == pytest.approx(2 * 4096**3 / 9.7e12, rel=1e-12)
    assert doc["roofline_s"] == pytest.approx(doc["bound_s"] / 0.839, rel=1e-3)
    assert doc["achieved_fraction_of_bound"] == pytest.approx(0.839, abs=5e-4)


def test_the_predictions_tanh_is_numpys_to_the_last_bits():
    """planner.kernels.mlp.tanh, ``1 − 2 / (exp(2a) + 1)`` (3.4 times numpy's tanh on an
    AVX2 CPU), against ``np.tanh``: within 4·10⁻¹⁶ absolute over −40..40 in steps of
    4·10⁻⁴ (the measured worst is 3.3·10⁻¹⁶), ±1 where ``2a`` or ``exp(2a)`` overflows
    (a warning there failed this test), ±inf and NaN as numpy gives them, and the input
    (a column view) untouched."""
    from planner.kernels.mlp import tanh

    a = np.concatenate([np.linspace(-40.0, 40.0, 200_001), [0.0, -0.0, 1e-300, -1e-20,
                                                          354.0, 355.0, -800.0, 1e308]])
    a2 = a.reshape(-1, 1)[:, [0, 0]]  # a 2-column array, read through a column view
    view = a2[:, 1]
    before = view.copy()
    got = tanh(view)
    assert np.array_equal(view, before)
    assert np.max(np.abs(got - np.tanh(a))) <= 4e-16
    assert tanh(np.array([354.0, 400.0, 1e308])).tolist() == [1.0, 1.0, 1.0]
    special = tanh(np.array([np.inf, -np.inf, np.nan]))
    assert special[:2].tolist() == [1.0, -1.0] and np.isnan(special[2])
