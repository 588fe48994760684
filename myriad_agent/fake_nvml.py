"""A stand-in for nvidia-ml-py's ``pynvml`` with the calls the agent makes, for tests and for
machines without GPUs: the same function names, constants and NVMLError codes. Its GPUs and their
readings come from a JSON state file, re-read on every call so a test can change them while the
agent runs; XIDs are injected by appending lines ``{"gpu": 3, "xid": 79}`` to ``<state>.xids``,
which the event set delivers once each, in order, as NVML's would.

State file: {"gpus": 8, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-node-1", "util": 40,
"memory_total_mib": 81559, "power_limit_w": 700, "nvlinks": 18,
"gpu": {"3": {"ecc_uncorrected_volatile": 2, "remap_failure": true, "lost": true, "util": 99}}}
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
nvmlEventTypeXidCriticalError = 0x8
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_SUCCESS = 0


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


_state_file: Path | None = None
_lock = threading.Lock()
_xid_offset = 0


def use_state_file(path: str) -> None:
    global _state_file, _xid_offset
    _state_file, _xid_offset = Path(path), 0
    if not _state_file.exists():
        raise RuntimeError(f"fake NVML: no state file {path}")


def _state() -> dict:
    return json.loads(_state_file.read_text()) if _state_file else {"gpus": 0}


def _gpu(h) -> dict:
    state = _state()
    values = {
        "util": state.get("util", 0),
        "memory_total_mib": state.get("memory_total_mib", 81559),
        "power_limit_w": state.get("power_limit_w", 700),
    }
    values.update(state.get("gpu", {}).get(str(h.index), {}))
    if values.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return values


def nvmlInit() -> None:
    if _state_file is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return "fake"


def nvmlDeviceGetCount() -> int:
    return int(_state().get("gpus", 0))


def nvmlDeviceGetHandleByIndex(index: int):
    return SimpleNamespace(index=index)


def nvmlDeviceGetIndex(h) -> int:
    return h.index


def nvmlDeviceGetUUID(h) -> str:
    return f"{_state().get('uuid', 'GPU-fake')}-{h.index}"


def nvmlDeviceGetName(h) -> str:
    return _state().get("name", "NVIDIA H100 80GB HBM3")


def nvmlDeviceGetUtilizationRates(h):
    g = _gpu(h)
    return SimpleNamespace(gpu=int(g["util"]), memory=int(g["util"]) // 2)


def nvmlDeviceGetMemoryInfo(h):
    g = _gpu(h)
    total = int(g["memory_total_mib"] * 2**20)
    used = int(total * g.get("memory_share", g["util"] / 100 * 0.9))
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetTemperature(h, sensor: int) -> int:
    g = _gpu(h)
    return int(g.get("temperature_c", 35 + 0.4 * g["util"]))


def nvmlDeviceGetPowerUsage(h) -> int:
    g = _gpu(h)
    return int(1000 * g.get("power_w", 90 + g["util"] / 100 * (g["power_limit_w"] - 90)))


def nvmlDeviceGetEnforcedPowerLimit(h) -> int:
    return int(1000 * _gpu(h)["power_limit_w"])


def nvmlDeviceGetClockInfo(h, clock: int) -> int:
    return int(_gpu(h).get("sm_clock_mhz", 1980))


def nvmlDeviceGetTotalEccErrors(h, kind: int, counter: int) -> int:
    g = _gpu(h)
    name = "corrected" if kind == NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
    return int(g.get(f"ecc_{name}_{'volatile' if counter == NVML_VOLATILE_ECC else 'aggregate'}", 0))


def nvmlDeviceGetRetiredPages(h, cause: int) -> list[int]:
    return list(range(int(_gpu(h).get("retired_pages", 0)))) if cause == 0 else []


def nvmlDeviceGetRetiredPagesPendingStatus(h) -> int:
    return int(bool(_gpu(h).get("retired_pages_pending")))


def nvmlDeviceGetRemappedRows(h) -> tuple[int, int, int, int]:
    g = _gpu(h)
    return (
        int(g.get("remapped_rows_correctable", 0)),
        int(g.get("remapped_rows_uncorrectable", 0)),
        int(bool(g.get("remap_pending"))),
        int(bool(g.get("remap_failure"))),
    )


def nvmlDeviceGetNvLinkState(h, link: int) -> int:
    return int(link < int(_state().get("nvlinks", 18)))


def nvmlDeviceGetNvLinkErrorCounter(h, link: int, counter: int) -> int:
    g = _gpu(h)
    key = {0: "nvlink_replay_errors", 1: "nvlink_recovery_errors", 2: "nvlink_crc_errors"}[counter]
    return int(g.get(key, 0)) if link == 0 else 0  # the whole count on link 0


def nvmlDeviceGetFieldValues(h, field_ids):
    """NVLink throughput counters (KiB since the driver loaded) per link, as NVML's field values:
    a GPU's ``nvlink_tx_kib``/``nvlink_rx_kib`` spread over its links; other fields unsupported."""
    g, links = _gpu(h), int(_state().get("nvlinks", 18))
    out = []
    for field in field_ids:
        fid, scope = field if isinstance(field, tuple) else (field, 0)
        key = {138: "nvlink_tx_kib", 139: "nvlink_rx_kib"}.get(fid)
        ok = key is not None and key in g and scope < links
        value = SimpleNamespace(ullVal=int(g.get(key, 0)) // max(links, 1) if ok else 0)
        out.append(
            SimpleNamespace(fieldId=fid, scopeId=scope, nvmlReturn=NVML_SUCCESS if ok else 3, value=value)
        )
    return out


def nvmlDeviceGetPcieReplayCounter(h) -> int:
    return int(_gpu(h).get("pcie_replays", 0))


def nvmlEventSetCreate():
    return SimpleNamespace(devices=set())


def nvmlDeviceRegisterEvents(h, types: int, event_set) -> None:
    event_set.devices.add(h.index)


def nvmlEventSetFree(event_set) -> None:
    event_set.devices.clear()


def nvmlEventSetWait(event_set, timeout_ms: int):
    """The next injected XID for a registered GPU, or NVMLError(TIMEOUT) after ``timeout_ms``."""
    global _xid_offset
    deadline = time.monotonic() + timeout_ms / 1000
    path = Path(f"{_state_file}.xids") if _state_file else None
    while True:
        with _lock:
            if path is not None and path.exists():
                with open(path, "rb") as f:
                    f.seek(_xid_offset)
                    line = f.readline()
                    if line.endswith(b"\n"):
                        _xid_offset += len(line)
                        event = json.loads(line)
                        if event["gpu"] in event_set.devices:
                            return SimpleNamespace(
                                device=SimpleNamespace(index=event["gpu"]),
                                eventType=nvmlEventTypeXidCriticalError,
                                eventData=int(event["xid"]),
                                gpuInstanceId=0,
                                computeInstanceId=0,
                            )
                        continue
        if time.monotonic() >= deadline:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        time.sleep(0.05)
