"""Model files: where they are, how they are written, and how they are checked on load.

A model directory holds ``manifest.yaml`` and one ``<family>.npz`` of weights per kernel
family. The manifest records, per family, the feature order, the input normalisation
(mean, std), the training range of every feature, the output transform, the per-GPU
sustained fractions and harness overheads, the sha256 of the weights file, and for the
whole set the training data (files and their sha256) and the accuracy measured on the
held-out rows when the models were fitted.

Lookup order (the first that exists wins):

1. ``--models-dir DIR`` or the environment variable ``PLANNER_MODELS``;
2. the models shipped inside the installed package (``planner/_models``, put there by the
   wheel's ``force-include`` of the repository's ``models/``);
3. ``models/`` of a source checkout (an editable install).

Anything wrong — a missing file, a checksum that does not match, a feature list this
version of planner does not compute, arrays of the wrong shape — raises
:class:`~planner.errors.ModelDataError` naming the file.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import io
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from numpy.typing import NDArray

from ..errors import Issue, ManifestValueError, ModelDataError, PlannerError
from ..output import to_yaml, write_atomic
from .bands import OpBands, parse_bands
from .features import FEATURES
from .mlp import Mlp
from .model import Ensemble, KernelModel

FloatArray = NDArray[np.float64]
MANIFEST = "manifest.yaml"
KIND = "planner-kernel-models"
FORMAT_VERSION = 2
#: format 1 (one network per family, its fields at the family's top level) still loads
READ_VERSIONS = (1, 2)
ENSEMBLE_RULE = "t = exp(mean over members of log t_member)"
OUTPUT_TRANSFORM = ("t = t0 + max(t_flop / e, t_byte) * (1 + exp(-z)); t0 = launch floor; "
                    "z = MLP((x - mean) / std), tanh hidden layers; "
                    "e = sustained fraction of peak of the GPU (levels), "
                    "median of its class for an unseen GPU; t_flop = FLOPs / peak, t_byte "
                    "= bytes / bandwidth (datasheet)")
ENV = "PLANNER_MODELS"
#: libyaml's safe loader when present (10x faster on the 50 kB manifest than the
#: pure-Python one, which is the fallback); both construct plain data only
SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class ModelSet:
    """The models of one directory, by family, with the manifest they came from."""

    models: Mapping[str, Ensemble]
    manifest: Mapping[str, Any]
    directory: str
    #: op → error bands of held-out measurements (:mod:`.bands`; empty: none recorded)
    error_bands: Mapping[str, OpBands] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """What predicts, as one sha256: the manifest's model records (features,
        normalisation, output transform, each weights file's sha256), in a canonical
        JSON form: the same for the shipped models installed or in a checkout, and for
        the same fit written twice; another when anything that times a kernel differs."""
        import json

        text = json.dumps(self.manifest.get("models"), sort_keys=True, default=str)
        return sha256_bytes(text.encode("utf-8"))

    def get(self, family: str) -> Ensemble | None:
        """The model of a family, if the set has one."""
        return self.models.get(family)


@dataclass
class Extra:
    """Manifest content beyond the models themselves (provenance, fit, accuracy)."""

    data: list[dict[str, Any]] = field(default_factory=list)
    fit: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] = field(default_factory=dict)
    #: the ``error_bands`` section (:func:`.bands.bands_record`; empty: not written)
    error_bands: dict[str, Any] = field(default_factory=dict)


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's contents."""
    return sha256_bytes(Path(path).read_bytes())


def _packaged_dir() -> Path | None:
    try:
        root = importlib.resources.files("planner").joinpath("_models")
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - broken install
        return None
    path = Path(str(root))
    return path if (path / MANIFEST).is_file() else None


def _checkout_dir() -> Path | None:
    path = Path(__file__).resolve().parents[2] / "models"
    return path if (path / MANIFEST).is_file() else None


def shipped_dir() -> Path:
    """The directory of the models shipped with planner (installed, else a checkout's),
    whatever ``--models-dir`` or ``$PLANNER_MODELS`` say."""
    for found in (_packaged_dir(), _checkout_dir()):
        if found is not None:
            return found
    raise ModelDataError("planner: error: no kernel models found (looked in planner/_models "
                         "and the checkout's models/); reinstall planner or pass "
                         "--models-dir")


