"""Cluster descriptions and the device catalog.

A cluster file::

    kind: cluster
    name: dgx-h100
    nodes: 128                   # optional: without it, as many nodes as --gpus needs
    devices_per_node: 8
    device: H100-SXM             # a catalog name, or a mapping of specs (see below)
    network:
      intra_node: {latency: "3.4 us", bandwidth: "450 GB/s"}    # per device, one way
      inter_node: {latency: "9.6 us", bandwidth: "400 Gbit/s"}  # per device (its NIC)
    collectives: {algorithm: auto}     # auto | ring | tree | recursive | hierarchical
                                       # library: nccl | mpi (default: nccl on GPUs)
    reserved_memory: "1 GiB"           # per device, not available to the model

An inline device is a mapping with ``peak_flops`` (per dtype), ``memory``,
``memory_bandwidth``, ``sm_count`` and ``l2_cache``; with ``base: NAME`` it starts from
a catalog entry and overrides what it gives.
"""

from __future__ import annotations

import difflib
import functools
import importlib.resources
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .errors import Issue, ModelDataError
from .fields import Fields, Invalid, choice, integer, number, quantity, show, string
from .loading import child_path, parse_text
from .units import Kind, format_si

PEAK_KEYS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
ALGORITHMS = ("auto", "ring", "tree", "recursive", "hierarchical")
#: Collective libraries: which algorithms ``auto`` chooses from (see planner.costs.comm)
LIBRARIES = ("nccl", "mpi")
MAX_NODES = 10_000_000
#: Bounds on hardware figures (SI). Far outside today's hardware either way, but they keep
#: a wrong unit or a hostile file from driving the cost model to infinities (1e-300 B/s)
#: or to zero cost.
PLAUSIBLE: dict[str, tuple[Kind, float, float]] = {
    "latency": ("time", 0.0, 1.0),                   # … 1 s
    "bandwidth": ("bandwidth", 1e3, 1e16),           # 1 kB/s … 10 PB/s
    "memory": ("bytes", 2.0**20, 2.0**60),           # 1 MiB … 1 EiB
    "size": ("bytes", 0.0, 2.0**60),                 # … 1 EiB (caches, reserves)
    "flop_rate": ("flop_rate", 1e6, 1e18),           # 1 MFLOP/s … 1 EFLOP/s
    "frequency": ("frequency", 1e6, 1e12),           # 1 MHz … 1 THz
    "power": ("power", 1.0, 1e6),                    # 1 W … 1 MW
}


def _with_unit(convert: Callable[[object], float]) -> Callable[[object], float]:
    """``convert``, with a bare number other than 0 refused: ``reserved_memory: 1`` was
    one byte, where its writer meant a GiB (an audit; ``bucket_size`` refuses the same)."""
    def parse(value: object) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0:
            raise Invalid(f"expected a size with its unit, such as '{value:g} GiB', got "
                          f"{value:g} (a unit is needed)")
        return convert(value)
    return parse


def _plausible(what: str, positive: bool = True) -> Callable[[object], float]:
    """A quantity converter within :data:`PLAUSIBLE` bounds."""
    kind, low, high = PLAUSIBLE[what]
    return quantity(kind, positive=positive, minimum=low, maximum=high)


@dataclass(frozen=True)
class Device:
    """One accelerator (or CPU node) with the specs the cost models use, in SI units."""

    name: str
    peak_flops: Mapping[str, float]  #: FLOP/s by dtype key (fp32, bf16, ...)
    memory_bytes: float
    memory_bandwidth: float  #: bytes/s
    sm_count: int
    l2_bytes: float
    kind: str = "gpu"
    fp32_cores_per_sm: int | None = None
    clock_hz: float | None = None  #: boost clock
    base_clock_hz: float | None = None  #: base clock: what the vendor guarantees at TDP
    tdp_w: float | None = None  #: board power limit (W): what a power-capped card sustains
    compute_efficiency: float = 0.8  #: fraction of peak a large kernel reaches
    memory_efficiency: float = 0.85  #: fraction of memory bandwidth a stream reaches
    vendor: str = ""
    architecture: str = ""
    chip: str = ""  #: the GPU die (GV100, GA100, ...): boards of one die sustain alike
    aliases: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def peak(self, key: str) -> float:
        """Peak FLOP/s for a dtype key, falling back to the nearest rate the device has
        (bf16 → fp16 → fp32; tf32 → fp32; fp8 → bf16 → fp16 → fp32)."""
        order = {
            "fp64": ("fp64", "fp32"),
            "fp32": ("fp32",),
            "tf32": ("tf32", "fp32"),
            "bf16": ("bf16", "fp16", "fp32"),
            "fp16": ("fp16", "bf16", "fp32"),
            "fp8": ("fp8", "bf16", "fp16", "fp32"),
            "int8": ("int8", "fp8", "fp16", "fp32"),
        }.get(key, (key, "fp32"))
        for k in order:
            if k in self.peak_flops:
                return self.peak_flops[k]
        return max(self.peak_flops.values())


