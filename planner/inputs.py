"""Loading input files: YAML → validated objects, or an :class:`InputError` that names
every problem with its file, line and column."""

from __future__ import annotations

import os
from typing import Any

from .cluster import Cluster, cluster_from_data
from .errors import InputError, Issue, IssueList, TooManyIssues
from .fields import show
from .loading import Document, load_file, parse_text
from .network import Network, network_from_data

KINDS = ("network", "cluster", "training")
#: Top-level keys of the plans planner writes that no input file has.
PLAN_KEYS = frozenset(("planner", "inputs", "problem", "iteration", "placement", "baselines"))


#: what the planner writes that is no input of its own (by :func:`detect_kind`'s kind)
WRITTEN = {"sweep": "the output of `planner sweep`", "show": "the output of `planner show`"}


def detect_kind(data: Any) -> str | None:
    """What a document is: its ``kind`` key, or a guess from its keys."""
    if not isinstance(data, dict):
        return None
    if len(PLAN_KEYS.intersection(data)) >= 3:
        return "plan"  # written by `planner plan` or `planner cost` (even if edited)
    # what `planner sweep` and `planner show` write, which were read as a cluster file
    # (a sweep names its device) and a network (found by an audit)
    if "planner" in data and "results" in data:
        return "sweep"
    if isinstance(data.get("network"), str) and "input_shape" in data and "layers" in data:
        return "show"
    kind = data.get("kind")
    if isinstance(kind, str):
        return kind
    if "layers" in data:
        return "network"
    if "devices_per_node" in data or "device" in data:
        return "cluster"
    if "network" in data and "cluster" in data:
        return "training"
    return None


def _kind_issue(doc: Document, expected: str | None) -> Issue:
    data = doc.data
    want = expected or "network', 'kind: cluster' or 'kind: training"
    if data is None:
        return Issue("$", f"{doc.nothing()}: expected a YAML mapping with 'kind: {want}'")
    if not isinstance(data, dict):
        return Issue("$", f"expected a YAML mapping at the top level (with 'kind: {want}')")
    kind = data.get("kind")
    if kind is not None and kind not in KINDS:
        import difflib

        near = difflib.get_close_matches(str(kind).lower(), KINDS, n=1, cutoff=0.6)
        return Issue("$.kind", f"unknown kind {show(kind)}; expected one of "
                               f"{', '.join(KINDS)}"
                               + (f"; did you mean '{near[0]}'?" if near else ""))
    return Issue("$", f"cannot tell what this file is; add 'kind: {want}' at the top")


def _wrong_kind(kind: str, expected: str) -> Issue:
    if kind == "plan":
        return Issue("$", f"this is a plan written by planner, not a {expected} file; "
                          f"give the {expected} file the plan was made from")
    if kind in WRITTEN:
        return Issue("$", f"this is {WRITTEN[kind]}, not a {expected} file")
    hint = ""
    if {kind, expected} == {"network", "cluster"}:
        hint = f"; is it the {kind} file? " + _order_hint()
    return Issue("$.kind", f"expected a {expected} file, got 'kind: {kind}'{hint}")


def _order_hint() -> str:
    """Where the command being run takes its network and cluster files (a hint for a
    file of the other kind; found by an audit: show, check and comm fit were told what
    plan, cost, compare and sweep take)."""
    import click

    ctx = click.get_current_context(silent=True)
    path = ctx.command_path.split() if ctx is not None else []
    command = path[-1] if path else ""
    if command == "show":
        return "(show takes a NETWORK file)"
    if command == "check":
        return ("(a training configuration names its files under 'network' and "
                "'cluster': are they swapped?)")
    if command in ("predict", "fit", "eval"):  # kernels and comm: --cluster FILE
        return "(--cluster takes a CLUSTER file)"
    # `plan CLUSTER NETWORK`: the commands take the network first
    return "(plan, cost, compare and sweep take NETWORK, then CLUSTER)"


def network_from_document(doc: Document) -> Network:
    """A validated network from a parsed document, or an InputError."""
    issues: list[Issue] = IssueList()
    kind = detect_kind(doc.data)
    if kind is None:
        raise doc.error([_kind_issue(doc, "network")])
    if kind != "network":
        raise doc.error([_wrong_kind(kind, "network")])
    try:
        net = network_from_data(doc.data, issues)
    except TooManyIssues:
        raise doc.error(issues, truncated=True) from None
    if issues or net is None:
        raise doc.error(issues or [Issue("$", "invalid network")])
    return net


def cluster_kind_issue(doc: Document) -> Issue | None:
    """Why a document is not a cluster file (None: it says it is one)."""
    kind = detect_kind(doc.data)
    if kind is None:
        return _kind_issue(doc, "cluster")
    return _wrong_kind(kind, "cluster") if kind != "cluster" else None


def cluster_from_document(doc: Document) -> Cluster:
    """A validated cluster from a parsed document, or an InputError."""
    issues: list[Issue] = IssueList()
    kind = detect_kind(doc.data)
    if kind is None:
        raise doc.error([_kind_issue(doc, "cluster")])
    if kind != "cluster":
        raise doc.error([_wrong_kind(kind, "cluster")])
    try:
        cl = cluster_from_data(doc.data, issues)
    except TooManyIssues:
        raise doc.error(issues, truncated=True) from None
    if issues or cl is None:
        raise doc.error(issues or [Issue("$", "invalid cluster")])
    return cl


def load_network(path: str | os.PathLike[str]) -> Network:
    """Load and validate a network file."""
    return network_from_document(load_file(path))


def load_cluster(path: str | os.PathLike[str]) -> Cluster:
    """Load and validate a cluster file."""
    return cluster_from_document(load_file(path))


def load_network_text(text: str, name: str = "<network>") -> Network:
    """Validate network YAML given as text (for tests and the API)."""
    return network_from_document(parse_text(text, name))


def load_cluster_text(text: str, name: str = "<cluster>") -> Cluster:
    """Validate cluster YAML given as text (for tests and the API)."""
    return cluster_from_document(parse_text(text, name))


def validate_file(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """Load any planner file; returns (kind, object). Raises InputError."""
    doc = load_file(path)
    kind = detect_kind(doc.data)
    if kind == "network":
        return kind, network_from_document(doc)
    if kind == "cluster":
        return kind, cluster_from_document(doc)
    if kind == "training":
        from .training import prepare_config, training_from_document

        cfg = training_from_document(doc, str(path))
        prepare_config(cfg)  # its network, cluster and strategy too, as check reads them
        return kind, cfg
    if kind == "plan":
        from .launch import launch_spec

        return kind, launch_spec(doc, str(path))
    if kind in WRITTEN:
        raise doc.error([Issue("$", f"this is {WRITTEN[kind]}, not an input: validate checks "
                                    "networks, clusters, training configurations and plans")])
    raise doc.error([_kind_issue(doc, None)])


__all__ = ["InputError", "detect_kind", "load_cluster", "load_network", "validate_file"]
