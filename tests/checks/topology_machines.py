"""The GPU topology of four multi-GPU boxes, as a fake pynvml answers it.

Each box is a list of per-GPU answer dicts for ``tests/fakes/nvml.FakeNvml`` (which checks every call
against the real pynvml signature). The snapshot fixtures ``tests/fixtures/machines/{h100-sxm-8x-nvlink,
a100-pcie-8x-two-sockets, rtx4090-4x-no-p2p, h100-pcie-2x-bridge}.json`` hold exactly what ``read_topology`` makes
of these answers (tests/checks/probe/test_nvml_topology.py holds them equal), so the rules' tests replay what the
NVML adapter produced. Topology shapes follow ``nvidia-smi topo -m`` dumps named in
docs/sources.md#nvml-topology (NV18 on HGX H100, SYS between the sockets of a two-socket PCIe box, GNS on
GeForce, NV12 through an H100 PCIe bridge).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

import pynvml

PIX, PXB, PHB, NODE, SYS = 10, 20, 30, 40, 50
OK, CNS, GNS = (
    pynvml.NVML_P2P_STATUS_OK,
    pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED,
    pynvml.NVML_P2P_STATUS_GPU_NOT_SUPPORTED,
)
NS = pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
SWITCH, GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, pynvml.NVML_NVLINK_DEVICE_TYPE_GPU


def mask(bits: Iterable[int], words: int) -> Any:
    """An NVML affinity mask: ``words`` 64-bit words with ``bits`` set."""
    array = (ctypes.c_ulonglong * words)()
    for bit in bits:
        array[bit // 64] |= 1 << (bit % 64)
    return array


def bus(index: int, first: int = 0x18) -> str:
    return f"00000000:{first + index * 0x10:02X}:00.0"


def box(
    count: int,
    *,
    level: Callable[[int, int], int],
    p2p: Callable[[int, int], int],
    numa: Callable[[int], int | None],
    cpus: Callable[[int], Iterable[int]],
    links: Callable[[int], list[str | None]] = lambda i: [],
) -> list[dict[str, Any]]:
    """Per-GPU answers. ``links(i)``: the far end of each active NVLink, a bus id, or None for an NVSwitch."""

    def gpu(i: int) -> dict[str, Any]:
        ends = links(i)
        node = numa(i)
        answers: dict[str, Any] = {
            "GetPciInfo": SimpleNamespace(busId=bus(i), pciDeviceId=0),
            "GetCpuAffinity": lambda size: mask(cpus(i), size),
            "GetTopologyCommonAncestor": lambda other: level(i, other),
            # NVML_P2P_CAPS_INDEX_NVLINK (2) is NS where no NVLink joins the pair.
            "GetP2PStatus": lambda other, index: NS if index == 2 and not ends else p2p(i, other),
            "GetMemoryAffinity": (lambda size, scope: mask([node], size))
            if node is not None
            else pynvml.NVMLError_NotSupported,
        }
        if ends:
            answers["GetNvLinkState"] = lambda link: 1 if link < len(ends) else pynvml.NVMLError_InvalidArgument
            answers["GetNvLinkRemoteDeviceType"] = lambda link: SWITCH if ends[link] is None else GPU
            answers["GetNvLinkRemotePciInfo"] = lambda link: SimpleNamespace(busId=ends[link] or "00000000:05:00.0")
        return answers

    return [gpu(i) for i in range(count)]


def _socket(i: int) -> int:
    return 0 if i < 4 else 1


def h100_sxm_8x() -> list[dict[str, Any]]:
    """HGX H100: 18 links per GPU to the NVSwitches (NV18 every pair), GPUs 0-3 on socket 0 and 4-7 on socket 1."""
    return box(
        8,
        level=lambda a, b: NODE if _socket(a) == _socket(b) else SYS,
        p2p=lambda a, b: OK,
        numa=_socket,
        cpus=lambda i: [
            *range(48 * _socket(i), 48 * _socket(i) + 48),
            *range(96 + 48 * _socket(i), 144 + 48 * _socket(i)),
        ],
        links=lambda i: [None] * 18,
    )


def a100_pcie_8x_two_sockets() -> list[dict[str, Any]]:
    """Eight A100 PCIe, four behind PCIe switches on each socket: PXB inside a half, SYS (and CNS) between halves."""
    return box(
        8,
        level=lambda a, b: PXB if _socket(a) == _socket(b) else SYS,
        p2p=lambda a, b: OK if _socket(a) == _socket(b) else CNS,
        numa=_socket,
        cpus=lambda i: range(32 * _socket(i), 32 * _socket(i) + 32),
    )


def rtx4090_4x() -> list[dict[str, Any]]:
    """Four RTX 4090 on one socket, no NVLink (NotSupported): PHB in pairs, NODE between them, GNS everywhere."""
    return box(
        4,
        level=lambda a, b: PHB if a // 2 == b // 2 else NODE,
        p2p=lambda a, b: GNS,
        numa=lambda i: 0,
        cpus=lambda i: range(64),
    )


def h100_pcie_2x_bridge() -> list[dict[str, Any]]:
    """Two H100 PCIe joined by NVLink bridges: 12 links from each to the other (NV12), P2P OK."""
    return box(
        2,
        level=lambda a, b: PHB,
        p2p=lambda a, b: OK,
        numa=lambda i: 0,
        cpus=lambda i: range(32),
        links=lambda i: [bus(1 - i)] * 12,
    )


MACHINES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "h100-sxm-8x-nvlink.json": h100_sxm_8x,
    "a100-pcie-8x-two-sockets.json": a100_pcie_8x_two_sockets,
    "rtx4090-4x-no-p2p.json": rtx4090_4x,
    "h100-pcie-2x-bridge.json": h100_pcie_2x_bridge,
}
CPU_COUNT = {
    "h100-sxm-8x-nvlink.json": 192,
    "a100-pcie-8x-two-sockets.json": 64,
    "rtx4090-4x-no-p2p.json": 64,
    "h100-pcie-2x-bridge.json": 32,
}