def shipped_training_data(directory: str | Path | None = None) -> list[tuple[str, Path]]:
    """The measurement files the shipped models were fitted on, in the manifest's order:
    (the name the manifest records, e.g. ``models/data/h100/h100_fp32.csv``, the file).

    The manifest lists them under ``training_data`` as ``models/<path>`` with their
    sha256; the wheel carries them as ``planner/_models/<path>`` beside the models (a
    checkout as ``models/<path>``). Each is checked against its checksum: a missing or
    changed file is an error naming it (a fit on other data than the manifest says would
    mislabel the result). ``directory``: another model directory laid out the same way
    (tests).
    """
    root = Path(directory) if directory is not None else shipped_dir()
    manifest_path = root / MANIFEST
    try:
        doc = yaml.load(manifest_path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ModelDataError(f"{manifest_path}: error: cannot read the shipped manifest "
                             f"({exc}); reinstall planner") from None
    records = doc.get("training_data") if isinstance(doc, dict) else None
    if not isinstance(records, list) or not records:
        raise ModelDataError(f"{manifest_path}: error: training_data: expected the list of "
                             "files the models were fitted on; reinstall planner")
    out: list[tuple[str, Path]] = []
    for i, rec in enumerate(records):
        where = f"training_data[{i}]"
        name = rec.get("file") if isinstance(rec, dict) else None
        digest = rec.get("sha256") if isinstance(rec, dict) else None
        parts = Path(str(name)).parts if isinstance(name, str) else ()
        if len(parts) < 2 or parts[0] != "models" or ".." in parts \
                or not isinstance(digest, str):
            raise _located(manifest_path, ManifestValueError(
                where, f"expected {{file: models/<path>, sha256}}, got {rec!r}"))
        path = root.joinpath(*parts[1:])
        if not path.is_file():
            raise ModelDataError(f"{path}: error: a file the shipped models were fitted on "
                                 "is missing; reinstall planner")
        if sha256_file(path) != digest:
            raise ModelDataError(f"{path}: error: does not match the sha256 the shipped "
                                 f"manifest records for {name}; it was changed after the "
                                 "models were fitted on it (restore it or reinstall planner)")
        out.append((str(name), path))
    return out


def find_models_dir(explicit: str | os.PathLike[str] | None = None,
                    env: Mapping[str, str] | None = None) -> Path:
    """The model directory by the lookup order of the module docstring."""
    environ = os.environ if env is None else env
    chosen = explicit if explicit is not None else environ.get(ENV) or None
    if chosen is not None:
        path = Path(chosen)
        if not (path / MANIFEST).is_file():
            how = "--models-dir" if explicit is not None else f"${ENV}"
            raise ModelDataError(f"{path / MANIFEST}: error: no model manifest there (given "
                                 f"by {how}); fit one with `planner kernels fit DATA... -o "
                                 f"{path}`")
        return path
    return shipped_dir()


def _arr(value: Any, where: str, n: int | None = None) -> FloatArray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ManifestValueError(where, "expected a list of numbers") from None
    if arr.ndim != 1 or (n is not None and arr.shape[0] != n) or not np.all(np.isfinite(arr)):
        raise ManifestValueError(where, f"expected {n if n is not None else 'a list of'} "
                                        "finite numbers")
    return arr


def model_record(model: Ensemble, file: str, digest: str) -> dict[str, Any]:
    """The manifest entry of one family's model: what its members share, then each
    member's own nuisance parameters (its weights are ``m<j>_w<i>``, ``m<j>_b<i>`` in the
    weights file)."""
    first = model.first
    return {
        "file": file,
        "sha256": digest,
        "features": list(first.features),
        "hidden": [int(w.shape[1]) for w in first.mlp.weights[:-1]],
        "activation": "tanh",
        "output_transform": OUTPUT_TRANSFORM,
        "ensemble": ENSEMBLE_RULE,
        "normalisation": {"mean": [float(v) for v in first.mlp.mean],
                          "std": [float(v) for v in first.mlp.std]},
        "training_range": {"min": [float(v) for v in first.lo],
                           "max": [float(v) for v in first.hi]},
        "dtypes": list(first.dtypes),
        "ops": list(first.ops),
        "chips": dict(first.chips),
        "level_specs": {k: [float(x) for x in v] for k, v in first.level_specs.items()},
        "params": model.n_params,
        "members": [_member_record(m) for m in model.members],
    }


def _member_record(model: KernelModel) -> dict[str, Any]:
    return {
        "levels": {k: float(v) for k, v in model.levels.items()},
        "unseen_levels": {k: float(v) for k, v in model.unseen_levels.items()},
        "unseen_energy_j_per_flop": {k: float(v) for k, v in model.unseen_energy.items()},
        "harness_overhead_s": {h: dict(v) for h, v in model.overhead_s.items()},
        "sweep_factor": {c: dict(v) for c, v in model.collection_factor.items()},
        "sweep_drift": {s: {d: [float(x) for x in v] for d, v in per.items()}
                        for s, per in model.drift.items()},
        "sweep_overhead_drift": {s: {d: [float(x) for x in v] for d, v in per.items()}
                                 for s, per in model.overhead_drift.items()},
        "launch_floor_s": model.floor_s,
    }


def weights_bytes(model: Ensemble) -> bytes:
    """The ``.npz`` of an ensemble's weights (deterministic bytes: no timestamps)."""
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for j, member in enumerate(model.members):
        for i, (w, b) in enumerate(zip(member.mlp.weights, member.mlp.biases, strict=True)):
            arrays[f"m{j}_w{i}"] = np.ascontiguousarray(w, dtype=np.float64)
            arrays[f"m{j}_b{i}"] = np.ascontiguousarray(b, dtype=np.float64)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, arr in arrays.items():
            one = io.BytesIO()
            np.lib.format.write_array(one, arr, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            zf.writestr(info, one.getvalue())
    return buf.getvalue()


def save_models(directory: str | Path, models: Mapping[str, Ensemble],
                extra: Extra) -> list[Path]:
    """Write weights and manifest into ``directory`` (created); returns the files."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    records: dict[str, Any] = {}
    for family, model in sorted(models.items()):
        data = weights_bytes(model)
        name = f"{family}.npz"
        write_atomic(out / name, data)
        written.append(out / name)
        records[family] = model_record(model, name, sha256_bytes(data))
    manifest = {
        "kind": KIND,
        "format_version": FORMAT_VERSION,
        "description": "Kernel-time models of planner: the achieved fraction of the roofline "
                       "bound, predicted by a small MLP (numpy inference). See README "
                       "'Hardware models'.",
        "models": records,
        "training_data": extra.data,
        "fit": extra.fit,
        "accuracy": extra.accuracy,
    }
    if extra.error_bands:
        manifest["error_bands"] = extra.error_bands
    write_atomic(out / MANIFEST, "# Written by `planner kernels fit`; do not edit by hand "
                 "(the checksums must match).\n" + to_yaml(manifest))
    written.append(out / MANIFEST)
    return written


def existing_families(directory: str | Path) -> set[str]:
    """The families a model directory's manifest lists (empty: no manifest, or one that
    cannot be read, which a fit may replace): what a fit writing there must keep."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return set()
    try:
        return {str(f) for f in (yaml.safe_load(path.read_text(encoding="utf-8")) or {})
                .get("models") or {}}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError, TypeError):
        return set()  # planner's, damaged: refitted over


