"""Serialising plain data (JSON, YAML) deterministically and writing files safely."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError


def round_sig(value: float, digits: int = 4) -> float:
    """Round a float to ``digits`` significant digits (0, inf, nan unchanged)."""
    if value == 0 or not math.isfinite(value):
        return value
    return float(f"{value:.{digits}g}")


def rounded(data: Any, digits: int = 4) -> Any:
    """A copy of plain data with every float rounded to ``digits`` significant digits."""
    if isinstance(data, bool):
        return data
    if isinstance(data, float):
        return round_sig(data, digits)
    if isinstance(data, dict):
        return {k: rounded(v, digits) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [rounded(v, digits) for v in data]
    return data


def to_json(data: Any) -> str:
    """Pretty JSON with a final newline; non-finite floats become null."""
    return json.dumps(_finite(data), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _finite(data: Any) -> Any:
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


_BaseDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_BaseDumper):  # type: ignore[misc]
    """Block style for mappings, flow style for short lists of scalars (shapes, grids)."""


def _repr_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = len(data) <= 8 and all(
        isinstance(v, (int, float)) or (isinstance(v, str) and len(v) < 24) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _repr_float(dumper: yaml.SafeDumper, data: float) -> yaml.Node:
    if math.isnan(data):
        text = ".nan"
    elif math.isinf(data):
        text = ".inf" if data > 0 else "-.inf"
    else:
        text = repr(data)
        if "e" in text and "." not in text.split("e")[0]:
            mant, exp = text.split("e")
            text = f"{mant}.0e{exp}"
    return dumper.represent_scalar("tag:yaml.org,2002:float", text)


_Dumper.add_representer(list, _repr_list)
_Dumper.add_representer(tuple, _repr_list)
_Dumper.add_representer(float, _repr_float)


def to_yaml(data: Any) -> str:
    """Block-style YAML, keys in insertion order, readable by any YAML 1.1/1.2 parser."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                     default_flow_style=False, width=100)


def write_atomic(path: str | os.PathLike[str], text: str | bytes,
                 protect: tuple[str | os.PathLike[str], ...] = ()) -> None:
    """Write ``text`` (or bytes) to ``path`` atomically: a temporary file in the same folder, then a
    rename. An existing file is replaced only when the new one is complete; on any error
    (or an interrupt) the old file is untouched and no partial file is left. Refuses to
    overwrite one of ``protect`` (the command's own inputs)."""
    target = Path(path)
    for p in protect:
        try:
            if target.exists() and Path(p).exists() and os.path.samefile(target, p):
                raise UsageError(f"refusing to write {target}: it is one of this command's "
                                 "inputs; choose another output file")
        except OSError:
            continue
    if target.is_dir():
        raise UsageError(f"cannot write {target}: it is a directory")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"cannot write {target}: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        data = text.encode("utf-8") if isinstance(text, str) else text
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if target.exists():
            with contextlib.suppress(OSError):
                os.chmod(tmp, target.stat().st_mode & 0o7777)
        else:
            with contextlib.suppress(OSError):
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