@dataclass(frozen=True)
class Link:
    """One tier of the network, as seen by one device: latency α and bandwidth 1/β.

    ``nvls_*`` describe an in-switch reduction (NVIDIA NVLink SHARP) that NCCL uses for
    all-reduce from ``nvls_min_bytes`` on, where the switch does the arithmetic.

    ``bandwidth_by_group`` holds measured bandwidths for groups of a given size inside the
    tier, for trees of switches where a ring of a few devices behind one switch runs
    faster than one that crosses switches (PCIe systems): ``((2, 12.2e9), (8, 8.7e9))``.
    """

    latency_s: float
    bandwidth: float  #: bytes/s per device, one direction
    name: str = ""
    #: NVLS all-reduce's algorithm bandwidth (bytes / time, nccl-tests' algbw), which
    #: NCCL's tuning model holds at every group size
    nvls_algbw: float | None = None
    nvls_latency_s: float | None = None
    nvls_min_bytes: float | None = None
    bandwidth_by_group: tuple[tuple[int, float], ...] = ()

    def bandwidth_for(self, size: int) -> float:
        """The bandwidth a group of ``size`` devices sees on this tier: the entry of the
        smallest listed group at least as large (the largest listed one beyond them), or
        ``bandwidth`` without a table."""
        if not self.bandwidth_by_group:
            return self.bandwidth
        for n, bw in self.bandwidth_by_group:
            if n >= size:
                return bw
        return self.bandwidth_by_group[-1][1]


@dataclass(frozen=True)
class Cluster:
    """A homogeneous cluster: nodes of identical devices on a two-tier network."""

    name: str
    devices_per_node: int
    device: Device
    intra: Link
    inter: Link
    nodes: int | None = None
    algorithm: str = "auto"
    reserved_memory: float = 0.0
    source: str = ""
    #: ``nccl`` or ``mpi``; None: NCCL on GPUs, MPI on CPU nodes (:attr:`collective_library`)
    library: str | None = None

    @property
    def collective_library(self) -> str:
        """The library whose algorithms ``auto`` chooses from."""
        if self.library is not None:
            return self.library
        return "nccl" if self.device.kind == "gpu" else "mpi"

    @property
    def capacity_bytes(self) -> float:
        """Memory a device offers to the model (capacity minus the reserve)."""
        return max(0.0, self.device.memory_bytes - self.reserved_memory)

    def max_devices(self) -> int | None:
        """The number of devices, when the node count is given."""
        return None if self.nodes is None else self.nodes * self.devices_per_node

    def with_algorithm(self, algorithm: str) -> Cluster:
        """The same cluster with another collective-algorithm preference."""
        return replace(self, algorithm=algorithm)


# ---------------------------------------------------------------------------------------
# The catalog


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-()]+", "", name).lower()


@functools.lru_cache(maxsize=1)
def catalog() -> dict[str, Device]:
    """The shipped device catalog, by canonical name (loaded once, validated)."""
    text = importlib.resources.files("planner").joinpath("data/devices.yaml").read_text(
        encoding="utf-8")
    doc = parse_text(text, "planner/data/devices.yaml")
    issues: list[Issue] = []
    f = Fields(doc.data, "$", issues, "the device catalog")
    f.opt("kind", string, "device-catalog")
    entries = f.raw("devices")
    f.finish()
    devices: dict[str, Device] = {}
    if not isinstance(entries, list):
        issues.append(Issue("$.devices", "expected a list of devices"))
        entries = []
    for i, entry in enumerate(entries):
        dev = device_from_data(entry, child_path("$.devices", i), issues, catalog_entry=True)
        if dev is not None:
            devices[dev.name] = dev
    if issues:
        raise ModelDataError("the shipped device catalog is invalid (reinstall planner):\n"
                             + doc.error(issues).render(snippet=False))
    return devices


