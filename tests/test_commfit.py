"""Collective calibration: nccl-tests parser, α–β ring fit, NVLS, CLI."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from planner.cluster import cluster_from_data
from planner.commfit import fit_all, parse_nccl_tests, read_samples
from planner.errors import InputError

from .conftest import CLUSTERS, DATA, ROOT, invoke

NCCL = DATA / "nccl"
FIXTURES = [NCCL / f for f in ("all_reduce_perf_8xh100.txt", "all_gather_perf_8xh100.txt",
                               "reduce_scatter_perf_8xh100.txt",
                               "all_reduce_perf_2x8xh100.txt")]
MEASURED = ROOT / "models" / "data"
DEEPBENCH = MEASURED / "deepbench" / "deepbench_allreduce.csv"
H200 = MEASURED / "ml-engineering-allreduce" / "allreduce_8xH200_nvswitch.csv"


def test_nccl_tests_parser_reads_ranks_nodes_op_and_times():
    rows = parse_nccl_tests(FIXTURES[0].read_text(), str(FIXTURES[0]))
    assert len(rows) == 11
    assert {(r.op, r.ranks, r.nodes, r.system) for r in rows} == {
        ("all_reduce", 8, 1, "NVIDIA H100 80GB HBM3")}
    assert rows[0].nbytes == 1024 and rows[0].seconds == pytest.approx(16.8e-6)
    multi = parse_nccl_tests(FIXTURES[3].read_text(), "x.txt")
    assert {(r.ranks, r.nodes) for r in multi} == {(16, 2)}
    ag = parse_nccl_tests(FIXTURES[1].read_text(), "x.txt")
    assert {r.op for r in ag} == {"all_gather"}


def test_ranks_uneven_over_nodes_are_noted():
    """Two nodes running 15 + 1 ranks are fitted as 8 a node, which times the lone rank's
    NIC as a node's: a note says so (found by an audit; it was fitted in silence)."""
    text = FIXTURES[3].read_text()
    hosts = re.findall(r"#\s+Rank\s+\d+ Group\s+\d+ Pid\s+\d+ on\s+(\S+)", text)
    assert len(hosts) == 16 and len(set(hosts)) == 2
    a, b = sorted(set(hosts))
    moved = re.sub(rf"on(\s+){b} ", rf"on\g<1>{a} ", text)  # all 16 on the first node
    moved = re.sub(rf"on(\s+){a} ", rf"on\g<1>{b} ", moved, count=1)  # then one back
    notes: list[str] = []
    rows = parse_nccl_tests(moved, "x.txt", notes)
    assert {(r.ranks, r.nodes) for r in rows} == {(16, 2)}
    assert any("its 16 ranks run unevenly on 2 nodes (1 to 15 a node): the fit prices "
               "them as 8 a node" in n for n in notes), notes
    even: list[str] = []
    parse_nccl_tests(text, "x.txt", even)
    assert not any("unevenly" in n for n in even)


def test_parser_infers_the_collective_without_its_name():
    # no 'Collective test starting' line and an uninformative file name: count × 4 B ×
    # ranks == size and redop 'none' make it an all-gather
    text = "\n".join(ln for ln in FIXTURES[1].read_text().splitlines()
                     if "Collective test" not in ln)
    assert {r.op for r in parse_nccl_tests(text, "out.txt")} == {"all_gather"}
    text = "\n".join(ln for ln in FIXTURES[2].read_text().splitlines()
                     if "Collective test" not in ln)
    assert {r.op for r in parse_nccl_tests(text, "out.txt")} == {"reduce_scatter"}


def test_parser_handles_mpirun_prefixes():
    text = "".join(f"[1,0]<stdout>:{ln}\n" for ln in FIXTURES[0].read_text().splitlines())
    assert len(parse_nccl_tests(text, "x.txt")) == 11


def test_malformed_nccl_output_reports_file_and_line(tmp_path):
    bad = tmp_path / "all_reduce_perf.txt"
    lines = FIXTURES[0].read_text().splitlines()
    lines[17] = "        2048           512     float     sum      -1     oops"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as info:
        read_samples([bad])
    assert str(info.value).startswith(f"{bad}:18:1: error: expected 13 columns")
    # a result row whose size is not a whole number of bytes was left out without a
    # word (an audit); lines of text after the header (NCCL INFO, a host name first) are
    # still passed over
    lines = FIXTURES[0].read_text().splitlines()
    original = lines[17]
    for size in ("1024x", "1e3", "-1024", "1048576.5", "abcd"):
        lines[17] = original.replace("1024 ", f"{size} ", 1)
        bad.write_text("\n".join(lines) + "\n")
        with pytest.raises(InputError) as info:
            read_samples([bad])
        assert str(info.value).startswith(f"{bad}:18:9: error: expected a whole number of "
                                          f"bytes in the size column, got {size!r}"), info.value
    lines[17] = "10-0-0-1:2871:2871 [0] NCCL INFO Channel 00/24 : 0 1 2 3 4 5 6 7"
    bad.write_text("\n".join([*lines[:17], original, *lines[17:]]) + "\n")
    assert len(read_samples([bad])) == len(read_samples([FIXTURES[0]]))
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n")
    with pytest.raises(InputError, match="no nccl-tests result table"):
        read_samples([empty])


def test_runs_written_to_one_file_are_read_one_by_one(tmp_path):
    """`for ...; do mpirun all_*_perf; done >> log`: each run keeps its own collective,
    rank and node counts, and the fit equals the one of separate files."""
    log = tmp_path / "sweep.log"
    log.write_text("".join(f.read_text() for f in FIXTURES))
    together = read_samples([log])
    apart = read_samples(FIXTURES)
    key = [(r.op, r.ranks, r.nodes, r.nbytes, r.seconds) for r in apart]
    assert [(r.op, r.ranks, r.nodes, r.nbytes, r.seconds) for r in together] == key
    (a,), (b,) = fit_all(together), fit_all(apart)
    assert (a.intra, a.inter, a.nvls) == (b.intra, b.inter, b.nvls)
    # the same run twice is twice the rows, not one run of twice the ranks
    twice = tmp_path / "twice.txt"
    twice.write_text(FIXTURES[0].read_text() * 2)
    rows = read_samples([twice])
    assert len(rows) == 22 and {(r.ranks, r.nodes) for r in rows} == {(8, 1)}


def test_nccl_output_without_its_rank_lines_or_with_bad_times_is_an_error(tmp_path):
    lines = FIXTURES[0].read_text().splitlines()
    table = tmp_path / "all_reduce_perf.txt"
    table.write_text("\n".join(ln for ln in lines
                               if "Rank" not in ln and "nThread" not in ln) + "\n")
    with pytest.raises(InputError, match="cannot tell how many ranks ran"):
        read_samples([table])
    row = next(i for i, ln in enumerate(lines) if ln.strip().startswith("4096 "))
    # a subnormal time overflowed the fit; 0.001 µs was fitted as latency-bound (an
    # audit: no collective completes in under 0.5 µs)
    for bad in ("nan", "inf", "-5.0", "1e-310", "0.001"):
        toks = lines[row].split()
        toks[5] = bad  # the out-of-place time
        edited = [*lines[:row], "  ".join(toks), *lines[row + 1:]]
        f = tmp_path / f"all_reduce_{bad}.txt"
        f.write_text("\n".join(edited) + "\n")
        with pytest.raises(InputError) as info:
            read_samples([f])
        # at the time's column (it was column 1, the size's: an audit)
        column = edited[row].index(f"  {bad}  ") + 3
        assert str(info.value).startswith(f"{f}:{row + 1}:{column}: error: expected a "
                                          "time between 0.5 µs (no collective is faster) "
                                          f"and 1 day, got {bad} µs")
    # a row with more fields than the header is refused at the first extra one (it was
    # read in silence, where fewer fields were refused)
    toks = lines[row].split()
    extra = "  ".join([*toks, "17"])
    f = tmp_path / "all_reduce_extra.txt"
    f.write_text("\n".join([*lines[:row], extra, *lines[row + 1:]]) + "\n")
    with pytest.raises(InputError) as info:
        read_samples([f])
    assert str(info.value).startswith(
        f"{f}:{row + 1}:{extra.rindex('17') + 1}: error: expected {len(toks)} columns as in "
        f"the nccl-tests header, found {len(toks) + 1}")


