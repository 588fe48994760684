"""GPU readings and XIDs through NVML (nvidia-ml-py's ``pynvml`` module, or the fake one in
tests). Every reading a GPU does not support is left out, never invented; a GPU NVML has lost is
reported as lost. XIDs come from NVML's event set (critical XID events), so each occurrence is
seen, repeats included, not a last value that a poll would miss."""

from __future__ import annotations

import contextlib
import importlib
import threading
import time


def load_nvml(choice: str):
    """The NVML module: ``real`` (pynvml, must load), ``auto`` (the same), ``fake:<state file>``."""
    if choice.startswith("fake:"):
        from myriad_agent import fake_nvml

        fake_nvml.use_state_file(choice[5:])
        return fake_nvml
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver, no library: say so at start
        raise RuntimeError(f"NVML did not load ({exc}); is the NVIDIA driver installed?") from exc
    return nvml


class GPUReader:
    def __init__(self, nvml):
        self.nvml = nvml
        self.count = nvml.nvmlDeviceGetCount()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]
        self.uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in self.handles]
        self.names = [_text(nvml.nvmlDeviceGetName(h)) for h in self.handles]
        self.xids: list[dict] = []
        self.xid_arrived = threading.Event()  # an XID is waiting: the agent reports at once
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._links: dict[int, list[int]] = {}  # GPU -> its active NVLinks (read once)
        self._nvlink_last: dict[int, tuple[float, int, int]] = {}  # GPU -> (when, tx, rx bytes)

    def _try(self, fn, *args):
        """A reading, or None when the GPU does not support it; raises _Lost for a lost GPU."""
        nvml = self.nvml
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _Lost from exc
            return None

    def read(self) -> list[dict]:
        return [self.read_one(i) for i in range(self.count)]

    def read_one(self, i: int) -> dict:
        nvml, h = self.nvml, self.handles[i]
        out: dict = {"index": i, "uuid": self.uuids[i]}
        try:
            util = self._try(nvml.nvmlDeviceGetUtilizationRates, h)
            if util is not None:
                out["util"] = util.gpu
            mem = self._try(nvml.nvmlDeviceGetMemoryInfo, h)
            if mem is not None:
                out["memory_used_mib"] = mem.used / 2**20
                out["memory_total_mib"] = mem.total / 2**20
            _put(out, "temperature_c", self._try(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU))
            power = self._try(nvml.nvmlDeviceGetPowerUsage, h)
            _put(out, "power_w", power / 1000 if power is not None else None)
            limit = self._try(nvml.nvmlDeviceGetEnforcedPowerLimit, h)
            _put(out, "power_limit_w", limit / 1000 if limit is not None else None)
            _put(out, "sm_clock_mhz", self._try(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM))
            for kind, kname in (
                (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
                (nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected"),
            ):
                for counter, cname in (
                    (nvml.NVML_VOLATILE_ECC, "volatile"),
                    (nvml.NVML_AGGREGATE_ECC, "aggregate"),
                ):
                    _put(
                        out,
                        f"ecc_{kname}_{cname}",
                        self._try(nvml.nvmlDeviceGetTotalEccErrors, h, kind, counter),
                    )
            self._pages(h, out)
            rows = self._try(nvml.nvmlDeviceGetRemappedRows, h)
            if rows is not None:
                corr, unc, pending, failed = rows
                out.update(
                    remapped_rows_correctable=corr,
                    remapped_rows_uncorrectable=unc,
                    remap_pending=bool(pending),
                    remap_failure=bool(failed),
                )
            self._nvlink(h, out)
            self._nvlink_throughput(i, h, out)
            _put(out, "pcie_replays", self._try(nvml.nvmlDeviceGetPcieReplayCounter, h))
        except _Lost:
            out["lost"] = True
        return out

    def _pages(self, h, out: dict) -> None:
        nvml = self.nvml
        total = None
        for cause in (
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        ):
            pages = self._try(nvml.nvmlDeviceGetRetiredPages, h, cause)
            if pages is not None:
                total = (total or 0) + len(pages)
        _put(out, "retired_pages", total)
        pending = self._try(nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
        if pending is not None:
            out["retired_pages_pending"] = bool(pending)

    def _nvlink(self, h, out: dict) -> None:
        nvml = self.nvml
        sums = {"nvlink_crc_errors": None, "nvlink_replay_errors": None, "nvlink_recovery_errors": None}
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            if not self._try(nvml.nvmlDeviceGetNvLinkState, h, link):
                continue
            for key, counter in (
                ("nvlink_crc_errors", nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                ("nvlink_replay_errors", nvml.NVML_NVLINK_ERROR_DL_REPLAY),
                ("nvlink_recovery_errors", nvml.NVML_NVLINK_ERROR_DL_RECOVERY),
            ):
                value = self._try(nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
                if value is not None:
                    sums[key] = (sums[key] or 0) + value
        for key, value in sums.items():
            _put(out, key, value)

    def _nvlink_throughput(self, i: int, h, out: dict) -> None:
        """NVLink data bytes each way since the driver loaded (NVML field values, summed over the
        active links) and their rate since the last read; left out where NVML has no such field."""
        nvml = self.nvml
        fields = getattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None)
        links = self._links.get(i)
        if fields is None or not hasattr(nvml, "nvmlDeviceGetFieldValues"):
            return
        if links is None:
            links = self._links[i] = [
                link
                for link in range(nvml.NVML_NVLINK_MAX_LINKS)
                if self._try(nvml.nvmlDeviceGetNvLinkState, h, link)
            ]
        if not links:
            return
        ids = [(f, link) for f in (fields, nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) for link in links]
        values = self._try(nvml.nvmlDeviceGetFieldValues, h, ids)
        if values is None:
            return
        kib = {"tx": 0, "rx": 0}
        for (field, _), v in zip(ids, values, strict=True):
            if v.nvmlReturn != 0:
                return  # a field the GPU does not support: the figure is left out, not guessed
            kib["tx" if field == fields else "rx"] += int(v.value.ullVal)
        now = time.monotonic()
        tx, rx = kib["tx"] * 1024, kib["rx"] * 1024
        out["nvlink_tx_bytes"], out["nvlink_rx_bytes"] = tx, rx
        last = self._nvlink_last.get(i)
        if last is not None and now > last[0] and tx >= last[1] and rx >= last[2]:
            seconds = now - last[0]
            out["nvlink_tx_gbps"] = round((tx - last[1]) * 8 / seconds / 1e9, 3)
            out["nvlink_rx_gbps"] = round((rx - last[2]) * 8 / seconds / 1e9, 3)
        self._nvlink_last[i] = (now, tx, rx)

    # --- XIDs ---------------------------------------------------------------------------------

    def start_xid_watch(self) -> threading.Thread:
        """A thread that waits on NVML's event set for critical XID errors on every GPU."""
        nvml = self.nvml
        events = nvml.nvmlEventSetCreate()
        for h in self.handles:
            # a GPU without XID events is read by polling only
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
        thread = threading.Thread(target=self._watch, args=(events,), name="xid-events", daemon=True)
        thread.start()
        return thread

    def _watch(self, events) -> None:
        nvml = self.nvml
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait(events, 500)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != nvml.NVML_ERROR_TIMEOUT:
                    time.sleep(0.5)
                continue
            if data.eventType != nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                index = nvml.nvmlDeviceGetIndex(data.device)
            except nvml.NVMLError:
                continue
            with self.lock:
                self.xids.append({"gpu": int(index), "xid": int(data.eventData), "at": time.time()})
            self.xid_arrived.set()

    def take_xids(self) -> list[dict]:
        with self.lock:
            taken, self.xids = self.xids, []
        return taken

    def stop(self) -> None:
        self._stop.set()


class _Lost(Exception):
    pass


def _put(out: dict, key: str, value) -> None:
    if value is not None:
        out[key] = value


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