@functools.lru_cache(maxsize=1)
def _alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for dev in catalog().values():
        for n in (dev.name, *dev.aliases):
            index[_norm(n)] = dev.name
    return index


#: devices a command was given beyond the catalog (cluster files' devices, by normalised
#: name): ``kernels fit/eval/predict --cluster`` registers them so that measurements of a
#: GPU the catalog lacks can be read, fitted and judged under the cluster file's specs
_EXTRA: dict[str, Device] = {}


def register_devices(devices: Iterable[Device]) -> None:
    """Make ``devices`` known to :func:`lookup_device` by name (before the catalog) for
    the rest of the process; one named like a catalog device (``base:`` it with other
    specs) replaces it under its aliases too, as a profile names it. Worker processes
    register them again (see :func:`~planner.kernels.pipeline.fit_tables`)."""
    for dev in devices:
        same = catalog().get(dev.name)
        for name in (dev.name, *dev.aliases, *(same.aliases if same is not None else ())):
            _EXTRA[_norm(name)] = dev


def registered_devices() -> list[Device]:
    """The devices :func:`register_devices` added, each once, in the order added."""
    out: list[Device] = []
    for dev in _EXTRA.values():
        if not any(dev is d for d in out):
            out.append(dev)
    return out


def lookup_device(name: str) -> Device | None:
    """A device by name or alias (case, spaces, dashes and parentheses ignored): a
    registered one (:func:`register_devices`) by its name, else the catalog's."""
    extra = _EXTRA.get(_norm(name))
    if extra is not None:
        return extra
    canonical = _alias_index().get(_norm(name))
    return catalog()[canonical] if canonical else None


def _model_number(norm: str) -> str | None:
    """The model of a normalised device name: the letter before its first digits and
    those digits (``v100`` of "teslav100", ``b200``, ``a10`` of "a10g"), or None."""
    m = re.search(r"([a-z])(\d+)", norm)
    return m.group(1) + m.group(2) if m else None


def suggest_device(name: str) -> str | None:
    """The closest catalog name or alias, as a canonical name, for a did-you-mean hint: a
    spelling slip, never another model. A name with a model number is matched among the
    names of that model only ("Tesla V100" → a V100; "B200", "H800", "L40S", "A10G" →
    nothing: an audit found them offered an H200, an H200, an L4 and an A100); one
    without among all names, closely."""
    index = _alias_index()
    norm = _norm(name)
    model = _model_number(norm)
    if model is None:
        close = difflib.get_close_matches(norm, list(index), n=1, cutoff=0.6)
    else:
        same = [k for k in index if _model_number(k) == model]
        close = difflib.get_close_matches(norm, same, n=1, cutoff=0.0)
    return index[close[0]] if close else None


def _device_name(value: object) -> Device:
    if not isinstance(value, str):
        raise Invalid(f"expected a catalog device name (`planner devices` lists them), got "
                      f"{show(value)}")
    dev = lookup_device(value)
    if dev is None:
        hint = suggest_device(value)
        extra = f"; did you mean '{hint}'?" if hint else ""
        raise Invalid(f"unknown device '{value}'{extra} (`planner devices` lists the "
                      "catalog; or give the specs inline)")
    return dev


def _names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise Invalid(f"expected a list of names, got {show(value)}")
    return tuple(string(v) for v in value)