def test_fit_recovers_the_fixture_parameters():
    # the fixtures follow known parameters with 1.5% noise (tests/data/nccl/README.md),
    # across nodes NCCL's ring alone: fitted as a cluster that names it prices them
    (fit,) = fit_all(read_samples(FIXTURES))
    (ring,) = fit_all(read_samples(FIXTURES), "ring")
    assert (ring.intra, ring.nvls) == (fit.intra, fit.nvls)  # fitted alike
    assert fit.intra.latency_s == pytest.approx(1.2e-6, rel=0.05)
    assert fit.intra.bandwidth == pytest.approx(360e9, rel=0.03)
    assert ring.inter.latency_s == pytest.approx(7.5e-6, rel=0.05)
    assert ring.inter.bandwidth == pytest.approx(46e9, rel=0.03)
    # NVLS found by the breakpoint fit (no notes in nccl-tests output)
    assert fit.nvls is not None
    # fitted as an algorithm bandwidth: the fixture's 480 GB/s bus bandwidth on 8 ranks
    # is 480 · 8 / (2 · 7) = 274.3 GB/s (nccl-tests: busbw = algbw · 2(n−1)/n)
    assert fit.nvls.bandwidth == pytest.approx(480e9 * 8 / 14, rel=0.03)
    assert 2**20 <= fit.nvls.min_bytes <= 4 * 2**20
    # within a node as auto prices them (NVLS from its break; a named ring has none),
    # across nodes as the ring
    assert max(e.mape for e in fit.errors if e.nodes == 1) < 2.0
    assert max(e.mape for e in ring.errors if e.nodes > 1) < 2.0


