"""A node's network ports as sysfs shows them, and the counters each kind has.

InfiniBand and RoCE ports are under ``/sys/class/infiniband/<dev>/ports/<n>/`` (``counters/``
and, on RoCE NICs, ``hw_counters/``; ``port_xmit_data`` and ``port_rcv_data`` count 4-byte
words), Ethernet NICs under ``/sys/class/net/<if>/statistics/`` (only interfaces backed by a
device, and not the ones that carry an RDMA port already). A counter a NIC does not have is left
out, never invented. ``myriad_agent.network`` samples them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# the counters every port kind may have: (name in reports, sysfs file, fast?, scale to the unit).
# Fast counters are read every sample: bytes each way (utilization per window), transmit wait (its
# share of windows) and link downs (flap times to one window). The others are read every
# SLOW_EVERY samples: congestion notifications and errors are reported as rates and counts over
# the report, so 100 ms steps lose nothing there and halve the reads of a sample.
IB_COUNTERS = (
    ("port_xmit_data", "counters/port_xmit_data", True, 4),  # 4-byte words -> bytes
    ("port_rcv_data", "counters/port_rcv_data", True, 4),
    ("port_xmit_wait", "counters/port_xmit_wait", True, 1),
    ("link_downed", "counters/link_downed", True, 1),
    ("np_cnp_sent", "hw_counters/np_cnp_sent", False, 1),
    ("rp_cnp_handled", "hw_counters/rp_cnp_handled", False, 1),
    ("np_ecn_marked_roce_packets", "hw_counters/np_ecn_marked_roce_packets", False, 1),
    ("port_xmit_discards", "counters/port_xmit_discards", False, 1),
    ("symbol_error", "counters/symbol_error", False, 1),
    ("port_rcv_errors", "counters/port_rcv_errors", False, 1),
    ("out_of_sequence", "hw_counters/out_of_sequence", False, 1),
    ("packet_seq_err", "hw_counters/packet_seq_err", False, 1),
    ("local_ack_timeout_err", "hw_counters/local_ack_timeout_err", False, 1),
)
ETH_COUNTERS = (
    ("tx_bytes", "statistics/tx_bytes", True, 1),
    ("rx_bytes", "statistics/rx_bytes", True, 1),
    ("carrier_down_count", "carrier_down_count", True, 1),
    ("tx_errors", "statistics/tx_errors", False, 1),
    ("rx_errors", "statistics/rx_errors", False, 1),
    ("tx_dropped", "statistics/tx_dropped", False, 1),
    ("rx_dropped", "statistics/rx_dropped", False, 1),
)
# what each summary figure reads, by port kind
ROLES = {
    "ib": {"tx": "port_xmit_data", "rx": "port_rcv_data", "wait": "port_xmit_wait", "down": "link_downed"},
    "eth": {"tx": "tx_bytes", "rx": "rx_bytes", "down": "carrier_down_count"},
}
ERROR_COUNTERS = (
    "port_xmit_discards",
    "symbol_error",
    "port_rcv_errors",
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "tx_errors",
    "rx_errors",
    "tx_dropped",
    "rx_dropped",
)
CONGESTION = {"np_cnp_sent": "cnp_sent_per_s", "rp_cnp_handled": "cnp_handled_per_s"}
CONGESTION["np_ecn_marked_roce_packets"] = "ecn_marked_per_s"
STATE_ACTIVE, STATE_DOWN = 4, 1
STATE_NAMES = {1: "down", 2: "init", 3: "armed", 4: "active", 5: "active_defer"}


@dataclass
class Port:
    """One port: its name in reports (``mlx5_0/1``, ``eth0``), kind, rail and counter files."""

    name: str
    kind: str  # "ib" (InfiniBand or RoCE) or "eth"
    rail: int
    folder: Path
    counters: list[tuple[str, Path, bool, int]] = field(default_factory=list)
    state_path: Path | None = None
    rate_path: Path | None = None
    link_layer: str = ""

    def describe(self, rate_gbps: float) -> dict:
        return {"name": self.name, "kind": self.kind, "rail": self.rail, "rate_gbps": rate_gbps}


def discover(root: Path | str = "/") -> list[Port]:
    """The node's RDMA ports, then its other device-backed Ethernet NICs, in a stable order."""
    root = Path(root)
    ports: list[Port] = []
    rdma_netdevs: set[str] = set()
    ib = root / "sys/class/infiniband"
    devices = sorted(p for p in ib.iterdir()) if ib.is_dir() else []
    for rail, dev in enumerate(devices):
        net = dev / "device/net"
        if net.is_dir():
            rdma_netdevs.update(p.name for p in net.iterdir())
        for port_dir in sorted((dev / "ports").iterdir() if (dev / "ports").is_dir() else [], key=_numeric):
            port = Port(f"{dev.name}/{port_dir.name}", "ib", rail, port_dir, _present(port_dir, IB_COUNTERS))
            port.state_path, port.rate_path = _file(port_dir / "state"), _file(port_dir / "rate")
            if (port_dir / "link_layer").is_file():
                port.link_layer = (port_dir / "link_layer").read_text().strip()
            if port.counters:
                ports.append(port)
    net = root / "sys/class/net"
    rail = len(devices)
    for iface in sorted(net.iterdir()) if net.is_dir() else []:
        if iface.name in rdma_netdevs or not (iface / "device").exists():
            continue  # virtual interfaces (lo, bridges, veth) and the RDMA ports' own netdevs
        if read_text(iface / "type") == "32":
            continue  # IPoIB: its port is read as an InfiniBand port
        port = Port(iface.name, "eth", rail, iface, _present(iface, ETH_COUNTERS))
        port.state_path, port.rate_path = _file(iface / "operstate"), _file(iface / "speed")
        if port.counters:
            ports.append(port)
            rail += 1
    return ports


def _present(folder: Path, table) -> list[tuple[str, Path, bool, int]]:
    """The counters of ``table`` the port has, with their files; the others are left out."""
    return [(name, folder / rel, fast, scale) for name, rel, fast, scale in table if (folder / rel).is_file()]


def _numeric(path: Path):
    return (0, int(path.name)) if path.name.isdigit() else (1, path.name)


def _file(path: Path) -> Path | None:
    return path if path.is_file() else None


def read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


_RATE = re.compile(r"([0-9.]+)\s*Gb")


def parse_rate(kind: str, text: str) -> float:
    """Gb/s from an InfiniBand ``rate`` ("400 Gb/sec (4X NDR)") or an Ethernet ``speed`` (Mb/s)."""
    text = text.strip()
    if kind == "ib":
        m = _RATE.match(text)
        return float(m.group(1)) if m else 0.0
    try:
        mbps = int(text)
    except ValueError:
        return 0.0
    return mbps / 1000 if mbps > 0 else 0.0  # -1: no link


def parse_state(kind: str, text: str) -> int:
    """The InfiniBand state number ("4: ACTIVE"); Ethernet's operstate mapped onto it."""
    text = text.strip()
    if kind == "ib":
        head = text.split(":", 1)[0]
        return int(head) if head.isdigit() else 0
    return {"up": STATE_ACTIVE, "down": STATE_DOWN, "lowerlayerdown": STATE_DOWN}.get(text, 0)