def device_from_data(data: object, path: str, issues: list[Issue], *,
                     catalog_entry: bool = False) -> Device | None:
    """Validate a device mapping (catalog entry or inline spec); None on problems."""
    if isinstance(data, str) and not catalog_entry:
        try:
            return _device_name(data)
        except Invalid as exc:
            issues.append(Issue(path, str(exc)))
            return None
    if not catalog_entry and not isinstance(data, (str, dict)):
        # (an audit: `device: 5` was told only of a mapping of keys)
        issues.append(Issue(path, f"expected a device: a catalog name (`planner devices` "
                                  f"lists them) or a mapping of its specs, got {show(data)}"))
        return None
    f = Fields(data, path, issues, "a device")
    if not f.ok:
        return None
    n_before = len(issues)
    base: Device | None = None
    if not catalog_entry and f.has("base"):
        try:
            base = _device_name(f.raw("base"))
        except Invalid as exc:
            issues.append(Issue(f.at("base"), str(exc)))
            return None
    need = f.opt_none if base is not None else f.req
    name = f.opt("name", string, base.name if base else "custom") if base or not \
        catalog_entry else f.req("name", string)
    peaks: dict[str, float] = dict(base.peak_flops) if base else {}
    if f.has("peak_flops"):
        pf = Fields(f.raw("peak_flops"), f.at("peak_flops"), issues, "peak_flops")
        before = len(issues)
        for key in PEAK_KEYS:
            v = pf.opt_none(key, _plausible("flop_rate"))
            if v is not None:
                peaks[key] = v
        pf.finish()
        if pf.ok and not peaks and len(issues) == before:
            f.error("peak_flops", "give at least one rate, e.g. fp32: '19.5 TFLOPS'")
        elif pf.ok and "fp32" not in peaks and len(issues) == before:
            # every other rate falls back to fp32; without it a float32 network was
            # planned at the fastest rate given (fp16 tensor cores)
            f.error("peak_flops", "give the fp32 rate too (e.g. fp32: '19.5 TFLOPS'): "
                                  "dtypes without a rate of their own are timed at it")
    elif base is None:
        f.missing("missing required key 'peak_flops' in a device (e.g. {fp32: '19.5 "
                      "TFLOPS', bf16: '312 TFLOPS'})")
    memory = need("memory", _plausible("memory"))
    bandwidth = need("memory_bandwidth", _plausible("bandwidth"))
    sm_count = need("sm_count", integer(1, 1_000_000))
    l2 = need("l2_cache", _plausible("size"))
    cores = f.opt_none("fp32_cores_per_sm", integer(1, 100_000))
    clock = f.opt_none("boost_clock", _plausible("frequency"))
    base_clock = f.opt_none("base_clock", _plausible("frequency"))
    tdp = f.opt_none("tdp", _plausible("power"))
    boost_hz = clock if clock is not None else (base.clock_hz if base else None)
    base_hz = base_clock if base_clock is not None else (base.base_clock_hz if base else None)
    if boost_hz is not None and base_hz is not None and base_hz > boost_hz:
        f.error("base_clock" if base_clock is not None else "boost_clock",
                f"the base clock ({format_si(base_hz, 'Hz')}) is above the boost clock "
                f"({format_si(boost_hz, 'Hz')}); a GPU boosts above its base: are the two "
                "swapped?")
    kind = f.opt("kind", choice(("gpu", "cpu")), base.kind if base else "gpu")
    eff_c, eff_m = (base.compute_efficiency, base.memory_efficiency) if base else (0.8, 0.85)
    if f.has("achievable"):
        af = Fields(f.raw("achievable"), f.at("achievable"), issues, "achievable")
        eff_c = af.opt("compute", number(0.01, 1.0), eff_c)  # 1e-300 gave 5.8e281 Ps
        eff_m = af.opt("memory", number(0.01, 1.0), eff_m)
        af.finish()
    vendor = f.opt("vendor", string, base.vendor if base else "")
    arch = f.opt("architecture", string, base.architecture if base else "")
    chip = f.opt("chip", string, base.chip if base else "")
    aliases: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    if catalog_entry:
        aliases = tuple(str(a) for a in (f.raw("aliases") or []))
        sources = tuple(str(s) for s in (f.raw("sources") or []))
    elif f.has("aliases"):  # other names a measurement file may give it ("NVIDIA B200")
        aliases = f.opt("aliases", _names, ())
        # the catalog GPU this device replaces, if it is named like one
        own = _alias_index().get(_norm(name)) if name else None
        for i, alias in enumerate(aliases):
            # another catalog GPU's name would read its measurements as this device's
            other = _alias_index().get(_norm(alias))
            if other is not None and other != own:
                issues.append(Issue(child_path(f.at("aliases"), i),
                                    f"alias {alias!r} is the catalog's {other}: measurements "
                                    f"naming it would be read as {name or 'this device'}'s; "
                                    "remove it, or give a name only this device has"))
    f.finish()
    if len(issues) > n_before or name is None:
        return None
    return Device(
        name=name,
        peak_flops=peaks,
        memory_bytes=memory if memory is not None else (base.memory_bytes if base else 0.0),
        memory_bandwidth=bandwidth if bandwidth is not None else (
            base.memory_bandwidth if base else 0.0),
        sm_count=sm_count if sm_count is not None else (base.sm_count if base else 1),
        l2_bytes=l2 if l2 is not None else (base.l2_bytes if base else 0.0),
        kind=kind,
        fp32_cores_per_sm=cores if cores is not None else (
            base.fp32_cores_per_sm if base else None),
        clock_hz=clock if clock is not None else (base.clock_hz if base else None),
        base_clock_hz=base_clock if base_clock is not None else (
            base.base_clock_hz if base else None),
        tdp_w=tdp if tdp is not None else (base.tdp_w if base else None),
        compute_efficiency=eff_c,
        memory_efficiency=eff_m,
        vendor=vendor,
        architecture=arch,
        chip=chip,
        aliases=aliases,
        sources=sources if catalog_entry else (base.sources if base else ()),
    )