def _priced_mape(cluster_yaml: str, rows) -> dict[int, float]:
    """The MAPE per rank count of ``rows`` priced by the planner's own collective_time on
    the cluster file ``cluster_yaml``, as a plan would price them."""
    import numpy as np

    from planner.costs.comm import Group, collective_time
    from planner.inputs import load_cluster_text

    cluster = load_cluster_text(cluster_yaml)
    by: dict[int, list[float]] = {}
    for r in rows:
        t, _ = collective_time(r.op, float(r.nbytes), Group(r.ranks, r.ranks // r.nodes),
                               cluster)
        by.setdefault(r.ranks, []).append(abs(t - r.seconds) / r.seconds * 100)
    return {p: float(np.mean(e)) for p, e in by.items()}


@pytest.mark.parametrize("algorithm", ["auto", "ring"])
def test_the_printed_error_is_what_the_written_cluster_prices(runner, tmp_path, algorithm):
    """Found by an audit: the fit printed 0.6% for 16 ranks on 2 nodes, the ring's error,
    while the cluster it wrote (``algorithm: auto``, the default) priced the same rows
    with NCCL's tree at 21%. The fit is now judged, and across nodes made, as the written
    cluster prices collectives: a plan on the written file is off by what it prints. A
    cluster that names the ring gets the ring's fit, the fixtures' 7.5 µs (their runs
    across nodes follow a ring alone, which a note says under auto)."""
    text = (CLUSTERS / "dgx-h100.yaml").read_text().replace(
        "algorithm: auto", f"algorithm: {algorithm}")
    cluster = tmp_path / "c.yaml"
    cluster.write_text(text)
    out = tmp_path / "fitted.yaml"
    r = invoke(runner, "comm", "fit", *FIXTURES, "--cluster", cluster, "-o", out)
    assert r.exit_code == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert f"(collectives: {{algorithm: {algorithm}}}, as a plan prices them)" in said
    assert ("follow a ring alone" in said) == (algorithm == "auto")
    (fit,) = fit_all(read_samples(FIXTURES), algorithm)
    printed = {e.ranks: e.mape for e in fit.errors if e.op == "all_reduce"}
    rows = [s for s in read_samples(FIXTURES) if s.op == "all_reduce"]
    priced = _priced_mape(out.read_text(), rows)
    # the written file rounds α and bandwidth to 4 significant digits: 0.05 points
    assert priced == pytest.approx(printed, abs=0.05)
    from planner.units import parse_quantity

    latency = parse_quantity(yaml.safe_load(out.read_text())["network"]["inter_node"]
                             ["latency"], "time")
    if algorithm == "ring":
        assert printed[16] < 2.0 and latency == pytest.approx(7.5e-6, rel=0.05)
    else:
        # the tree prices the ring's small messages faster than measured, which the
        # refit trades against the large ones by raising α
        assert 2.0 < printed[16] < 25.0 and latency > 9e-6


def test_the_refit_across_nodes_prices_deepbench_no_worse_than_the_ring_fit():
    """DeepBench's runs across nodes, priced as a plan prices them (``auto``): refitted
    for that choice they are closer than with the ring's α and bandwidth, which auto
    prices with NCCL's tree where it is faster (M40: 16.4% at 32 ranks, now 11.3%)."""
    from dataclasses import replace

    from planner.commfit import fit_ring_net, fit_system, predict

    rows = [s for s in read_samples([DEEPBENCH]) if s.system == "Tesla M40"]
    fit = fit_system("Tesla M40", rows)
    multi = [r for r in rows if r.nodes > 1]
    ring = replace(fit, inter=fit_ring_net(multi, fit.intra))

    def sse(f):
        return sum(((predict(f, r) - r.seconds) / r.seconds) ** 2 for r in multi)

    assert sse(fit) < 0.7 * sse(ring)
    errors = {e.ranks: e.mape for e in fit.errors}
    assert errors[16] == pytest.approx(10.4, abs=0.05)
    assert errors[32] == pytest.approx(11.3, abs=0.05)


def _errors(fits):
    return {(f.system, e.ranks): e.mape for f in fits for e in f.errors}


def test_deepbench_single_node_errors():
    """Issue 4: single-node DeepBench all-reduce within 8% per (GPU, rank count)."""
    fits = {f.system: f for f in fit_all(read_samples([DEEPBENCH]))}
    errs = _errors(fits.values())
    for system in ("Tesla M40", "GeForce GTX TITAN X (Maxwell)", "Tesla P100",
                   "GeForce GTX 1080 Ti", "TITAN X (Pascal)"):
        for p in (2, 4, 8):
            assert errs[(system, p)] <= 8.0, (system, p)
    # the "NVIDIA 8 GPU System" (M40, TITAN X Maxwell, P100) needs one bandwidth; on the
    # "10 GPU System" (1080 Ti, TITAN X Pascal) bus bandwidth falls from about 12 GB/s
    # (2 GPUs behind one PLX switch) to about 9 GB/s (8 GPUs across switches), and the
    # fit keeps a bandwidth per group size
    assert fits["Tesla P100"].intra.by_group == ()
    table = dict(fits["GeForce GTX 1080 Ti"].intra.by_group)
    assert set(table) == {2, 4, 8}
    assert table[2] > 1.25 * table[8]


def test_bandwidth_by_group_in_cluster_files():
    from planner.costs.comm import Group, collective_time
    from planner.inputs import load_cluster_text

    cl = load_cluster_text("""
kind: cluster
nodes: 1
devices_per_node: 8
device: P100-PCIe
network:
  intra_node:
    latency: 6 us
    bandwidth: 9 GB/s
    bandwidth_by_group: {2: 12 GB/s, 4: 11 GB/s, 8: 9 GB/s}
""")
    assert [cl.intra.bandwidth_for(p) for p in (2, 3, 4, 6, 8, 16)] == [
        12e9, 11e9, 11e9, 9e9, 9e9, 9e9]
    t2, _ = collective_time("all_reduce", 1e8, Group(2, 2), cl, "ring")
    assert t2 == pytest.approx(2 * 6e-6 + 2 * 0.5 * 1e8 / 12e9, rel=1e-12)


def test_bandwidth_by_group_bad_key():
    from planner.errors import InputError
    from planner.inputs import load_cluster_text

    with pytest.raises(InputError, match="expected a group size"):
        load_cluster_text("kind: cluster\nnodes: 1\ndevices_per_node: 8\ndevice: T4\n"
                          "network:\n  intra_node: {latency: 6 us, bandwidth: 9 GB/s, "
                          "bandwidth_by_group: {two: 12 GB/s}}\n")



def test_bandwidth_by_group_keys_are_bounded_by_the_node_and_quoted_as_written():
    """A group larger than the node, a boolean key (`true`, or YAML 1.1's `on`), each
    located and quoted as the file spells it (the message said 'True' before)."""
    from planner.errors import InputError
    from planner.inputs import load_cluster_text

    with pytest.raises(InputError) as exc:
        load_cluster_text("kind: cluster\nnodes: 1\ndevices_per_node: 8\ndevice: T4\n"
                          "network:\n  intra_node:\n    latency: 6 us\n    bandwidth: 9 GB/s\n"
                          "    bandwidth_by_group: {2: 12 GB/s, 16: 9 GB/s, true: 3 GB/s, "
                          "on: 2 GB/s}\n")
    text = str(exc.value)
    assert ("<cluster>:9:42: error: a group of 16 devices is larger than a node "
            "(devices_per_node: 8)") in text
    assert "<cluster>:9:56: error: expected a group size (an integer ≥ 2) as the key, " \
           "got 'true'" in text
    assert "9:68: error: expected a group size (an integer ≥ 2) as the key, got 'on'" in text
    assert "True" not in text


def test_the_inter_node_tier_refuses_what_only_the_intra_node_tier_reads():
    """`nvls` and `bandwidth_by_group` on inter_node were accepted and never read (the
    collective models look them up on the intra-node tier only)."""
    from planner.errors import InputError
    from planner.inputs import load_cluster_text

    with pytest.raises(InputError) as exc:
        load_cluster_text("kind: cluster\nnodes: 2\ndevices_per_node: 8\ndevice: H100-SXM\n"
                          "network:\n  intra_node: {latency: 3 us, bandwidth: 350 GB/s}\n"
                          "  inter_node:\n    latency: 6 us\n    bandwidth: 40 GB/s\n"
                          "    nvls: {algbw: 261.4 GB/s}\n"
                          "    bandwidth_by_group: {2: 12 GB/s}\n")
    text = str(exc.value)
    assert "<cluster>:10:11: error: 'nvls' (NVSwitch in-switch reduction inside a node) " \
           "belongs to the intra_node tier; the inter_node tier does not read it" in text
    assert "<cluster>:11:25: error: 'bandwidth_by_group'" in text
    assert text.count(": error: ") == 2

def test_h200_nvls_is_modelled_from_the_note_column():
    (fit,) = fit_all(read_samples([H200]))
    assert fit.nvls is not None and fit.nvls.min_bytes == 2 * 2**20
    # in-switch reduction beats the ring on the sweep's 8 ranks: its algorithm bandwidth
    # over the ring's, 351 GB/s · 8 / 14
    assert fit.nvls.bandwidth > fit.intra.bandwidth * 8 / 14
    assert fit.errors[0].mape <= 12.0  # issue 4's threshold for the 8×H200 sweep


def test_comm_fit_writes_a_network_section(runner):
    r = invoke(runner, "comm", "fit", H200)
    assert r.exit_code == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    intra = doc["network"]["intra_node"]
    assert set(intra["nvls"]) == {"algbw", "latency", "min_bytes"}
    assert intra["nvls"]["min_bytes"] == "2 MiB"
    assert "planner's error with the fitted tiers" in r.stderr
    data = {"devices_per_node": 8, "nodes": 1, "device": "H200", **doc}
    assert cluster_from_data(data, []) is not None


def test_comm_fit_writes_a_cluster_with_bandwidths_by_group(runner, tmp_path):
    """A fit with bandwidths by group size (DeepBench's TITAN X Pascal box: 2, 4 and 8
    GPUs each at their own rate) written into a cluster file was an internal error
    (exit 3: the merged section's group sizes are numbers, the check read them as text;
    an audit); it writes the file, which validates and keeps the groups."""
    out = tmp_path / "fitted.yaml"
    r = invoke(runner, "comm", "fit", DEEPBENCH, "--system", "Pascal", "--cluster",
               CLUSTERS / "pcie-8gpu.yaml", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert invoke(runner, "validate", out).exit_code == 0
    # the header is the command that writes the file again (--system and --cluster too)
    assert out.read_text().startswith(
        f"# Fitted by `planner comm fit {DEEPBENCH} --system Pascal --cluster "
        f"{CLUSTERS / 'pcie-8gpu.yaml'}`\n")
    groups = yaml.safe_load(out.read_text())["network"]["intra_node"]["bandwidth_by_group"]
    assert list(groups) == [2, 4, 8]
    assert groups == yaml.safe_load(invoke(runner, "comm", "fit", DEEPBENCH, "--system",
                                           "Pascal").stdout)["network"]["intra_node"][
        "bandwidth_by_group"]


def test_comm_fit_with_cluster_keeps_the_rest_and_never_overwrites(runner, tmp_path):
    src = CLUSTERS / "dgx-h100.yaml"
    out = tmp_path / "fitted.yaml"
    r = invoke(runner, "comm", "fit", *FIXTURES, "--cluster", src, "-o", out)
    assert r.exit_code == 0, r.stderr
    doc = yaml.safe_load(out.read_text())
    orig = yaml.safe_load(src.read_text())
    assert doc["devices_per_node"] == orig["devices_per_node"]
    assert doc["network"]["intra_node"]["name"].startswith("fitted: ")
    assert "nvls" in doc["network"]["intra_node"]
    r = invoke(runner, "validate", out)
    assert r.exit_code == 0, r.stderr
    r = invoke(runner, "comm", "fit", *FIXTURES, "--cluster", src, "-o", src)
    assert r.exit_code == 2 and "refusing to write" in r.stderr


def test_comm_fit_with_cluster_edits_the_tiers_in_place(runner, tmp_path):
    """--cluster replaces the fitted tiers' lines and nothing else: the comments, key
    order and style of the rest survive, a tier the file lacks is added at the end of
    its network section, and a file whose network cannot be edited in place is written
    from its data with a note."""
    src = tmp_path / "mine.yaml"
    src.write_text(
        "# my cluster: keep this\n"
        "kind: cluster\n"
        "name: mine   # trailing comment\n"
        "devices_per_node: 8\n"
        "device: H100-SXM\n"
        "network:\n"
        "  intra_node:\n"
        "    latency: 3 us\n"
        "    bandwidth: 300 GB/s\n"
        "  # about the inter-node tier\n"
        "  inter_node: {latency: 9 us, bandwidth: 400 Gbit/s}   # IB NDR\n"
        "reserved_memory: 1 GiB   # headroom\n")
    one_node = [f for f in FIXTURES if "2x8" not in f.name]
    r = invoke(runner, "comm", "fit", *one_node, "--cluster", src)
    assert r.exit_code == 0, r.stderr
    fitted = yaml.safe_load(invoke(runner, "comm", "fit", *one_node).stdout)["network"]
    assert set(fitted) == {"intra_node"}
    out = r.stdout.split("\n", 2)[2]  # after the two header comments
    tier = "\n".join("    " + line for line in yaml.safe_dump(
        fitted["intra_node"], sort_keys=False).strip().split("\n"))
    assert out.startswith("# my cluster: keep this\nkind: cluster\nname: mine   # trailing")
    assert "  intra_node:\n" + tier.replace("'", "") in out.replace("'", "")
    assert out.endswith("  # about the inter-node tier\n"
                        "  inter_node: {latency: 9 us, bandwidth: 400 Gbit/s}   # IB NDR\n"
                        "reserved_memory: 1 GiB   # headroom\n")
    assert "note:" not in r.stderr
    # a multi-node fit adds the inter-node tier where the file has none
    src.write_text("kind: cluster  # one\nname: mine\nnodes: 1\ndevices_per_node: 8\n"
                   "device: H100-SXM\nnetwork:\n  intra_node: {latency: 3 us, "
                   "bandwidth: 300 GB/s}  # two\n# three\n")
    r = invoke(runner, "comm", "fit", NCCL / "all_reduce_perf_2x8xh100.txt",
               NCCL / "all_reduce_perf_8xh100.txt", "--cluster", src)
    assert r.exit_code == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    assert set(doc["network"]) == {"intra_node", "inter_node"}
    assert "kind: cluster  # one\n" in r.stdout and r.stdout.endswith("\n# three\n")
    # flow-style network: written from its data, and said so
    src.write_text("kind: cluster\nname: mine  # gone\nnodes: 1\ndevices_per_node: 8\n"
                   "device: H100-SXM\nnetwork: {intra_node: {latency: 3 us, "
                   "bandwidth: 300 GB/s}}\n")
    r = invoke(runner, "comm", "fit", *FIXTURES, "--cluster", src)
    assert r.exit_code == 0, r.stderr
    assert "its comments are not kept" in r.stderr and "# gone" not in r.stdout
    assert yaml.safe_load(r.stdout)["network"]["intra_node"]["name"].startswith("fitted: ")


def test_comm_fit_cluster_edit_keeps_line_ends_indent_and_unseen_nvls(runner, tmp_path):
    """CRLF files stay CRLF; a 4-space file gets 4-space tiers; a comment on a replaced
    line goes with it; an nvls section the fit could not see (all-gather data only) is
    kept; fitting the output again does not stack headers; file names cannot inject
    YAML lines through the header comment."""
    src = tmp_path / "four.yaml"
    src.write_bytes(b"kind: cluster\r\nname: four\r\nnodes: 2\r\ndevices_per_node: 8\r\n"
                    b"device: H100-SXM\r\nnetwork:\r\n    intra_node:\r\n"
                    b"        latency: 3 us\r\n        bandwidth: 300 GB/s   # c1\r\n"
                    b"        nvls: {algbw: 230 GB/s, latency: 20 us, min_bytes: 1 MiB}"
                    b"\r\n    inter_node: {latency: 9 us, bandwidth: 50 GB/s}  # c2\r\n"
                    b"# end\r\n")
    out = tmp_path / "out.yaml"
    gather = NCCL / "all_gather_perf_8xh100.txt"
    r = invoke(runner, "comm", "fit", gather, "--cluster", src, "-o", out)
    assert r.exit_code == 0, r.stderr
    raw = out.read_bytes()
    assert raw.count(b"\n") == raw.count(b"\r\n") > 10
    text = raw.decode().replace("\r\n", "\n")
    assert "    intra_node:\n        name: 'fitted: NVIDIA H100 80GB HBM3'\n" in text
    assert "        nvls:\n            algbw: 230 GB/s\n" in text  # kept: not seen
    assert "# c1" not in text and "  # c2\n# end\n" in text
    assert yaml.safe_load(text)["network"]["inter_node"] == {"latency": "9 us",
                                                             "bandwidth": "50 GB/s"}
    again = tmp_path / "again.yaml"
    r = invoke(runner, "comm", "fit", *FIXTURES, "--cluster", out, "-o", again)
    assert r.exit_code == 0, r.stderr
    text = again.read_text()
    assert text.count("# Fitted by") == 1 and text.count("# from ") == 1
    assert yaml.safe_load(text)["network"]["intra_node"]["nvls"]["algbw"] != "230 GB/s"
    sneaky = tmp_path / "x\ndescription: pwned\n#.txt"
    sneaky.write_bytes(gather.read_bytes())
    r = invoke(runner, "comm", "fit", sneaky, "--cluster", src)
    assert r.exit_code == 0, r.stderr
    assert "description" not in yaml.safe_load(r.stdout.replace("\r\n", "\n"))


def test_comm_fit_refuses_what_it_cannot_do(runner, tmp_path):
    lone = tmp_path / "one.txt"
    lone.write_text("".join(line for line in (NCCL / "all_reduce_perf_8xh100.txt")
                            .read_text().splitlines(keepends=True)
                            if not re.match(r"#\s+Rank\s+[1-7] ", line)))
    r = invoke(runner, "comm", "fit", lone)
    assert r.exit_code == 2
    assert "nothing to fit for 'NVIDIA H100 80GB HBM3'" in r.stderr
    r = invoke(runner, "comm", "fit", *FIXTURES, "--format", "json", "--cluster",
               CLUSTERS / "dgx-h100.yaml")
    assert r.exit_code == 2 and "--format json is the fit report" in r.stderr
    report = tmp_path / "fit.json"  # the suffix picks the format
    r = invoke(runner, "comm", "fit", *FIXTURES, "-o", report)
    assert r.exit_code == 0 and json.loads(report.read_text())["systems"]


def test_comm_fit_whole_system_name_wins_over_substrings(runner, tmp_path):
    text = (NCCL / "all_reduce_perf_8xh100.txt").read_text()
    files = []
    for name in ("NVIDIA H100", "NVIDIA H100 NVL"):
        path = tmp_path / f"{len(files)}.txt"
        path.write_text(text.replace("NVIDIA H100 80GB HBM3", name))
        files.append(path)
    r = invoke(runner, "comm", "fit", *files, "--system", "nvidia h100", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert [s["system"] for s in json.loads(r.stdout)["systems"]] == ["NVIDIA H100"]
    r = invoke(runner, "comm", "fit", *files, "--system", "H100")
    assert r.exit_code == 2 and "matches 2 systems" in r.stderr


def test_comm_fit_several_systems_needs_a_choice_for_a_cluster(runner, tmp_path):
    r = invoke(runner, "comm", "fit", DEEPBENCH, "--cluster", CLUSTERS / "pcie-8gpu.yaml")
    assert r.exit_code == 2 and "choose one with --system" in r.stderr
    # refused before the fit's report, not after fifty lines of it (2026-12-07 audit)
    assert r.stderr.startswith("planner: error: the files hold several systems"), r.stderr
    r = invoke(runner, "comm", "fit", DEEPBENCH, "--system", "P100", "--cluster",
               CLUSTERS / "pcie-8gpu.yaml")
    assert r.exit_code == 0, r.stderr
    assert "Tesla P100" in r.stdout
    r = invoke(runner, "comm", "fit", DEEPBENCH, "--format", "json")
    assert r.exit_code == 0
    systems = json.loads(r.stdout)["systems"]
    assert len(systems) == 5 and all(s["errors"] for s in systems)


def test_comm_fit_cluster_may_lack_the_tier_the_fit_supplies(runner, tmp_path):
    """A two-node cluster without its inter-node tier yet is what a user calibrating
    their own cluster writes first: the merged cluster is valid, so it is accepted. An
    error the fit does not repair is still reported at its line of the user's file, and
    an empty file is asked to be a cluster (not a network)."""
    two = tmp_path / "two.yaml"
    text = ("kind: cluster\nname: two\nnodes: 2\ndevices_per_node: 8\ndevice: H100-SXM\n"
            "network:\n  intra_node: {latency: 3 us, bandwidth: 300 GB/s}\n")
    two.write_text(text)
    out = tmp_path / "fitted.yaml"
    multi = NCCL / "all_reduce_perf_2x8xh100.txt"
    r = invoke(runner, "comm", "fit", multi, "--cluster", two, "-o", out)
    assert r.exit_code == 0, r.stderr
    fitted = yaml.safe_load(out.read_text())
    assert fitted["network"]["intra_node"] == {"latency": "3 us", "bandwidth": "300 GB/s"}
    assert fitted["network"]["inter_node"]["name"] == "fitted: NVIDIA H100 80GB HBM3"
    assert invoke(runner, "validate", out).exit_code == 0
    assert two.read_text() == text  # the input is never touched
    two.write_text(text.replace("nodes: 2\n", "nodes: 2\nbogus: 1\n"))
    r = invoke(runner, "comm", "fit", multi, "--cluster", two)
    assert r.exit_code == 2 and f"{two}:4:1: error: unknown key 'bogus'" in r.stderr
    # a single-node sweep fits the intra-node tier only: the gap stays, and is the error
    two.write_text(text)
    r = invoke(runner, "comm", "fit", NCCL / "all_reduce_perf_8xh100.txt", "--cluster", two)
    assert r.exit_code == 2 and "missing required key 'inter_node'" in r.stderr
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    r = invoke(runner, "comm", "fit", multi, "--cluster", empty)
    assert r.exit_code == 2
    assert f"{empty}: error: the file is empty: expected a YAML mapping with " \
           "'kind: cluster'" in r.stderr


def test_comm_fit_bad_csv(runner, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("gpu,bytes,n_gpus,n_nodes,mean_time_ms\nX,1000,8,1,fast\n")
    r = invoke(runner, "comm", "fit", bad)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{bad}:2:12: error: expected a time between 0.5 µs (no "
                               "collective is faster) and 1 day (milliseconds) in column "
                               "'mean_time_ms', got 'fast'")
    # not-a-number, infinite and overflowing values name their row and cell too (they
    # used to reach the fit: an internal error, or a fit with MAPE nan; then each was
    # one message at column 1 for the whole row: found by an audit)
    for row, column, name in (("X,1000,8,1,nan", 12, "mean_time_ms"),
                              ("X,1000,8,1,inf", 12, "mean_time_ms"),
                              ("X,1e400,8,1,0.5", 3, "bytes"),
                              ("X,1000,inf,1,0.5", 8, "n_gpus"),
                              ("X,2000,8,1,1e-300", 12, "mean_time_ms"),
                              ("X,2000,8,9,0.5", 10, "n_nodes"),
                              # found by another audit: 1e23 ranks fitted a latency of 0 us;
                              # an empty rank count was two errors, the second about the
                              # nodes; an empty system name had no line
                              ("X,2000,99999999999999999999999,1,0.5", 8, "n_gpus"),
                              ("X,2000,,1,0.5", 8, "n_gpus"),
                              (",2000,8,1,0.5", 1, "gpu")):
        bad.write_text(f"gpu,bytes,n_gpus,n_nodes,mean_time_ms\nX,1000,8,1,0.5\n{row}\n")
        r = invoke(runner, "comm", "fit", bad)
        assert r.exit_code == 2 and r.stderr.startswith(f"{bad}:3:{column}: error: expected "
                                                        ), (row, r.stderr)
        assert f"in column '{name}'" in r.stderr.splitlines()[0], (row, r.stderr)
        assert r.stderr.count("error:") == 1, r.stderr


@pytest.mark.parametrize("example, data, system", [
    ("dgx-h100.yaml", H200, None),
    ("pcie-8gpu.yaml", DEEPBENCH, "Tesla P100"),
])
def test_example_clusters_carry_the_fitted_tiers(example, data, system):
    """The shipped example clusters say their intra-node tier is fitted to measured data:
    hold them to it (4 significant figures, as `planner comm fit` prints them)."""
    from planner.inputs import load_cluster

    fits = {f.system: f for f in fit_all(read_samples([data]))}
    fit = fits[system] if system else next(iter(fits.values()))
    intra = load_cluster(CLUSTERS / example).intra
    assert intra.latency_s == pytest.approx(fit.intra.latency_s, rel=5e-4)
    assert intra.bandwidth == pytest.approx(fit.intra.bandwidth, rel=5e-4)
    if fit.nvls is not None:
        assert intra.nvls_algbw == pytest.approx(fit.nvls.bandwidth, rel=5e-4)
        assert intra.nvls_latency_s == pytest.approx(fit.nvls.latency_s, rel=5e-4)
        assert intra.nvls_min_bytes == fit.nvls.min_bytes


@pytest.mark.parametrize("example, data, system, bound", [
    ("dgx-h100.yaml", H200, None, {8: 12.0}),
    ("pcie-8gpu.yaml", DEEPBENCH, "Tesla P100", {2: 8.0, 4: 8.0, 8: 8.0}),
])
def test_plans_price_all_reduce_as_measured(example, data, system, bound):
    """What a plan charges for a one-node all-reduce (the cluster's ``auto``, the path
    every plan takes) is within issue 4's thresholds of the measurements the tier was
    fitted to, per rank count: 8% for DeepBench, 12% for the 8×H200 sweep. (``auto``
    used to take Rabenseifner's all-reduce, which NCCL does not run: 26.8% off the H200
    sweep, 2.3× too fast below 1 MiB.)"""
    from planner.costs.comm import Group, collective_time
    from planner.inputs import load_cluster

    cl = load_cluster(CLUSTERS / example)
    errors: dict[int, list[float]] = {}
    for s in read_samples([data]):
        if (system and s.system != system) or s.nodes != 1 or s.op != "all_reduce":
            continue
        t, _ = collective_time("all_reduce", float(s.nbytes), Group(s.ranks, s.ranks), cl)
        errors.setdefault(s.ranks, []).append(abs(t - s.seconds) / s.seconds)
    assert sorted(errors) == sorted(bound)
    for ranks, errs in errors.items():
        assert 100 * sum(errs) / len(errs) <= bound[ranks], ranks


def test_comm_fit_says_why_it_cannot_fit(runner, tmp_path):
    """Measurements a ring cannot be fitted to are an error that says why, exit 2: one
    message size only (it used to blame the rank counts), or times that fall as the
    messages grow (it wrote 'bandwidth: inf GB/s', which no cluster file accepts)."""
    head = "gpu,bytes,n_gpus,n_nodes,mean_time_ms\n"
    one = tmp_path / "one.csv"
    one.write_text(head + "".join(f"X,400000,{r},1,0.1\n" for r in (2, 4, 8)))
    r = invoke(runner, "comm", "fit", one)
    assert r.exit_code == 2
    assert "over more than one rank at two message sizes or more" in r.stderr
    falling = tmp_path / "falling.csv"
    falling.write_text(head + "X,400000,8,1,0.2\nX,800000,8,1,0.1\n")
    out = tmp_path / "net.yaml"
    for extra in ((), ("-o", out), ("--cluster", CLUSTERS / "pcie-8gpu.yaml", "-o", out)):
        r = invoke(runner, "comm", "fit", falling, *extra)
        assert r.exit_code == 2, extra
        assert "no bandwidth fits the intra tier of 'X'" in r.stderr, r.stderr
        assert not out.exists()


def test_other_collectives_are_refused_and_wrong_rows_noted(runner, tmp_path):
    """broadcast_perf (or alltoall_perf) output fitted as an all-reduce, from its byte
    counts, and a CSV row of another op was read as all_reduce: both are input errors
    now, at the line (and for the CSV, the column) that says so. A row nccl-tests
    marked with wrong results is left out with a note; a bad number is located at its
    column."""
    text = FIXTURES[0].read_text()
    renamed = tmp_path / "broadcast_perf_8xh100.txt"
    renamed.write_text(text.replace("all_reduce_perf", "broadcast_perf"))
    r = invoke(runner, "comm", "fit", renamed)
    assert r.exit_code == 2 and "broadcast_perf is a collective planner does not model" \
        in r.stderr, r.stderr
    told = tmp_path / "x.txt"
    told.write_text("# Collective test starting: alltoall_perf\n" + text)
    r = invoke(runner, "comm", "fit", told)
    assert r.exit_code == 2 and r.stderr.startswith(
        f"{told}:1:1: error: alltoall_perf is a collective planner does not model"), r.stderr
    lines = H200.read_text().splitlines()
    lines[0] += ",op"
    lines[1:] = [ln + ",all_reduce" for ln in lines[1:]]
    lines[3] = lines[3][:-len("all_reduce")] + "broadcast"
    csv_file = tmp_path / "h200.csv"
    csv_file.write_text("\n".join(lines) + "\n")
    r = invoke(runner, "comm", "fit", csv_file)
    col = len(lines[3]) - len("broadcast") + 1
    assert r.exit_code == 2 and r.stderr.startswith(
        f"{csv_file}:4:{col}: error: op 'broadcast' is a collective planner does not model")
    rows = FIXTURES[0].read_text().splitlines()
    data = [i for i, ln in enumerate(rows) if ln.strip() and ln.split()[0].isdigit()]
    wrong = rows[data[2]].split()
    assert wrong[8] == "0" and wrong[-1] == "0"  # in-place #wrong, out-of-place #wrong
    rows[data[2]] = rows[data[2]].rstrip()[:-1] + "3"
    marked = tmp_path / "all_reduce_perf.txt"
    marked.write_text("\n".join(rows) + "\n")
    r = invoke(runner, "comm", "fit", marked)
    assert r.exit_code == 0, r.stderr
    assert (f"planner: note: {marked}:{data[2] + 1}: 1 row with wrong results (#wrong not "
            "0) left out of the fit") in r.stderr
    # and in the JSON report, which a file would keep (it went to the terminal only)
    r = invoke(runner, "comm", "fit", marked, "--format", "json")
    assert json.loads(r.stdout)["notes"] == [f"{marked}:{data[2] + 1}: 1 row with wrong "
                                             "results (#wrong not 0) left out of the fit"]
    five = r"^(\s*\S+\s+\S+\s+\S+\s+\S+\s+\S+\s+)"  # size count type redop root
    bad = rows.copy()
    bad[data[0]] = re.sub(five + r"(\S+)", r"\1abc", rows[data[0]])
    marked.write_text("\n".join(bad) + "\n")
    r = invoke(runner, "comm", "fit", marked)
    col = re.match(five, rows[data[0]]).end() + 1
    assert r.exit_code == 2 and r.stderr.startswith(
        f"{marked}:{data[0] + 1}:{col}: error: expected a number in the time column, got "
        "'abc'"), r.stderr


def test_comm_fit_warns_when_the_cluster_is_another_machine(runner, tmp_path):
    """8 ranks measured in one node, fitted into a cluster file of 1-device nodes (Cori's
    KNL): written, with a warning that its intra-node tier is another machine's; into a
    DGX (8 a node), no warning."""
    r = invoke(runner, "comm", "fit", FIXTURES[0], "--cluster", CLUSTERS / "cori-knl.yaml")
    assert r.exit_code == 0
    assert ("planner: warning: the measurements ran 8 ranks in one node; "
            f"{CLUSTERS / 'cori-knl.yaml'} has 1 device a node") in r.stderr
    r = invoke(runner, "comm", "fit", FIXTURES[0], "--cluster", CLUSTERS / "dgx-h100.yaml")
    # no warning of another machine (the all-reduce sweep's latency-bound ring is
    # warned of: test_a_latency_bound_sweep_is_refused_or_warned)
    assert r.exit_code == 0 and "another" not in r.stderr
    assert [ln for ln in r.stderr.splitlines() if "warning" in ln and "latency-bound" not in ln] \
        == []
    # H100s measured, written into a P100 PCIe cluster file: said (it was not; an audit)
    r = invoke(runner, "comm", "fit", FIXTURES[0], "--cluster", CLUSTERS / "pcie-8gpu.yaml")
    assert r.exit_code == 0
    assert ("planner: warning: the measurements ran on H100-SXM (NVIDIA H100 80GB HBM3); "
            f"{CLUSTERS / 'pcie-8gpu.yaml'}'s device is P100-PCIe: its tiers are fitted to "
            "another machine") in r.stderr


def test_a_file_named_twice_is_read_once(runner):
    """The same nccl-tests file given twice (by another path) counted its rows twice;
    it is read once, with a note, and fits as the file alone."""
    again = FIXTURES[0].parent / ".." / FIXTURES[0].parent.name / FIXTURES[0].name
    once = invoke(runner, "comm", "fit", FIXTURES[0])
    twice = invoke(runner, "comm", "fit", FIXTURES[0], again)
    assert twice.exit_code == 0 and twice.stdout.splitlines()[1:] == once.stdout.splitlines()[1:]
    assert f"planner: note: {again} is {FIXTURES[0]}, read once" in twice.stderr
    same = invoke(runner, "comm", "fit", FIXTURES[0], FIXTURES[0])
    assert f"planner: note: {FIXTURES[0]} is named twice, read once" in same.stderr


def test_a_copy_of_a_file_is_read_once(runner, tmp_path):
    """A copy of an nccl-tests log under another name (collected twice from a job's
    directory) counted its rows twice as well: read once, with a note."""
    copy = tmp_path / "copy.log"
    copy.write_bytes(FIXTURES[0].read_bytes())
    once = invoke(runner, "comm", "fit", FIXTURES[0])
    twice = invoke(runner, "comm", "fit", FIXTURES[0], copy)
    assert twice.exit_code == 0 and twice.stdout.splitlines()[1:] == once.stdout.splitlines()[1:]
    assert (f"planner: note: {copy} has the same contents as {FIXTURES[0]}, read once"
            in twice.stderr)


def _ring_sweep(device: str, noise: float, seed: int) -> str:
    """The 8-GPU all-reduce fixture with its times replaced by one ring (α = 2 µs a
    step, 300 GB/s: 14α + 1.75·S / 300 GB/s) times 1 ± ``noise`` (uniform, seeded), on
    ``device``: a sweep NCCL ran without NVLS."""
    import random

    rnd = random.Random(seed)
    out = []
    for line in FIXTURES[0].read_text().splitlines():
        parts = line.split()
        if line.startswith("#  Rank"):
            line = line[:line.index("]") + 2] + device
        elif parts and parts[0].isdigit():
            size = int(parts[0])
            t = (14 * 2e-6 + 1.75 * size / 300e9) * 1e6
            a, b = (t * (1 + noise * (2 * rnd.random() - 1)) for _ in range(2))
            line = (f"{size:12d}  {int(parts[1]):12d}  float  sum  -1  {a:9.2f}  0  0  0  "
                    f"{b:9.2f}  0  0  0")
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("device", ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"])
def test_a_ring_sweep_is_one_ring(tmp_path, device):
    """One ring through an 8-GPU sweep with 0-3% noise: no NVLS section and no refusal
    (found by an audit: 1 in 4 noisy sweeps gave a fake NVLS, or, when the split left
    only latency-bound sizes below it, 'no bandwidth fits'). On an A100, which has no
    NVLS, the split is never tried; on an H100 it needs one ring to miss the sweep by
    more than 2% RMS, a ring below it that shows its bandwidth, and NVLS 10% faster."""
    for seed in range(12):
        f = tmp_path / f"all_reduce_perf_{seed}.txt"
        f.write_text(_ring_sweep(device, 0.03 * (seed % 4) / 3, seed))
        (fit,) = fit_all(read_samples([f]))
        assert fit.nvls is None, seed
        assert fit.intra.bandwidth == pytest.approx(300e9, rel=0.05), seed


def test_what_a_table_alone_cannot_say(tmp_path):
    """nccl-tests output without its 'Collective test starting' line, in a file whose name
    does not say the program (found by an audit: each was fitted as an all-reduce, or a
    good run refused):

    * a rooted or reduction-free table (broadcast_perf: redop none, root 0) is refused
      at its row;
    * a table like all_reduce_perf's is read as one, with a note (sendrecv_perf's looks
      the same);
    * older nccl-tests' ``error`` column holds the largest deviation (1e-06 on a correct
      float sum), not a count of wrong results: the rows are kept;
    * a rank listed twice (mpirun starting nccl-tests built without MPI) is refused."""
    text = FIXTURES[0].read_text()
    bare = "\n".join(ln for ln in text.splitlines() if "Collective test starting" not in ln)
    bcast = tmp_path / "bench.log"
    bcast.write_text(bare.replace("float     sum      -1", "float    none       0"))
    with pytest.raises(InputError) as info:
        read_samples([bcast])
    assert "a collective with a root or no reduction (root 0, redop none" in str(info.value)
    plain = tmp_path / "results.log"
    plain.write_text(bare + "\n")
    notes: list[str] = []
    rows = read_samples([plain], notes)
    assert {r.op for r in rows} == {"all_reduce"} and len(rows) == 11
    assert any("read as all_reduce_perf output from its table" in n for n in notes)
    old = tmp_path / "old_all_reduce_perf.txt"
    lines = []
    for ln in text.splitlines():
        if ln.startswith("#       size"):
            ln = ln.replace("#wrong", " error")
        elif ln.strip()[:1].isdigit():
            toks = ln.split()
            toks[8] = toks[12] = "1e-06"
            ln = "  ".join(toks)
        lines.append(ln)
    old.write_text("\n".join(lines) + "\n")
    notes = []
    assert len(read_samples([old], notes)) == 11 and not notes
    twice = tmp_path / "twice_all_reduce_perf.txt"
    twice.write_text(text.replace("#  Rank  1 Group", "#  Rank  0 Group"))
    with pytest.raises(InputError) as info:
        read_samples([twice])
    assert ":7:1: error: rank 0 is listed twice" in str(info.value)


def test_an_nvls_section_above_the_sweep_is_kept(runner, tmp_path):
    """All-reduces that stop below the cluster's NVLS min_bytes cannot show NVLS: the
    section stays (it was dropped, with a note, for any single-node all-reduce: found by
    an audit); a sweep that reaches it replaces it."""
    src = tmp_path / "c.yaml"
    src.write_text("kind: cluster\nname: c\nnodes: 1\ndevices_per_node: 8\ndevice: H100-SXM\n"
                   "network:\n  intra_node:\n    latency: 3 us\n    bandwidth: 300 GB/s\n"
                   "    nvls: {algbw: 230 GB/s, latency: 20 us, min_bytes: 2 MiB}\n")
    small = tmp_path / "small_all_reduce_perf.txt"
    small.write_text("\n".join(ln for ln in FIXTURES[0].read_text().splitlines()
                               if not ln.strip()[:1].isdigit() or int(ln.split()[0]) < 2**20)
                     + "\n")
    r = invoke(runner, "comm", "fit", small, "--cluster", src)
    assert r.exit_code == 0, r.stderr
    assert yaml.safe_load(r.stdout)["network"]["intra_node"]["nvls"]["algbw"] == "230 GB/s"
    assert "dropped" not in r.stderr
    # two ranks, however large: NVLS cannot beat the ring there, so it cannot show
    two = tmp_path / "two_all_reduce_perf.txt"
    two.write_text("\n".join(ln for ln in FIXTURES[0].read_text().splitlines()
                             if not re.match(r"#  Rank  [2-7] ", ln)) + "\n")
    assert {r.ranks for r in read_samples([two])} == {2}
    r = invoke(runner, "comm", "fit", two, "--cluster", src)
    assert r.exit_code == 0, r.stderr
    assert yaml.safe_load(r.stdout)["network"]["intra_node"]["nvls"]["algbw"] == "230 GB/s"
    r = invoke(runner, "comm", "fit", FIXTURES[0], "--cluster", src)
    assert yaml.safe_load(r.stdout)["network"]["intra_node"]["nvls"]["algbw"] != "230 GB/s"


def test_what_the_fit_cannot_see_is_said(runner, tmp_path):
    """Notes, on stderr and in the JSON report: files of one GPU name that measured the
    same collectives far apart (two machines read as one system), and multi-node runs
    without a single-node one (the steps inside the nodes charged to the network).
    Slurm's `srun -l` labels ('0: ') are read past, as mpirun's are (found by an audit:
    the first two were silent, the labels 'no nccl-tests result table')."""
    slow = tmp_path / "b_all_reduce_perf.txt"
    slow.write_text(_ring_sweep("NVIDIA H100 80GB HBM3", 0.0, 0).replace(
        "node-a", "node-z"))
    fast = tmp_path / "a_all_reduce_perf.txt"
    text = _ring_sweep("NVIDIA H100 80GB HBM3", 0.0, 0)
    fast.write_text("\n".join(
        (f"{ln.split()[0]:>12}  " + "  ".join(ln.split()[1:5]) + f"  "
         f"{float(ln.split()[5]) / 2:.2f}  0  0  0  {float(ln.split()[9]) / 2:.2f}  0  0  0")
        if ln.strip()[:1].isdigit() else ln for ln in text.splitlines()) + "\n")
    r = invoke(runner, "comm", "fit", fast, slow, "--format", "json")
    assert r.exit_code == 0, r.stderr
    (system,) = json.loads(r.stdout)["systems"]
    assert any("measured the same collectives 2x apart (median over 11 sizes)" in n
               for n in system["notes"])
    assert "two machines with one GPU model?" in r.stderr
    r = invoke(runner, "comm", "fit", FIXTURES[3], "--format", "json")
    (system,) = json.loads(r.stdout)["systems"]
    assert any("no single-node run" in n for n in system["notes"])
    labelled = tmp_path / "srun_all_reduce_perf.txt"
    labelled.write_text("".join(f"0: {ln}\n" for ln in FIXTURES[0].read_text().splitlines()))
    assert len(read_samples([labelled])) == len(read_samples([FIXTURES[0]]))


def test_a_run_that_died_before_its_table_is_left_out():
    """A log where a run printed its header and ranks, died, and a rerun was appended
    (`>> log`): the dead run is left out with a note and the rerun read; before, the two
    read as one run, its rank lines twice (found by a review)."""
    text = FIXTURES[0].read_text().splitlines()
    dead = "\n".join([*text[:16], "node-a: Test NCCL failure common.cu:123 'unhandled "
                      "system error'", *text]) + "\n"
    notes: list[str] = []
    rows = parse_nccl_tests(dead, "log.txt", notes)
    assert len(rows) == 11 and {r.ranks for r in rows} == {8}
    assert notes == ["log.txt:1: a run with no result table (it failed before one?) left out"]


def _cut(rows: int) -> str:
    """The 8-GPU all-reduce fixture with only its first ``rows`` sizes, as a run cut short
    leaves it."""
    lines = FIXTURES[0].read_text().splitlines()
    table = [i for i, ln in enumerate(lines) if ln.split() and ln.split()[0].isdigit()]
    return "\n".join(lines[:table[0] + rows]) + "\n"


def test_a_latency_bound_sweep_is_refused_or_warned(runner, tmp_path):
    """A sweep cut after 1, 4 and 16 KiB is latency-bound at every size (the bytes take
    0% of a row's fitted time), and its ring bandwidth came out 7.9e15 GB/s with exit 0
    (an audit, 2026-12-07): refused where the bandwidth is beyond what a cluster file
    takes, else a warning. The whole single-node all-reduce sweep is the warned kind:
    NCCL runs it as NVLS from 1 MiB, leaving the ring 5 rows of 256 KiB or less."""
    short = tmp_path / "short.txt"
    short.write_text(_cut(3))
    r = invoke(runner, "comm", "fit", short)
    assert r.exit_code == 2, r.output
    assert "is latency-bound at every size measured (the bytes take at most 0% of a row's " \
           "fitted time), so its bandwidth is not determined" in r.stderr
    r = invoke(runner, "comm", "fit", FIXTURES[0])
    assert r.exit_code == 0 and "planner: warning: the intra tier of" in r.stderr
    assert "all_gather_perf or reduce_scatter_perf, whose rings it keeps" in r.stderr
    r = invoke(runner, "comm", "fit", *FIXTURES)  # the rings of all_gather / reduce_scatter
    assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr


def test_a_latency_bound_tier_is_noted_in_the_report_and_marked_in_the_yaml(runner,
                                                                            tmp_path):
    """The warned latency-bound tier was said on standard error only (an audit): the JSON
    report has it among the system's notes, and the YAML written (a network section, one
    of several systems', a cluster file) a comment above the tier saying its bandwidth is
    not determined, which a fit of the file again replaces, and a fit that determines it
    drops. The data written are the same."""
    r = invoke(runner, "comm", "fit", FIXTURES[0], "--format", "json")
    assert r.exit_code == 0, r.stderr
    (system,) = json.loads(r.stdout)["systems"]
    warning = next(ln for ln in r.stderr.splitlines() if ln.startswith("planner: warning:"))
    assert "the intra tier of" in warning and "is latency-bound" in warning
    assert system["notes"] == [warning.removeprefix("planner: warning: ")]
    share = re.search(r"at most (\d+)% of a row's fitted time", warning).group(1)
    mark = ("# intra_node bandwidth not determined: every size measured was latency-bound "
            f"(the bytes take at most {share}% of a row's fitted time)")

    def marked(text: str, indent: str) -> list[int]:
        lines = text.splitlines()
        at = [i for i, ln in enumerate(lines) if ln == indent + mark]
        assert all(lines[i + 1] == indent + "intra_node:" for i in at), text
        return at

    r = invoke(runner, "comm", "fit", FIXTURES[0])
    assert r.exit_code == 0, r.stderr
    assert len(marked(r.stdout, "  ")) == 1
    assert yaml.safe_load(r.stdout)["network"] == system["network"]
    r = invoke(runner, "comm", "fit", FIXTURES[0], DEEPBENCH)
    assert r.exit_code == 0, r.stderr
    assert len(marked(r.stdout, "      ")) == 1  # systems: NAME: network:
    assert r.stdout.count("not determined") == 1  # DeepBench's boxes measured bandwidth
    out = tmp_path / "dgx.yaml"
    r = invoke(runner, "comm", "fit", FIXTURES[0], "--cluster", CLUSTERS / "dgx-h100.yaml",
               "-o", out)
    assert r.exit_code == 0, r.stderr
    text = out.read_text()
    assert len(marked(text, "  ")) == 1
    assert yaml.safe_load(text)["network"]["intra_node"] == system["network"]["intra_node"]
    again = tmp_path / "again.yaml"
    r = invoke(runner, "comm", "fit", FIXTURES[0], "--cluster", out, "-o", again)
    assert r.exit_code == 0, r.stderr
    assert len(marked(again.read_text(), "  ")) == 1
    # all three collectives: the rings of all_gather / reduce_scatter determine it
    fixed = tmp_path / "fixed.yaml"
    r = invoke(runner, "comm", "fit", *FIXTURES[:3], "--cluster", out, "-o", fixed)
    assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr
    assert "not determined" not in fixed.read_text()
    r = invoke(runner, "comm", "fit", *FIXTURES[:3], "--format", "json")
    assert json.loads(r.stdout)["systems"][0]["notes"] == []


def test_a_mark_keeps_the_line_ends_and_never_changes_the_data():
    """The comment goes above the tier's key in the text's own line ends; where the key
    does not start its line (a flow-style section) above the nearest one that does, else
    at the top: never inside a flow mapping."""
    from planner.commfit import _comment_above

    mark = [(("network", "intra_node"), "intra_node bandwidth not determined (x)")]
    for nl in ("\n", "\r\n", "\r"):
        text = nl.join(["kind: cluster", "network:", "  intra_node:", "    latency: 1 us", ""])
        assert _comment_above(text, mark) == nl.join(
            ["kind: cluster", "network:", "  # intra_node bandwidth not determined (x)",
             "  intra_node:", "    latency: 1 us", ""])
    flow = "kind: cluster\nnetwork: {intra_node: {latency: 1 us}}\n"
    assert _comment_above(flow, mark) == \
        "kind: cluster\n# intra_node bandwidth not determined (x)\n" + flow.split("\n", 1)[1]
    top = "{network: {intra_node: {latency: 1 us}}}\n"
    assert _comment_above(top, mark) == "# intra_node bandwidth not determined (x)\n" + top


def test_nccl_output_with_a_comma_on_its_first_line(runner, tmp_path):
    """OpenMPI's `--tag-output` (`[1,0]<stdout>:` before every line) and a pasted launch
    command naming hosts (`-H a:8,b:8`) put a comma on the first line, which made the
    file read as a CSV ("unrecognised collective CSV header"; an audit, 2026-12-07):
    both fit as the plain output does."""
    plain = invoke(runner, "comm", "fit", FIXTURES[2] if len(FIXTURES) > 2 else FIXTURES[0])
    text = (FIXTURES[2] if len(FIXTURES) > 2 else FIXTURES[0]).read_text()
    tagged = tmp_path / "tagged.txt"
    tagged.write_text("".join(f"[1,0]<stdout>:{ln}\n" for ln in text.splitlines()))
    pasted = tmp_path / "pasted.txt"
    pasted.write_text("$ mpirun -np 8 -H node-a:8,node-b:8 ./build/all_reduce_perf -b 1K "
                      "-e 1G -f 4\n" + text)
    for f in (tagged, pasted):
        r = invoke(runner, "comm", "fit", f)
        assert r.exit_code == 0, r.output
        assert r.stdout.splitlines()[1:] == plain.stdout.splitlines()[1:]
