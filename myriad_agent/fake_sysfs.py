"""A fake sysfs tree of network ports, for tests and the demo (as ``fake_nvml`` is for GPUs).

``build(root)`` lays out ``<root>/sys/class/infiniband/mlx5_<i>/ports/1/`` (counters, RoCE
hw_counters, state, rate) and optionally Ethernet NICs under ``<root>/sys/class/net/``, the
files the agent reads on a real node. ``FakePorts`` changes them: counters grow, ports go down
and come back, CNPs storm. Each value is written in place at a fixed width, so a reader never
sees a half-written number. ``python -m myriad_agent.fake_sysfs ROOT`` builds a tree (or takes the one
there) and keeps writing a training job's traffic into it: every step, the all-reduce runs the ports near line
rate for a fraction of the step and the rest of the step is quiet, so 10 ms windows see bursts a
10 s mean hides.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from myriad_agent.nics import ETH_COUNTERS, IB_COUNTERS

WIDTH = 20
IB_STATES = {"active": "4: ACTIVE", "down": "1: DOWN", "init": "2: INIT"}


def build(
    root: Path | str,
    ib_ports: int = 8,
    rate_gbps: int = 400,
    roce: bool = True,
    eth: int = 0,
    eth_speed_mbps: int = 100_000,
) -> list[str]:
    """Lay out the tree; the port names the agent will report, in its order."""
    root = Path(root)
    names = []
    for i in range(ib_ports):
        dev = root / f"sys/class/infiniband/mlx5_{i}"
        port = dev / "ports/1"
        for _name, rel, _fast, _scale in IB_COUNTERS:
            if rel.startswith("hw_counters/") and not roce:
                continue
            _write(port / rel, 0)
        (port / "state").write_text(IB_STATES["active"] + "\n")
        (port / "rate").write_text(f"{rate_gbps} Gb/sec (4X NDR)\n")
        (port / "link_layer").write_text("Ethernet\n" if roce else "InfiniBand\n")
        if roce:  # the RoCE port's netdev: the agent reads the RDMA port, not this interface
            netdev = root / f"sys/class/net/ens{i}np0"
            _eth(netdev, eth_speed_mbps)
            (dev / "device/net").mkdir(parents=True, exist_ok=True)
            (dev / "device/net" / netdev.name).mkdir(exist_ok=True)
        names.append(f"mlx5_{i}/1")
    for j in range(eth):
        _eth(root / f"sys/class/net/eth{j}", eth_speed_mbps)
        names.append(f"eth{j}")
    lo = root / "sys/class/net/lo/statistics"  # virtual: no device, never reported
    lo.mkdir(parents=True, exist_ok=True)
    _write(lo / "tx_bytes", 0)
    return names


def _eth(folder: Path, speed_mbps: int) -> None:
    for _name, rel, _fast, _scale in ETH_COUNTERS:
        _write(folder / rel, 0)
    (folder / "device").mkdir(exist_ok=True)
    (folder / "operstate").write_text("up\n")
    (folder / "speed").write_text(f"{speed_mbps}\n")
    (folder / "type").write_text("1\n")


def _write(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value:>{WIDTH}}\n")


class FakePorts:
    """Changes the counters of a tree made by ``build``; ports named as the agent names them."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._fds: dict[Path, int] = {}

    def _path(self, port: str, counter: str) -> Path:
        if "/" in port:
            dev, n = port.split("/")
            rel = dict((name, rel) for name, rel, *_ in IB_COUNTERS)[counter]
            return self.root / f"sys/class/infiniband/{dev}/ports/{n}/{rel}"
        rel = dict((name, rel) for name, rel, *_ in ETH_COUNTERS)[counter]
        return self.root / f"sys/class/net/{port}/{rel}"

    def _fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDWR)
        return fd

    def get(self, port: str, counter: str) -> int:
        return int(os.pread(self._fd(self._path(port, counter)), 64, 0))

    def set(self, port: str, counter: str, value: int) -> None:
        os.pwrite(self._fd(self._path(port, counter)), f"{value:>{WIDTH}}\n".encode(), 0)

    def add(self, port: str, counter: str, amount: int) -> None:
        self.set(port, counter, self.get(port, counter) + int(amount))

    def add_bytes(self, port: str, tx: int, rx: int) -> None:
        """Bytes each way (InfiniBand counts 4-byte words; Ethernet bytes)."""
        if "/" in port:
            self.add(port, "port_xmit_data", tx // 4)
            self.add(port, "port_rcv_data", rx // 4)
        else:
            self.add(port, "tx_bytes", tx)
            self.add(port, "rx_bytes", rx)

    def set_state(self, port: str, state: str) -> None:
        if "/" in port:
            dev, n = port.split("/")
            (self.root / f"sys/class/infiniband/{dev}/ports/{n}/state").write_text(IB_STATES[state] + "\n")
        else:
            text = "up" if state == "active" else state
            (self.root / f"sys/class/net/{port}/operstate").write_text(text + "\n")

    def flap(self, port: str) -> None:
        """The link goes down and comes back: ``link_downed`` counts one more."""
        self.add(port, "link_downed" if "/" in port else "carrier_down_count", 1)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def drive(
    root: Path | str,
    ports: list[str],
    rate_gbps: float,
    step_s: float = 1.0,
    burst_share: float = 0.15,
    burst_util: float = 0.95,
    quiet_util: float = 0.03,
    interval_s: float = 0.005,
    until: float | None = None,
) -> None:
    """Write a training job's traffic: ``burst_share`` of each step at ``burst_util`` of line
    rate (the all-reduce), the rest at ``quiet_util``; every ``interval_s`` until ``until``."""
    fake = FakePorts(root)
    line = rate_gbps * 1e9 / 8
    last = time.monotonic()
    try:
        while until is None or time.time() < until:
            time.sleep(interval_s)
            now = time.monotonic()
            phase = (time.time() % step_s) / step_s
            util = burst_util if phase < burst_share else quiet_util
            amount = int(line * util * (now - last))
            last = now
            for port in ports:
                fake.add_bytes(port, amount, amount)
    finally:
        fake.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m myriad_agent.fake_sysfs", description=__doc__.split("\n")[0])
    p.add_argument("root", help="folder to lay the tree out under (the agent's --sysfs-root)")
    p.add_argument("--ports", type=int, default=8, help="RDMA ports (default 8)")
    p.add_argument("--rate", type=int, default=400, help="each port's rate in Gb/s (default 400)")
    p.add_argument("--step", type=float, default=1.0, help="the job's step time in s (default 1)")
    p.add_argument("--burst-share", type=float, default=0.15, help="share of a step in all-reduce")
    p.add_argument("--seconds", type=float, default=None, help="stop after this long (default: never)")
    args = p.parse_args(argv)
    if (Path(args.root) / "sys/class/infiniband").is_dir():  # a tree an agent reads: keep its counters
        names = [f"{d.name}/1" for d in sorted((Path(args.root) / "sys/class/infiniband").iterdir())]
    else:
        names = build(args.root, ib_ports=args.ports, rate_gbps=args.rate)
    until = time.time() + args.seconds if args.seconds else None
    drive(args.root, names, args.rate, step_s=args.step, burst_share=args.burst_share, until=until)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