def _link(data: object, path: str, issues: list[Issue], what: str,
          max_group: int | None = None) -> Link | None:
    """One tier (``what``: ``intra_node`` or ``inter_node``); ``max_group``, a node's
    devices when known, bounds the intra-node tier's ``bandwidth_by_group`` sizes."""
    f = Fields(data, path, issues, what)
    if not f.ok:
        return None
    if what == "inter_node":  # what the collective models read of the intra tier only
        for key, means in (("nvls", "NVSwitch in-switch reduction inside a node"),
                           ("bandwidth_by_group", "bandwidths of groups inside a node")):
            if f.has(key):
                f.seen.add(key)
                f.error(key, f"'{key}' ({means}) belongs to the intra_node tier; the "
                             f"inter_node tier does not read it: move it to intra_node "
                             f"or remove it")
    latency = f.req("latency", _plausible("latency", positive=False))
    bandwidth = f.req("bandwidth", _plausible("bandwidth"))
    name = f.opt("name", string, "")
    nvls_bw = nvls_lat = nvls_min = None
    intra = what == "intra_node"
    if intra and f.has("nvls") and f.raw("nvls") is not None:
        nf = Fields(f.raw("nvls"), f.at("nvls"), issues, "nvls")
        if nf.has("bandwidth"):  # a bus bandwidth, as nvls: took before 2026-11-28
            nf.seen.add("bandwidth")
            nf.error("bandwidth", "nvls takes 'algbw', the all-reduce's algorithm bandwidth "
                                  "(its bytes over its time: nccl-tests' algbw column), "
                                  "which NVLS keeps at every group size, not a bus "
                                  "bandwidth: a bus bandwidth B measured on p ranks is "
                                  "algbw B·p/(2(p−1)) (457.5 GB/s on 8 ranks: 261.4 GB/s)")
        if not nf.has("bandwidth") or nf.has("algbw"):
            nvls_bw = nf.req("algbw", _plausible("bandwidth"))
        nvls_lat = nf.opt_none("latency", _plausible("latency", positive=False))
        nvls_min = nf.opt("min_bytes", _plausible("size", positive=False), 0.0)
        nf.finish()
    by_group: list[tuple[int, float]] = []
    if intra and f.has("bandwidth_by_group") and f.raw("bandwidth_by_group") is not None:
        gf = Fields(f.raw("bandwidth_by_group"), f.at("bandwidth_by_group"), issues,
                    "bandwidth_by_group (group size: bandwidth)")
        convert = _plausible("bandwidth")
        for key in list(gf.data):
            gf.seen.add(key)
            # keys as a file gives them (text) or as comm fit merges them (numbers)
            text = str(key)
            try:
                size = integer(2, 1_000_000)(int(text) if text.isdigit() else key)
            except Invalid:
                gf.error(key, f"expected a group size (an integer ≥ 2) as the key, got "
                              f"{show(key)}")
                continue
            if max_group is not None and size > max_group:
                gf.error(key, f"a group of {size} devices is larger than a node "
                              f"(devices_per_node: {max_group}): no collective inside "
                              f"a node has that many")
                continue
            try:
                by_group.append((size, convert(gf.data[key])))
            except Invalid as exc:
                gf.error(key, str(exc))
        gf.finish()
    f.finish()
    if latency is None or bandwidth is None:
        return None
    return Link(latency, bandwidth, name, nvls_bw, nvls_lat, nvls_min,
                tuple(sorted(by_group)))


