"""Environment variables inherited from the image that silently cripple or redirect NCCL.

What each does is from the NCCL user guide's environment page and NCCL 2.30.7's source
(docs/sources.md#nccl-env-vars); CUDA_VISIBLE_DEVICES from the CUDA Programming Guide.
"""

from __future__ import annotations

from checks.config import PreflightConfig
from checks.facts import MachineFacts
from checks.machine.topology import answering, p2p_ok
from checks.result import Result, fail, ok, warn

_ON = ("1", "true", "yes", "on")


def _finding(name: str, value: str, m: MachineFacts) -> str | None:
    """What ``name=value`` does to NCCL on this box; None when it is harmless here."""
    gpus = len(answering(m))
    up = value.strip().lower()
    p2p_works = m.topology is not None and any(p2p_ok(p) for p in m.topology.pairs)
    if name == "NCCL_P2P_DISABLE" and up in _ON:
        extra = ": this box's GPUs have P2P, so all-reduce falls back to host memory" if p2p_works else ""
        return (
            f"turns off P2P (NVLink and PCIe peer copies){extra}; on NVLink boxes ring busbw collapses (nccl-tests#228)"
        )
    if name == "NCCL_P2P_LEVEL" and up in ("loc", "0"):
        return "LOC means P2P is never used, NVLink included"
    if name == "NCCL_SHM_DISABLE" and up in _ON and gpus > 1:
        return "turns off host shared memory, NCCL's path between GPUs without P2P: traffic goes over the network transport"
    if name == "NCCL_IGNORE_DISABLED_P2P" and up in _ON:
        return "skips NCCL's check that P2P really works: a broken P2P path then hangs or corrupts instead of failing"
    if name == "NCCL_ALGO":
        return f"pins the algorithm to {value}: NCCL's tuner no longer picks per size (a debugging setting)"
    if name == "NCCL_PROTO":
        return f"pins the protocols to {value} (a debugging setting; ^LL128 was a 2.18 corruption workaround)"
    if name == "NCCL_NVLS_ENABLE" and up == "0":
        return "turns off NVLink SHARP: 8x H100/H200 all-reduce drops from ~480 to the ~370 GB/s ring figure"
    if name == "NCCL_IB_DISABLE" and up in _ON:
        return "uses TCP sockets instead of InfiniBand/RoCE between hosts (one box is unaffected)"
    return _socket_finding(name, value, m)


def _socket_finding(name: str, value: str, m: MachineFacts) -> str | None:
    if name != "NCCL_SOCKET_IFNAME":
        return None
    names = [n.strip().lstrip("=") for n in value.split(",") if n.strip() and not n.strip().startswith("^")]
    if "lo" in names:
        return "points NCCL at the loopback interface: other hosts cannot reach this one"
    known = m.topology.interfaces if m.topology else None
    if known is not None and names and not any(i.startswith(n) or i == n for n in names for i in known):
        return (
            f"names no interface of this host (it has {', '.join(known)}): NCCL's bootstrap finds no socket and "
            "init fails, on this box alone too"
        )
    return None


def broken_socket(m: MachineFacts) -> str | None:
    """``NCCL_SOCKET_IFNAME=...: ...`` when it names no interface of this host (NCCL cannot start at all)."""
    value = m.host.env.get("NCCL_SOCKET_IFNAME")
    what = _socket_finding("NCCL_SOCKET_IFNAME", value, m) if value is not None else None
    return f"NCCL_SOCKET_IFNAME={value}: {what}" if what and "names no interface" in what else None


def _hidden_gpus(m: MachineFacts) -> str | None:
    value = m.host.env.get("CUDA_VISIBLE_DEVICES")
    gpus = len(answering(m))
    if value is None or not gpus or not m.torch.cuda_available:
        return None
    seen = m.torch.device_count
    if seen < gpus:
        return f"CUDA_VISIBLE_DEVICES={value!r} hides {gpus - seen} of {gpus} GPUs: torch sees {seen} (an invalid entry hides itself and all after it)"
    return None


def nccl_env(m: MachineFacts, cfg: PreflightConfig) -> list[Result]:
    """No inherited variable cripples NCCL or hides GPUs (NCCL_P2P_DISABLE, NCCL_ALGO, CUDA_VISIBLE_DEVICES, ...).

    Command line equivalent: env | grep -E '^(NCCL|CUDA_VISIBLE)'
    """
    env = m.host.env
    found = {
        k: f"{k}={v}: {what}" for k, v in sorted(env.items()) if k.startswith("NCCL_") and (what := _finding(k, v, m))
    }
    hidden = _hidden_gpus(m)
    if hidden:
        found["CUDA_VISIBLE_DEVICES"] = hidden
    names = sorted(k for k in env if k.startswith("NCCL_"))
    if not found:
        seen = f"set and harmless here: {', '.join(names)}" if names else "none set"
        return [ok("nccl-env", f"NCCL variables: {seen}", value=names)]
    hint = (
        f"unset them unless you set them on purpose: `unset {' '.join(found)}` (and remove them from the image's "
        "ENV / ~/.bashrc); NCCL_DEBUG=INFO prints every NCCL variable NCCL read"
    )
    if broken_socket(m):  # every NCCL job fails, one box included: not a setting to review but a stop
        return [fail("nccl-env", "; ".join(found.values()), hint, value=sorted(found))]
    return [warn("nccl-env", "; ".join(found.values()), hint, value=sorted(found))]
