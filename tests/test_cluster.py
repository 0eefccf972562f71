"""Clusters and the device catalog."""

from __future__ import annotations

import csv

import pytest

from planner.cluster import catalog, lookup_device
from planner.errors import InputError
from planner.inputs import load_cluster, load_cluster_text

from .conftest import CLUSTERS, ROOT

REQUIRED = ["H100-SXM", "H100-PCIe", "H200", "A100-SXM-40GB", "A100-SXM-80GB",
            "A100-PCIe-40GB", "A100-PCIe-80GB", "V100-SXM2", "V100-PCIe", "P100-PCIe", "T4",
            "L4", "P4", "cori-knl"]


def test_catalog_has_required_devices_with_sources():
    cat = catalog()
    for name in REQUIRED:
        dev = cat[name]
        assert dev.sources, name
        assert dev.peak("fp32") > 0 and dev.memory_bytes > 0 and dev.memory_bandwidth > 0


def test_a_board_name_with_its_memory_gets_that_memory():
    """A device named with its memory size (``Tesla V100-SXM2-16GB``, as nvidia-smi names
    the card) is a board with that memory: the 16 GB V100s were aliases of the 32 GB
    boards, so a plan "fit" in 31 GiB on a 16 GiB card (found by an audit). Every alias
    that names a size in GB names its board's (the H100's 80 GB and the H200's 141 GB
    are marketing sizes of 79.6 and 140.4 GiB)."""
    import re

    for name, gib in (("Tesla V100-SXM2-16GB", 16), ("Tesla V100-PCIE-16GB", 16),
                      ("Tesla V100-SXM2-32GB", 32), ("Tesla V100-PCIE-32GB", 32)):
        dev = lookup_device(name)
        assert dev is not None and dev.memory_bytes == gib * 2**30, name
    same = lookup_device("Tesla V100-SXM2-16GB"), lookup_device("V100-SXM2")
    assert same[0] is not None and same[1] is not None
    assert (same[0].chip, same[0].peak("fp32"), same[0].memory_bandwidth) == \
        (same[1].chip, same[1].peak("fp32"), same[1].memory_bandwidth)
    for dev in catalog().values():
        for alias in dev.aliases:
            m = re.search(r"(\d+)\s*GB", alias)
            if m:
                assert abs(dev.memory_bytes / 1e9 - int(m.group(1))) / int(m.group(1)) \
                    < 0.10, (dev.name, alias)


def test_neusight_names_reachable():
    """Every GPU of NeuSight's device_configs is reachable under its exact name."""
    path = ROOT / "models" / "data" / "neusight" / "neusight_device_configs.csv"
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 9
    for row in rows:
        dev = lookup_device(row["device"])
        assert dev is not None, row["device"]
        # the catalog agrees with NeuSight's spec on memory bandwidth within 15%
        assert dev.memory_bandwidth == pytest.approx(float(row["mem_bw_GBps"]) * 1e9, rel=0.15)


def test_peak_fallbacks():
    v100 = catalog()["V100-SXM2"]
    assert v100.peak("bf16") == v100.peak("fp16") == 125e12
    assert catalog()["P4"].peak("bf16") == 5.5e12


def test_example_clusters():
    dgx = load_cluster(CLUSTERS / "dgx-h100.yaml")
    assert dgx.devices_per_node == 8
    assert dgx.inter.bandwidth == pytest.approx(50e9)
    # fitted to the 8×H200 NVSwitch sweep (tests/test_commfit.py holds it to the fit)
    assert dgx.intra.bandwidth == pytest.approx(351.3e9)
    knl = load_cluster(CLUSTERS / "cori-knl.yaml")
    assert knl.inter.latency_s == pytest.approx(2e-6)
    assert knl.inter.bandwidth == pytest.approx(6e9)
    pcie = load_cluster(CLUSTERS / "pcie-8gpu.yaml")
    assert pcie.nodes == 1


def test_inline_device_with_base():
    cl = load_cluster_text("""
kind: cluster
devices_per_node: 4
device: {base: A100-SXM-80GB, memory: 40 GiB, name: a100-half}
network:
  intra_node: {latency: 2 us, bandwidth: 300 GB/s}
  inter_node: {latency: 5 us, bandwidth: 25 GB/s}
""")
    assert cl.device.name == "a100-half"
    assert cl.device.memory_bytes == 40 * 2**30
    assert cl.device.peak("bf16") == 312e12


_ALIASED = """kind: cluster
devices_per_node: 8
device: {{name: {name}, base: H100-SXM, aliases: [{aliases}]}}
network:
  intra_node: {{latency: 2 us, bandwidth: 300 GB/s}}
  inter_node: {{latency: 9 us, bandwidth: 400 Gbit/s}}
"""