def cluster_from_data(data: object, issues: list[Issue]) -> Cluster | None:
    """Validate plain data as a cluster; problems go to ``issues`` (None if any)."""
    f = Fields(data, "$", issues, "a cluster")
    if not f.ok:
        return None
    kind = f.opt("kind", string, "cluster")
    if kind != "cluster":
        f.error("kind", f"expected 'kind: cluster', got {kind!r}")
    name = f.opt("name", string, "cluster")
    f.opt_none("description", string)
    nodes = f.opt_none("nodes", integer(1, MAX_NODES))
    per_node = f.req("devices_per_node", integer(1, 1_000_000))
    device: Device | None = None
    if f.has("device"):
        device = device_from_data(f.raw("device"), f.at("device"), issues)
    else:
        f.missing("missing required key 'device' in a cluster (a catalog name such as "
                      "'H100-SXM', or a mapping of specs)")
    intra = inter = None
    if f.has("network"):
        nf = Fields(f.raw("network"), f.at("network"), issues, "the network")
        if nf.has("intra_node"):
            intra = _link(nf.raw("intra_node"), nf.at("intra_node"), issues, "intra_node",
                          per_node)
        elif per_node is not None and per_node > 1:
            nf.missing("missing required key 'intra_node' (latency and bandwidth between "
                           "devices of one node)")
        if nf.has("inter_node"):
            inter = _link(nf.raw("inter_node"), nf.at("inter_node"), issues, "inter_node")
        elif nodes != 1:
            nf.missing("missing required key 'inter_node' (latency and per-device "
                           "bandwidth between nodes); a single-node cluster says 'nodes: 1'")
        nf.finish()
    else:
        f.missing("missing required key 'network' with intra_node and inter_node tiers")
    algorithm = "auto"
    library = None
    if f.has("collectives"):
        cf = Fields(f.raw("collectives"), f.at("collectives"), issues, "collectives")
        algorithm = cf.opt("algorithm", choice(ALGORITHMS), "auto")
        library = cf.opt_none("library", choice(LIBRARIES))
        cf.finish()
    reserved = f.opt("reserved_memory", _with_unit(_plausible("size", positive=False)), 0.0)
    f.finish()
    if not issues and intra is None and inter is None and f.has("network"):
        # (an audit: `network: {}` was "invalid cluster" at the file's first line)
        issues.append(Issue("$.network", "no network tier: give intra_node (the links "
                                         "inside a node) and, for several nodes, "
                                         "inter_node"))
    if issues or per_node is None or device is None:
        return None
    if intra is None and inter is None:
        return None
    if intra is None:
        assert inter is not None
        intra = inter
    if inter is None:
        inter = intra  # a single node: the inter-node tier is never used
    if device.memory_bytes <= reserved:
        issues.append(Issue("$.reserved_memory", "reserved_memory is at least the device "
                                                 "memory: nothing is left for the model"))
        return None
    return Cluster(name=name, devices_per_node=per_node, device=device, intra=intra,
                   inter=inter, nodes=nodes, algorithm=algorithm, reserved_memory=reserved,
                   library=library)


def device_record(dev: Device) -> dict[str, Any]:
    """Plain data for ``planner devices`` (SI units)."""
    return {
        "name": dev.name,
        "aliases": list(dev.aliases),
        "kind": dev.kind,
        "architecture": dev.architecture,
        "peak_flops": dict(dev.peak_flops),
        "memory_bytes": dev.memory_bytes,
        "memory_bandwidth": dev.memory_bandwidth,
        "sm_count": dev.sm_count,
        "l2_bytes": dev.l2_bytes,
        "tdp_w": dev.tdp_w,
        "achievable": {"compute": dev.compute_efficiency, "memory": dev.memory_efficiency},
        "sources": list(dev.sources),
    }


__all__ = ["Cluster", "Device", "Link", "catalog", "cluster_from_data", "lookup_device",
           "register_devices", "registered_devices"]
