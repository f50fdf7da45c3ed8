"""Network checks: downloads from configured URLs (per host), TCP links and the all-reduce (across hosts).

The seed article §3.3: two rented boxes joined by 1 Gbit/s make DDP crawl; measure the link (iperf3) before
training across them. docs/sources.md#inter-node-link: judge inter-node TCP against what the link
should carry, and read all-reduce figures correctly (busbw, message size).
"""

from __future__ import annotations

from checks.config import NetworkConfig, PreflightConfig
from checks.facts import AllreduceFacts, DownloadFacts, LinkFacts, MachineFacts
from checks.machine.grading import grade, graded
from checks.reports.bootstrap import Download
from checks.result import Result, Status, fail, ok, skip, warn
from checks.tables import datasheet
from checks.units import MIB

# NVLink 3 and 4 carry 25 GB/s per link and direction (18 x 25 = 450 GB/s on H100, 12 x 25 = 300 on A100:
# docs/sources.md#nvlink-per-link).
NVLINK_LINK_GB_S = 25.0
_LINK_HINTS = {
    Status.FAIL: "too slow for data-parallel training across these hosts: train on one box, or rent hosts with a fast interconnect",
    Status.WARN: "gradient all-reduce will be network-bound: keep DDP within one host or use gradient compression",
}


def _download_result(d: DownloadFacts, cfg: NetworkConfig) -> Result:
    if d.error or d.mb_s is None:
        hint = "check the URL, the proxy variables (HTTPS_PROXY, NO_PROXY) and the firewall of this box"
        return fail("net-download", f"{d.url}: {d.error or 'no data received'}", hint, subject=d.url)
    summary = (
        f"{d.url}: {d.mb_s:.1f} MB/s, {d.latency_ms:.0f} ms to the first response, "
        f"{d.bytes / MIB:.0f} MiB in {d.seconds:.1f} s"
    )
    if d.mb_s < cfg.download_warn_mb_s:
        hint = "stage the dataset once onto a disk that survives the instance, or fetch from storage near the box"
        return warn(
            "net-download", summary, hint, subject=d.url, value=d.mb_s, expected=f">= {cfg.download_warn_mb_s:g} MB/s"
        )
    return ok("net-download", summary, subject=d.url, value=d.mb_s)


def net_download(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """Download throughput and latency from the configured URLs (secrets redacted).

    Command line equivalent: curl -o /dev/null -w '%{speed_download} %{time_starttransfer}' URL.
    """
    if m.net is None:
        return [skip("net-download", "downloads not measured (snapshot recorded without --bench)")]
    if m.net.skipped:
        return [skip("net-download", m.net.skipped)]
    return [_download_result(d, cfg.network) for d in m.net.downloads]


def net_measurements(m: MachineFacts) -> tuple[Download, ...] | None:
    """``measurements.downloads`` for the report (URLs already redacted); None when none was measured."""
    if m.net is None or not m.net.downloads:
        return None
    return tuple(Download(d.url, d.mb_s, d.latency_ms, d.bytes, d.status, d.error) for d in m.net.downloads)


def mbit(value: float | None) -> str:
    return "?" if value is None else f"{value / 1000:.1f} Gbit/s" if value >= 1000 else f"{value:.0f} Mbit/s"


def link_results(links: list[LinkFacts], cfg: NetworkConfig) -> list[Result]:
    """Judge each direction: TCP throughput against the link thresholds, with the RTT."""
    out = []
    for link in links:
        subject = f"{link.src}->{link.dst}"
        if link.error or link.tcp_mbit_s is None:
            hint = "allow TCP between the hosts (firewall, security group), or give addr= in a hosts file"
            out.append(fail("net-link", f"{subject}: {link.error or 'no figure'}", hint, subject=subject))
            continue
        rtt = f", RTT {link.rtt_ms:.2f} ms" if link.rtt_ms is not None else ""
        summary = f"{mbit(link.tcp_mbit_s)} TCP ({link.tool}, {link.streams} streams){rtt}"
        kw = {"subject": subject, "value": link.tcp_mbit_s, "expected": f">= {mbit(cfg.link_warn_mbit_s)}"}
        status = grade(link.tcp_mbit_s, cfg.link_warn_mbit_s, cfg.link_fail_mbit_s)
        out.append(graded("net-link", status, summary, _LINK_HINTS.get(status), **kw))
    return out


def intra_node_gb_s(gpu_names: list[str]) -> float | None:
    """Look up the slowest GPU's datasheet link out of the card: NVLink (links x 25 GB/s) or PCIe."""
    figures = []
    for name in gpu_names:
        spec = datasheet.lookup(name)
        if spec is None:
            return None
        figures.append(spec.nvlink_links * NVLINK_LINK_GB_S if spec.nvlink_links else spec.host_link_gb_s)
    return min(figures) if figures else None


def _levelled(rows: list[AllreduceFacts]) -> bool:
    """busbw grew less than 10% over the last step of the sweep: larger messages would not change it."""
    return len(rows) >= 2 and rows[-1].busbw_gb_s <= 1.1 * rows[-2].busbw_gb_s


def _compare(best: AllreduceFacts, links: list[LinkFacts], gpu_names: list[str]) -> tuple[str, float | None]:
    slowest = min((x.tcp_mbit_s for x in links if x.tcp_mbit_s), default=None)
    parts, ratio = [], None
    if slowest:
        ratio = best.busbw_gb_s / (slowest / 8000)
        parts.append(f"{ratio:.0%} of the slowest TCP link ({mbit(slowest)} = {slowest / 8000:.3f} GB/s)")
    bound = intra_node_gb_s(gpu_names) if best.backend == "nccl" else None
    if bound:
        parts.append(f"intra-node datasheet link {bound:.0f} GB/s")
    return ("; " + ", ".join(parts)) if parts else "", ratio


def allreduce_results(
    rows: list[AllreduceFacts], reason: str | None, links: list[LinkFacts], gpu_names: list[str], cfg: NetworkConfig
) -> list[Result]:
    """Judge the all-reduce sweep: message size large enough, busbw against the TCP link it runs on."""
    if not rows:
        text = reason or "no result"
        if text.startswith("skipped"):
            return [skip("net-allreduce", text.removeprefix("skipped: "))]
        hint = "set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to the interface between the hosts; open its ports"
        return [fail("net-allreduce", f"all-reduce across the hosts {text}", hint)]
    best = rows[-1]
    compared, ratio = _compare(best, links, gpu_names)
    summary = (
        f"{best.backend}, {best.world_size} ranks: busbw {best.busbw_gb_s:.3f} GB/s (algbw "
        f"{best.algbw_gb_s:.3f}) at {best.bytes / MIB:.0f} MiB{compared}"
    )
    value = best.busbw_gb_s
    if best.bytes < cfg.allreduce_meaningful_mib * MIB and not _levelled(rows):
        hint = f"raise preflight.network.allreduce_max_mib/allreduce_budget_s: below {cfg.allreduce_meaningful_mib} MiB busbw understates the fabric"
        return [
            warn(
                "net-allreduce", summary + "; the largest message is too small (busbw still rising)", hint, value=value
            )
        ]
    if ratio is not None and ratio < cfg.allreduce_link_fraction:
        hint = "the collective does not use the link it should: check GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME"
        return [
            warn(
                "net-allreduce",
                summary,
                hint,
                value=value,
                expected=f">= {cfg.allreduce_link_fraction:.0%} of the link",
            )
        ]
    return [ok("net-allreduce", summary, value=value)]
