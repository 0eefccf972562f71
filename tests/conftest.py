"""Shared fixtures: paths, a CLI runner, and a clean environment for every test."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NETWORKS = EXAMPLES / "networks"
CLUSTERS = EXAMPLES / "clusters"
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rendering and behaviour must not depend on the caller's terminal or settings."""
    for var in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES", "PLANNER_DEBUG",
                "PLANNER_MODELS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COLUMNS", "120")


@pytest.fixture
def runner() -> CliRunner:
    """A click runner; stderr is kept apart from stdout (click >= 8.2)."""
    return CliRunner()


@pytest.fixture
def net_file(tmp_path: Path) -> str:
    """The pipeline tests' small decoder (``tests.test_pipeline.NET``) in a file."""
    from .test_pipeline import NET

    path = tmp_path / "net.yaml"
    path.write_text(NET)
    return str(path)


def invoke(runner: CliRunner, *args: str):
    """Invoke the planner CLI with string arguments."""
    from planner.cli import cli

    return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="Rewrite committed golden files (review the diff).")


@pytest.fixture
def update_golden(request) -> bool:
    return bool(request.config.getoption("--update-golden"))
