"""Commands for the hardware models: ``planner kernels ...`` and ``planner comm ...``."""

from __future__ import annotations

import click


@click.group()
def kernels() -> None:
    """Kernel-time models: fit, evaluate, predict, profile."""


@click.group()
def comm() -> None:
    """Collective-communication calibration."""