def _load_model(directory: Path, family: str, rec: Any, version: int) -> Ensemble:
    where = f"models.{family}"
    if not isinstance(rec, dict):
        raise ManifestValueError(where, "expected a mapping")
    want = FEATURES.get(family)
    if want is None:
        raise ManifestValueError(where, f"unknown kernel family {family!r}")
    feats = rec.get("features")
    if feats != list(want):
        raise ManifestValueError(f"{where}.features",
                                 f"the model was fitted on features {feats!r}, but this "
                                 f"version of planner computes {list(want)!r}; refit it "
                                 "with `planner kernels fit`")
    file = rec.get("file")
    if not isinstance(file, str) or "/" in file or "\\" in file:
        raise ManifestValueError(f"{where}.file", "expected a file name in the model directory")
    path = directory / file
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelDataError(f"{path}: error: cannot read the weights file "
                             f"({exc.strerror or exc})") from None
    if sha256_bytes(raw) != rec.get("sha256"):
        raise ModelDataError(f"{path}: error: sha256 checksum does not match the manifest "
                             "(the file is corrupt or was changed); refit or reinstall")
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            arrays = {k: np.asarray(npz[k], dtype=np.float64) for k in npz.files}
    except (ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        # (a file whose checksum the manifest was edited to match)
        raise ModelDataError(f"{path}: error: not a readable weights file ({exc}); refit "
                             "or reinstall") from None
    if version == 1:  # one network, its fields beside the shared ones
        member_recs: Any = [rec]
        prefixes = [""]
    else:
        member_recs = rec.get("members")
        if not isinstance(member_recs, list) or not member_recs or \
                not all(isinstance(m, dict) for m in member_recs):
            raise ManifestValueError(f"{where}.members", "expected a list of mappings")
        prefixes = [f"m{j}_" for j in range(len(member_recs))]
    n = len(want)
    norm = rec.get("normalisation") or {}
    rng = rec.get("training_range") or {}
    mean = _arr(norm.get("mean"), f"{where}.normalisation.mean", n)
    std = _arr(norm.get("std"), f"{where}.normalisation.std", n)
    if np.any(std <= 0):
        raise ManifestValueError(f"{where}.normalisation.std",
                                 "expected positive numbers (a feature's spread; the fit "
                                 "writes 1 for a constant feature)")
    lo = _arr(rng.get("min"), f"{where}.training_range.min", n)
    hi = _arr(rng.get("max"), f"{where}.training_range.max", n)
    try:
        chips = {str(k): str(v) for k, v in (rec.get("chips") or {}).items()}
        specs = {str(k): [float(x) for x in v] for k, v in
                 (rec.get("level_specs") or {}).items()}
    except (AttributeError, TypeError, ValueError):
        raise ManifestValueError(where, "malformed chips or level_specs") from None
    members = []
    for j, (prefix, mrec) in enumerate(zip(prefixes, member_recs, strict=True)):
        mwhere = where if version == 1 else f"{where}.members[{j}]"
        n_layers = sum(1 for k in arrays if k.startswith(f"{prefix}w")
                       and k[len(prefix) + 1:].isdigit())
        try:
            weights = tuple(arrays[f"{prefix}w{i}"] for i in range(n_layers))
            biases = tuple(arrays[f"{prefix}b{i}"] for i in range(n_layers))
        except KeyError as exc:
            raise ModelDataError(f"{path}: error: missing array {exc}") from None
        if not weights:
            raise ModelDataError(f"{path}: error: no weights for member {j}")
        members.append(_member(family, tuple(feats), Mlp(weights, biases, mean, std), lo, hi,
                               rec, mrec, chips, specs, mwhere))
    model = Ensemble(tuple(members))
    problem = model.check()
    if problem is not None:
        raise ModelDataError(f"{path}: error: {problem}")
    return model


def _member(family: str, feats: tuple[str, ...], mlp: Mlp, lo: FloatArray, hi: FloatArray,
            rec: dict[str, Any], mrec: dict[str, Any], chips: dict[str, str],
            specs: dict[str, list[float]], where: str) -> KernelModel:
    """One member from its manifest entry (``mrec``) and the family's (``rec``)."""
    try:
        levels = {str(k): float(v) for k, v in (mrec.get("levels") or {}).items()}
        unseen = {str(k): float(v) for k, v in (mrec.get("unseen_levels") or {}).items()}
        energy = {str(k): float(v) for k, v in
                  (mrec.get("unseen_energy_j_per_flop") or {}).items()}
        overhead = {str(h): {str(d): float(s) for d, s in v.items()}
                    for h, v in (mrec.get("harness_overhead_s") or {}).items()}
        factors = {str(c): {str(d): float(s) for d, s in v.items()}
                   for c, v in (mrec.get("sweep_factor") or {}).items()}
        drift = {str(sw): {str(d): [float(x) for x in v] for d, v in per.items()}
                 for sw, per in (mrec.get("sweep_drift") or {}).items()}
        overhead_drift = {str(sw): {str(d): [float(x) for x in v] for d, v in per.items()}
                          for sw, per in (mrec.get("sweep_overhead_drift") or {}).items()}
    except (AttributeError, TypeError, ValueError):
        raise ManifestValueError(where, "malformed levels, overheads, sweep factors or drifts") \
            from None
    if any(not 0.0 < v <= 1.0 for v in (*levels.values(), *unseen.values())):
        raise ManifestValueError(where, "sustained fractions must lie in (0, 1]")
    if any(not (0.0 < v < 1e-6) for v in energy.values()):
        raise ManifestValueError(where, "unseen_energy_j_per_flop values must lie in "
                                        "(0, 1e-6) J/FLOP")
    return KernelModel(
        family=family, features=feats, mlp=mlp, lo=lo, hi=hi,
        dtypes=tuple(str(d) for d in rec.get("dtypes") or ()),
        ops=tuple(str(o) for o in rec.get("ops") or ()),
        overhead_s=overhead, collection_factor=factors, levels=levels, level_specs=specs,
        unseen_levels=unseen, unseen_energy=energy, chips=chips, drift=drift,
        overhead_drift=overhead_drift, floor_s=_floor(mrec.get("launch_floor_s", 0.0), where))


def _floor(value: Any, where: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ManifestValueError(f"{where}.launch_floor_s", "expected seconds") from None
    if not 0.0 <= out < 1e-3:
        raise ManifestValueError(f"{where}.launch_floor_s", f"expected 0 to 1 ms, got {out}")
    return out


def load_models(explicit: str | os.PathLike[str] | None = None,
                env: Mapping[str, str] | None = None) -> ModelSet:
    """Load and check the models found by :func:`find_models_dir`."""
    directory = find_models_dir(explicit, env)
    return load_dir(directory)


_CACHE: dict[tuple[str, float], ModelSet] = {}


def _located(manifest_path: Path, exc: ManifestValueError) -> ModelDataError:
    """A manifest problem as an error at its key's line and column, as the user's own
    inputs get (``FILE: KEY: MESSAGE`` when the file cannot be read for positions)."""
    from ..loading import load_file

    try:
        located = load_file(manifest_path).error([Issue(f"$.{exc.key}", exc.message)])
    except PlannerError:  # not readable as the user's YAML: say it without a position
        return ModelDataError(f"{manifest_path}: {exc}")
    return ModelDataError(located.render())


def load_dir(directory: str | Path) -> ModelSet:
    """Load and check the models of one directory (cached by path and manifest mtime)."""
    path = Path(directory)
    manifest_path = path / MANIFEST
    try:
        key = (str(path.resolve()), manifest_path.stat().st_mtime)
    except OSError:
        raise ModelDataError(f"{manifest_path}: error: no such file") from None
    if key in _CACHE:
        return _CACHE[key]
    try:
        text = manifest_path.read_text(encoding="utf-8")
        doc = yaml.load(text, Loader=SAFE_LOADER)
    except yaml.MarkedYAMLError as exc:  # where in the file, as for the user's inputs
        mark = exc.problem_mark or exc.context_mark
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        what = ": ".join(x for x in (exc.context, exc.problem) if x)
        raise ModelDataError(f"{manifest_path}{at}: error: the manifest is not valid YAML "
                             f"({what}); rebuild the models with `planner kernels fit`, or "
                             "reinstall the planner for the shipped ones") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ModelDataError(f"{manifest_path}: error: cannot read the manifest ({exc})") \
            from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ModelDataError(f"{manifest_path}: error: not a planner model manifest "
                             f"(expected 'kind: {KIND}')")
    version = doc.get("format_version")
    if version not in READ_VERSIONS:
        raise ModelDataError(f"{manifest_path}: error: unsupported format_version "
                             f"{version!r} (this planner reads "
                             f"{', '.join(str(v) for v in READ_VERSIONS)})")
    recs = doc.get("models")
    if not isinstance(recs, dict) or not recs:
        raise ModelDataError(f"{manifest_path}: error: no models listed")
    try:
        models = {str(f): _load_model(path, str(f), r, int(version)) for f, r in recs.items()}
        bands = parse_bands(doc.get("error_bands"), "error_bands")
    except ManifestValueError as exc:
        raise _located(manifest_path, exc) from None
    out = ModelSet(models, doc, str(path), bands)
    _CACHE[key] = out
    return out


__all__ = ["ENV", "MANIFEST", "Extra", "ModelSet", "find_models_dir", "load_dir",
           "load_models", "save_models", "sha256_file", "shipped_dir",
           "shipped_training_data"]
