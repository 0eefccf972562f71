"""The same inputs give byte-identical output: across runs, across ``PYTHONHASHSEED``
values (0, 1, 2**32 - 1, random) and locales (``LC_ALL`` and ``LANG`` set to C, POSIX,
C.UTF-8 and de_DE.UTF-8 — the last falls back to C where it is not installed, which is
tested too), across the CPU code paths of the numerical libraries (OpenBLAS's kernels
for older CPUs, numpy's loops without AVX2 or AVX-512), as ``python -m planner``
processes; and within one process, run after run (caches must not change what is
printed)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import CLUSTERS, DATA, NETWORKS, ROOT, invoke

COMMANDS = {
    "plan-yaml": ["plan", "examples/networks/resnet50.yaml", "examples/clusters/dgx-h100.yaml",
                  "-p", "64", "-b", "2048", "--format", "yaml"],
    "plan-json": ["plan", "examples/networks/gpt2-small.yaml",
                  "examples/clusters/dgx-h100.yaml", "-p", "96", "-b", "768", "--format",
                  "json"],
    "plan-table": ["plan", "examples/networks/alexnet.yaml", "examples/clusters/cori-knl.yaml",
                   "-p", "512", "-b", "2048", "--cost-model", "gholami2018"],
    "show-yaml": ["show", "examples/networks/vgg16.yaml", "--format", "yaml"],
    "errors": ["validate", "tests/data/invalid/many_problems.yaml",
               "tests/data/hostile/cluster_bad_units.yaml"],
}

VARIANTS = {
    "seed 0, C": {"PYTHONHASHSEED": "0", "LC_ALL": "C"},
    "seed 1, C.UTF-8": {"PYTHONHASHSEED": "1", "LC_ALL": "C.UTF-8"},
    "seed 2^32-1, POSIX": {"PYTHONHASHSEED": "4294967295", "LC_ALL": "POSIX"},
    "random seed, de_DE.UTF-8": {"PYTHONHASHSEED": "random", "LC_ALL": "de_DE.UTF-8"},
    "random seed, LANG=de_DE.UTF-8": {"PYTHONHASHSEED": "random", "LANG": "de_DE.UTF-8",
                                      "LC_NUMERIC": "de_DE.UTF-8"},
    "random seed, LANG=C.UTF-8": {"PYTHONHASHSEED": "random", "LANG": "C.UTF-8"},
    "random seed again": {"PYTHONHASHSEED": "random", "LC_ALL": "C.UTF-8"},
}


#: the code paths another machine may take: OpenBLAS picks its kernels for the CPU it
#: finds (``OPENBLAS_CORETYPE`` forces one; Prescott's SSE3 kernels run on any x86-64),
#: numpy its SIMD loops (``NPY_DISABLE_CPU_FEATURES`` turns the AVX2 and AVX-512 ones
#: off; features the CPU lacks are ignored)
_SSE3_BLAS = {"OPENBLAS_CORETYPE": "Prescott"}
_NO_AVX2 = {"NPY_DISABLE_CPU_FEATURES": "X86_V3,X86_V4,AVX512_ICL,AVX512_SPR"}
CPU_PATHS = {"SSE3 BLAS": _SSE3_BLAS, "numpy without AVX2": _NO_AVX2,
             "both": {**_SSE3_BLAS, **_NO_AVX2}}


def _run(args: list[str], extra: dict[str, str]) -> tuple[int, bytes, bytes]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PLANNER_", "LC_", "LANG", "PYTHONHASHSEED", "PYTHONIOENCODING",
                                "PYTHONUTF8", "OPENBLAS_CORETYPE", "NPY_DISABLE_CPU"))}
    env.update({"COLUMNS": "120", **extra})
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "planner", *args], cwd=ROOT, env=env,
                          capture_output=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def _installed_locales() -> set[str]:
    try:
        out = subprocess.run(["locale", "-a"], capture_output=True, text=True).stdout
    except OSError:
        return set()
    return {line.strip().lower().replace("-", "") for line in out.splitlines()}


def test_locales_tried_include_real_ones():
    """C and POSIX always exist; the UTF-8 ones are compared whether installed or not."""
    installed = _installed_locales()
    assert {"c", "posix"} <= installed
    assert any(v.get("LC_ALL") == "C.UTF-8" for v in VARIANTS.values())


@pytest.mark.parametrize("name", list(COMMANDS))
def test_byte_identical_across_hash_seeds_and_locales(name):
    args = COMMANDS[name]
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip(VARIANTS, pool.map(lambda env: _run(args, env), VARIANTS.values()),
                        strict=True))
    reference = runs["seed 0, C"]
    assert reference[0] == (2 if name == "errors" else 0), reference[2].decode()
    product = reference[2] if name == "errors" else reference[1]
    assert len(product) > 500
    for variant, result in runs.items():
        assert result[0] == reference[0], variant
        assert result[1] == reference[1], f"stdout differs under {variant}"
        if name == "errors":
            assert result[2] == reference[2], f"stderr differs under {variant}"


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="the code paths forced are x86-64 ones")
def test_byte_identical_across_cpu_code_paths():
    """Llama 3 8B at batch 16 has layouts that tie exactly (the same kernels, the same
    collectives); before kernel times kept 24 significant bits the search chose among
    them by the last bits of the networks' arithmetic, and OpenBLAS's default and
    Prescott kernels gave two different plans on one machine."""
    args = ["plan", "examples/networks/llama3-8b.yaml", "examples/clusters/dgx-h100.yaml",
            "-p", "64", "-b", "16", "--optimizer", "adam", "--format", "json"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda env: _run(args, env), [{}, *CPU_PATHS.values()]))
    assert runs[0][0] == 0, runs[0][2].decode()
    for name, result in zip(CPU_PATHS, runs[1:], strict=True):
        assert result[0] == 0, result[2].decode()
        assert result[1] == runs[0][1], f"the plan differs with {name}"


def test_same_process_prints_the_same_every_time(runner):
    """Caches (layouts, transitions, YAML scalars) warm up but never change the output."""
    for args, code in (
            (["plan", NETWORKS / "resnet50.yaml", CLUSTERS / "dgx-h100.yaml", "-p", "64", "-b",
              "2048", "--format", "yaml", "--estimator", "roofline"], 0),
            (["plan", NETWORKS / "alexnet.yaml", CLUSTERS / "cori-knl.yaml", "-p", "512", "-b",
              "2048", "--format", "json", "--objective", "comm", "--estimator", "roofline"], 0),
            (["show", NETWORKS / "gpt2-small.yaml", "--format", "yaml"], 0),
            (["validate", DATA / "invalid" / "many_problems.yaml"], 2)):
        outputs = {(r.exit_code, r.stdout, r.stderr)
                   for r in (invoke(runner, *args) for _ in range(3))}
        assert len(outputs) == 1, args
        assert outputs.pop()[0] == code, args