def test_a_device_alias_may_not_be_another_catalog_gpu():
    """An audit found a cluster file's device with `aliases: [A100-PCIe-40GB]` took
    NeuSight's A100 rows as its own under `kernels eval --cluster` (scored as a B200).
    An alias naming another catalog GPU is refused where it is written; aliases of the
    catalog GPU a device replaces (named like it, in any spelling) are its own."""
    with pytest.raises(InputError) as exc:
        load_cluster_text(_ALIASED.format(
            name="B200", aliases="NVIDIA B200, NVIDIA A100-PCIE-40GB"), "c.yaml")
    problems = exc.value.problems
    assert len(problems) == 1
    assert (problems[0].line, problems[0].column) == (3, 61)  # the alias itself
    assert problems[0].message == (
        "alias 'NVIDIA A100-PCIE-40GB' is the catalog's A100-PCIe-40GB: measurements naming "
        "it would be read as B200's; remove it, or give a name only this device has")
    cl = load_cluster_text(_ALIASED.format(name="h100-sxm",
                                           aliases="NVIDIA H100 80GB HBM3, H100 SXM5"))
    assert cl.device.aliases == ("NVIDIA H100 80GB HBM3", "H100 SXM5")


def test_inline_device_full_spec_and_missing_keys():
    with pytest.raises(InputError) as exc:
        load_cluster_text("""
kind: cluster
devices_per_node: 4
device: {peak_flops: {fp32: 10 TFLOPS}, memory: 16 GiB}
network:
  intra_node: {latency: 2 us, bandwidth: 300 GB/s}
  inter_node: {latency: 5 us, bandwidth: 25 GB/s}
""")
    text = str(exc.value)
    assert "missing required key 'memory_bandwidth'" in text
    assert "missing required key 'sm_count'" in text


def test_single_node_needs_no_inter_tier():
    cl = load_cluster_text("""
kind: cluster
nodes: 1
devices_per_node: 8
device: H100-SXM
network:
  intra_node: {latency: 2 us, bandwidth: 450 GB/s}
""")
    assert cl.inter == cl.intra


def test_collective_library():
    """``collectives.library`` names the library ``auto`` chooses from: NCCL by default
    on GPUs, MPI on CPU nodes, either when given; anything else is an error at its line
    and column."""
    text = """kind: cluster
nodes: 1
devices_per_node: 8
device: {device}
network:
  intra_node: {{latency: 2 us, bandwidth: 450 GB/s}}
collectives: {{algorithm: auto{extra}}}
"""
    assert load_cluster_text(text.format(device="H100-SXM", extra="")) \
        .collective_library == "nccl"
    assert load_cluster_text(text.format(device="cori-knl", extra="")) \
        .collective_library == "mpi"
    assert load_cluster_text(text.format(device="H100-SXM", extra=", library: mpi")) \
        .collective_library == "mpi"
    with pytest.raises(InputError) as exc:
        load_cluster_text(text.format(device="H100-SXM", extra=", library: gloo"))
    assert ":7:" in str(exc.value) and "nccl" in str(exc.value) and "mpi" in str(exc.value)


def test_nvls_takes_an_algorithm_bandwidth():
    """`nvls:` gives NVLS all-reduce's algbw; the bus bandwidth it took before is an error
    at its line that says how to convert it, not a number read two ways."""
    text = """kind: cluster
nodes: 1
devices_per_node: 8
device: H100-SXM
network:
  intra_node:
    latency: 2 us
    bandwidth: 351 GB/s
    nvls: {bandwidth: 457.5 GB/s, latency: 55 us, min_bytes: 2 MiB}
"""
    with pytest.raises(InputError) as exc:
        load_cluster_text(text)
    msg = str(exc.value)
    assert "<cluster>:9:23: error: nvls takes 'algbw'" in msg
    assert "B·p/(2(p−1))" in msg and "missing required key" not in msg
    cl = load_cluster_text(text.replace("{bandwidth: 457.5", "{algbw: 261.4"))
    assert cl.intra.nvls_algbw == pytest.approx(261.4e9, rel=1e-12)


@pytest.mark.parametrize(("name", "meant"), [
    ("Tesla V100", "V100-SXM2"), ("H100 SXM5", "H100-SXM"), ("titan x pascl", "TITAN-X-Pascal"),
    ("GTX 1080ti", "GTX-1080-Ti"),
    # another model is no spelling slip (an audit: each was offered the model on the right)
    ("B200", None), ("H800", None), ("L40S", None), ("A10G", None), ("RTX A6000", None),
    ("H1000", None)])
def test_a_device_suggestion_is_a_spelling_of_the_same_model(name, meant):
    """A name the catalog lacks gets a did-you-mean only among names of its own model
    number (the letter before its digits and the digits: B200, H200 and H800 are three
    GPUs), else none; a name without one, among all names, closely."""
    from planner.cluster import suggest_device

    assert suggest_device(name) == meant
