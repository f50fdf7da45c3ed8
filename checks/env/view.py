"""One side of a diff: a machine's comparable fields, flattened, from a snapshot, a bootstrap report or ``live``.

A snapshot gives everything the probe records. A bootstrap report, read by the typed readers (``Report`` and
``checks.reports.bootstrap.BootstrapMeasurements``), gives its ``measurements.environment`` (and the GPU count and
names of its inventory); a report without that section (an older one) gives nothing to compare but its inventory,
and ``missing`` says so. Field names: ``torch``, ``nccl``, ``gpu0.cc``, ``package:numpy``,
``var:NCCL_DEBUG`` and so on (``docs/environment.md``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks.errors import PreflightError
from checks.facts import MachineFacts
from checks.machine.measurements import environment
from checks.reports.bootstrap import BootstrapMeasurements, Environment, read_measurements
from checks.result import Report
from checks.snapshot import load_snapshot
from checks.typedjson import TypedJsonError
from checks.units import GIB, MIB

# Fields a bootstrap report's measurements.environment carries to compare (checks/reports/bootstrap.py).
REPORT_FIELDS = Environment.COMPARED


@dataclass(frozen=True)
class Side:
    """A labelled set of fields; ``missing`` names what this kind of file cannot say."""

    label: str
    fields: dict[str, Any]
    missing: tuple[str, ...] = ()
    kind: str = "snapshot"  # snapshot | report | live
    gpu_ccs: tuple[tuple[int, int], ...] = ()
    arch_list: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def from_facts(m: MachineFacts, label: str, kind: str = "snapshot") -> Side:
    """Flatten a machine's facts into comparable fields."""
    env = environment(m)
    fields: dict[str, Any] = {k: env.value(k) for k in REPORT_FIELDS}
    fields.update(kernel=(m.env.kernel if m.env else None) or m.host.kernel, cpu_model=m.host.cpu_model)
    fields["cores"] = round(m.host.usable_cores, 1)
    fields["mem_gib"] = round(m.host.mem_total / GIB) if m.host.mem_total else None
    fields["shm_mib"] = round(m.host.shm_total / MIB) if m.host.shm_total else None
    fields["gpu_count"] = len(m.nvml.gpus)
    fields["arch_list"] = " ".join(m.torch.arch_list) or None
    for g in m.nvml.gpus:
        fields[f"gpu{g.index}.name"] = g.name
        fields[f"gpu{g.index}.cc"] = ".".join(map(str, g.compute_capability)) if g.compute_capability else None
        fields[f"gpu{g.index}.power_limit_w"] = round(g.power_limit_mw / 1000) if g.power_limit_mw else None
        gen = g.pcie_gen_loaded or g.pcie_gen_max
        width = g.pcie_width_loaded or g.pcie_width_max
        fields[f"gpu{g.index}.pcie"] = f"gen{gen} x{width}" if gen and width else None
        fields[f"gpu{g.index}.sm_clock_max_mhz"] = g.sm_clock_max_mhz
    fields.update(_numa(m))
    missing: tuple[str, ...] = ()
    if m.env is None:
        missing = ("packages, variables, OS, glibc, nvcc and CPU flags (the snapshot predates them)",)
    else:
        fields["cpu_flags"] = " ".join(m.env.cpu_flags) or None
        fields.update({f"package:{k}": v for k, v in m.env.packages.items()})
        fields.update({f"var:{k}": v for k, v in m.env.variables.items()})
    ccs = tuple(g.compute_capability for g in m.nvml.gpus if g.compute_capability)
    return Side(label, fields, missing, kind, ccs, m.torch.arch_list if m.torch.version else None)


def _numa(m: MachineFacts) -> dict[str, Any]:
    """NUMA placement from the topology facts (boxes with 2+ GPUs; none in snapshots that predate them): each
    GPU's node and count of local CPUs, and the GPU pairs that cross the sockets without NVLink (path SYS)."""
    topo = m.topology
    if topo is None or not topo.gpus:
        return {}
    out: dict[str, Any] = {"cross_socket_pairs": sum(1 for p in topo.pairs if not p.nvlinks and p.level == 50)}
    for g in topo.gpus:
        out[f"gpu{g.index}.numa_node"] = g.numa_node
        out[f"gpu{g.index}.local_cpus"] = len(g.cpus) or None
    return out


def from_report(measured: BootstrapMeasurements, label: str) -> Side:
    """Flatten a bootstrap report's measurements (``invoke bootstrap --json``, read by ``read_measurements``)."""
    env, inventory = measured.environment, measured.inventory
    fields: dict[str, Any] = {"gpu_count": inventory.gpus}
    fields.update({f"gpu{i}.name": n for i, n in enumerate(inventory.gpu_names)})
    missing = ["GPU and host figures (power, PCIe, clocks, cores, shm: diff snapshots for those)"]
    if env is not None:
        fields.update({k: env.value(k) for k in REPORT_FIELDS})
        fields.update({f"package:{k}": v for k, v in env.packages.items()})
    else:
        fields.update(torch=inventory.torch, nccl=inventory.nccl)
        missing.insert(0, "the environment (the report predates measurements.environment: rerun bootstrap)")
    return Side(label, fields, tuple(missing), "report")


def load_side(spec: str, live: Any = None) -> Side:
    """``live`` (``live()`` is called for the facts), a snapshot file, or a bootstrap report file."""
    if spec == "live":
        return from_facts(live(), "live", "live")
    path = Path(spec)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PreflightError(
            f"{spec} does not exist", hint="give a snapshot, a bootstrap --json report, or live"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PreflightError(
            f"{spec} is not a JSON snapshot or report ({exc})",
            hint="give a snapshot, a bootstrap --json report, or live",
        ) from None
    if isinstance(doc, dict) and isinstance(doc.get("machine"), dict):
        facts, _ = load_snapshot(path)
        return from_facts(facts, f"snapshot {path.name}")
    if isinstance(doc, dict) and "results" in doc and "schema" in doc:
        if "hosts" in doc:
            raise PreflightError(f"{spec} is a fleet report", hint="diff one host's snapshot or report")
        try:
            report = Report.from_json(doc, spec)
        except TypedJsonError as exc:
            raise PreflightError(str(exc), hint="give a bootstrap --json report of this gpu-preflight") from None
        return from_report(read_measurements(report, spec), f"report {path.name}")
    raise PreflightError(
        f"{spec} is neither a snapshot nor a bootstrap report",
        hint="give invoke snapshot's or bootstrap --json's file, or live",
    )
