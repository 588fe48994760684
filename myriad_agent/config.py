"""The agent's settings: flags, else MYRIAD_AGENT_* environment variables, else the defaults.
A bad value stops the agent at start with a message naming the flag."""

from __future__ import annotations

import argparse
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Config:
    server: str
    token: str
    work_dir: Path
    period_s: float
    hostname: str
    address: str
    grace_s: float
    checkpoint_signal: int
    reconfigure_signal: int
    checkpoint_root: Path
    buffer_reports: int
    nvml: str  # "auto", "real", or "fake:<state file>"
    retry_max_s: float
    log_tail_lines: int
    net_interval_s: float  # 0: network ports not sampled
    net_realtime: bool  # the sampler thread asks for real-time scheduling
    sysfs_root: Path

    @property
    def credential_file(self) -> Path:
        return self.work_dir / "credential.json"


# flag, environment variable, default, help
OPTIONS = [
    ("--server", "MYRIAD_AGENT_SERVER", None, "the control plane's URL, e.g. https://myriad.example.com"),
    ("--token", "MYRIAD_AGENT_TOKEN", "", "one-time enrolment token (needed only for the first start)"),
    ("--work-dir", "MYRIAD_AGENT_WORK_DIR", "/var/lib/myriad-agent", "credential, state, job logs"),
    ("--period", "MYRIAD_AGENT_PERIOD_S", "5", "seconds between reports (the heartbeat)"),
    ("--hostname", "MYRIAD_AGENT_HOSTNAME", None, "the node's name in the inventory (default: this host's)"),
    (
        "--address",
        "MYRIAD_AGENT_ADDRESS",
        None,
        "where peers reach this node (MASTER_ADDR; default: hostname)",
    ),
    ("--grace", "MYRIAD_AGENT_GRACE_S", "30", "seconds between SIGTERM and SIGKILL when stopping a job"),
    ("--checkpoint-signal", "MYRIAD_AGENT_CHECKPOINT_SIGNAL", "SIGUSR1", "signal that asks a job to save"),
    (
        "--reconfigure-signal",
        "MYRIAD_AGENT_RECONFIGURE_SIGNAL",
        "SIGUSR2",
        "signal that tells a warm-restarted job its new placement ($MYRIAD_ASSIGNMENT_FILE)",
    ),
    (
        "--checkpoint-root",
        "MYRIAD_AGENT_CHECKPOINT_ROOT",
        None,
        "jobs' checkpoint folders (default: work-dir)",
    ),
    (
        "--buffer",
        "MYRIAD_AGENT_BUFFER",
        "720",
        "reports kept while the server is unreachable (oldest dropped)",
    ),
    ("--nvml", "MYRIAD_AGENT_NVML", "auto", "auto, real, or fake:<state file> (tests)"),
    ("--retry-max", "MYRIAD_AGENT_RETRY_MAX_S", "30", "longest wait between retries (with jitter)"),
    ("--log-tail", "MYRIAD_AGENT_LOG_TAIL_LINES", "200", "lines of each job's output kept for the API"),
    (
        "--net-interval-ms",
        "MYRIAD_AGENT_NET_INTERVAL_MS",
        "10",
        "ms between samples of the network ports' counters (0: not sampled)",
    ),
    (
        "--net-realtime",
        "MYRIAD_AGENT_NET_REALTIME",
        "yes",
        "yes: the network sampler runs real-time (SCHED_FIFO 1) where allowed, keeping its period on a "
        "busy node; no: nice -10",
    ),
    (
        "--sysfs-root",
        "MYRIAD_AGENT_SYSFS_ROOT",
        "/",
        "where sys/class/infiniband and sys/class/net are read (a fake tree in tests)",
    ),
]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="myriad-agent", description="The node agent of a Myriad GPU cluster.")
    for flag, env, default, text in OPTIONS:
        shown = f" [{env}; default {default}]" if default not in (None, "") else f" [{env}]"
        p.add_argument(flag, default=None, help=text + shown)
    p.add_argument("--check", action="store_true", help="check the settings and the server, then exit")
    return p


def _number(flag: str, raw: str, lo: float, hi: float, whole: bool = False) -> float:
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise ConfigError(f"{flag}: {raw!r} is not a {'whole ' if whole else ''}number") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{flag}: {raw} is outside {lo:g}..{hi:g}")
    return value


def load(argv: list[str] | None = None, environ: dict | None = None) -> tuple[Config, argparse.Namespace]:
    environ = os.environ if environ is None else environ
    args = parser().parse_args(argv)
    raw = {}
    for flag, env, default, _ in OPTIONS:
        value = getattr(args, flag[2:].replace("-", "_"))
        raw[flag] = value if value is not None else environ.get(env, default)
    server = (raw["--server"] or "").rstrip("/")
    url = urlparse(server)
    if not server:
        raise ConfigError("--server: the control plane's URL is required (or MYRIAD_AGENT_SERVER)")
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ConfigError(f"--server: {server!r} is not an http(s) URL")
    hostname = raw["--hostname"] or socket.getfqdn()
    signals = {flag: _signal(flag, raw[flag]) for flag in ("--checkpoint-signal", "--reconfigure-signal")}
    nvml = raw["--nvml"]
    if nvml not in ("auto", "real") and not nvml.startswith("fake:"):
        raise ConfigError(f"--nvml: {nvml!r} is not auto, real or fake:<state file>")
    work = Path(raw["--work-dir"])
    return (
        Config(
            server=server,
            token=raw["--token"] or "",
            work_dir=work,
            period_s=_number("--period", raw["--period"], 0.2, 3600),
            hostname=hostname,
            address=raw["--address"] or hostname,
            grace_s=_number("--grace", raw["--grace"], 0, 3600),
            checkpoint_signal=signals["--checkpoint-signal"],
            reconfigure_signal=signals["--reconfigure-signal"],
            checkpoint_root=Path(raw["--checkpoint-root"])
            if raw["--checkpoint-root"]
            else work / "checkpoints",
            buffer_reports=int(_number("--buffer", raw["--buffer"], 1, 1_000_000, whole=True)),
            nvml=nvml,
            retry_max_s=_number("--retry-max", raw["--retry-max"], 0.1, 3600),
            log_tail_lines=int(_number("--log-tail", raw["--log-tail"], 1, 100_000, whole=True)),
            net_interval_s=_net_interval(raw["--net-interval-ms"]),
            net_realtime=_yes_no("--net-realtime", raw["--net-realtime"]),
            sysfs_root=Path(raw["--sysfs-root"]),
        ),
        args,
    )


def _yes_no(flag: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("yes", "no"):
        raise ConfigError(f"{flag}: {raw!r} is not yes or no")
    return value == "yes"


def _net_interval(raw: str) -> float:
    ms = _number("--net-interval-ms", raw, 0, 60_000)
    if 0 < ms < 1:
        raise ConfigError(f"--net-interval-ms: {raw} is below 1 ms (0 turns sampling off)")
    return ms / 1000


def _signal(flag: str, value: str) -> int:
    name = value.upper() if value.upper().startswith("SIG") else f"SIG{value.upper()}"
    if not hasattr(signal, name):
        raise ConfigError(f"{flag}: {value!r} is not a signal")
    return int(getattr(signal, name))
