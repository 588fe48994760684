"""The node's network ports, sampled every 10 ms from sysfs.

The ports and their counters are found by ``myriad_agent.nics``; a counter a NIC does not have
is left out of everything, never invented.

A sampler thread reads the counters that show bursts and flaps (bytes each way, transmit wait,
link downs) every ``interval`` through file descriptors opened once (``os.pread``), and the
congestion and error counters, state and rate every tenth sample. Samples go into a
ring buffer of the last 60 s (flat arrays of raw values: the agent needs no NumPy).
``summary()`` turns the samples since the last report into per-port figures: bytes each way,
utilization over the 10 ms windows (mean, p50, p99, max), windows above 90% (bursts), CNP and
ECN per second, the share of windows spent waiting to transmit, error counts, and the times of
link flaps. ``trace()`` returns the windows themselves for the last seconds (a recorded trace).

A counter that falls from just below 2**32 or 2**64 wrapped and is followed through the wrap;
one that falls otherwise was reset (a driver reload, ``perfquery -R``): what it counted since
is taken as the change, and the port's summary says ``reset``.
"""

from __future__ import annotations

import os
import threading
import time
from array import array
from itertools import repeat
from pathlib import Path

from myriad_agent.nics import (
    CONGESTION,
    ERROR_COUNTERS,
    ROLES,
    STATE_NAMES,
    Port,
    parse_rate,
    parse_state,
    read_text,
)

SLOW_EVERY = 10
SAMPLER_NICE = -10  # the sampler thread's priority, where the agent may raise it
# real-time (SCHED_FIFO) at its lowest priority: ahead of every normal thread, behind every other
# real-time one; the sampler works a percent or two of a core in bursts of ~0.1 ms, and the
# kernel's real-time throttling bounds any thread of that class
SAMPLER_RT_PRIORITY = 1
BURST_UTIL = 90.0  # percent of the port's rate in one window
_TOP32, _TOP64 = 1 << 32, 1 << 64
# a fall from this close to the top of 32 (64) bits is a wrap; any other fall is a reset
_NEAR32, _NEAR64 = 1 << 28, 1 << 60


def counter_deltas(seq) -> tuple[list[int], bool]:
    """Per-window changes of one raw counter's samples, and whether it was reset in between.

    A value that falls from the last 1/16 below 2**32 wrapped at 32 bits (an Ethernet counter of
    a 32-bit kernel), one from the last 1/16 below 2**64 at 64 bits; any other fall is a reset,
    and the change is the new value (what it counted since)."""
    out: list[int] = []
    reset = False
    it = iter(seq)
    prev = next(it, None)
    for cur in it:
        if cur >= prev:
            out.append(cur - prev)
        elif _TOP32 - _NEAR32 <= prev < _TOP32:
            out.append(cur + _TOP32 - prev)
        elif prev >= _TOP64 - _NEAR64:
            out.append(cur + _TOP64 - prev)
        else:
            out.append(cur)
            reset = True
        prev = cur
    return out, reset


def percentile(ordered: list[float], q: float) -> float:
    """The q-th percentile of a sorted list, interpolated linearly (NumPy's default)."""
    if not ordered:
        return 0.0
    k = (len(ordered) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class NetSampler:
    """Samples ``ports`` every ``interval_s`` on its own thread into a ring of ``keep_s`` seconds
    (flat arrays of raw values: a bounded memory of capacity x counters x 8 bytes)."""

    def __init__(
        self, ports: list[Port], interval_s: float = 0.01, keep_s: float = 60.0, realtime: bool = True
    ):
        self.ports = ports
        self.interval_s = interval_s
        self.capacity = max(2, int(round(keep_s / interval_s)) + 1)
        self.columns: list[tuple[int, str]] = []  # (port index, counter name) per ring column
        self.paths: list[Path] = []
        self.fast: list[bool] = []
        self.scale: list[int] = []
        # the fast counters of every port first, so that a sample reads them into one slice
        for want_fast in (True, False):
            for p, port in enumerate(ports):
                for name, path, fast, factor in port.counters:
                    if fast == want_fast:
                        self.columns.append((p, name))
                        self.paths.append(path)
                        self.fast.append(fast)
                        self.scale.append(factor)
        self.nfast = sum(self.fast)
        self.index = {col: i for i, col in enumerate(self.columns)}
        self.width = n = len(self.columns)
        self.times = array("d", bytes(8 * self.capacity))  # wall clock of each sample
        self.late = array("d", bytes(8 * self.capacity))  # seconds behind its schedule
        self.values = array("Q", bytes(8 * self.capacity * n))
        self.states = array("B", bytes(self.capacity * len(ports)))
        self.rates = [parse_rate(p.kind, read_text(p.rate_path)) if p.rate_path else 0.0 for p in ports]
        self.count = 0  # samples taken; the newest is at (count - 1) % capacity
        self.reported = 0  # the sample the last summary ended on
        self.missed = 0  # schedule slots skipped because a sample ran late
        self.priority: int | None = None  # the sampler thread's nice value once it runs
        self.realtime = realtime  # ask for real-time scheduling (granted where the agent may)
        self.scheduling = ""  # what the sampler thread runs at once it runs, e.g. "real-time (FIFO 1)"
        self.busy_s = 0.0  # wall time spent taking samples (the work itself, not the waits)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fds: list[int] = []
        self._fast_fds: list[int] = []  # the fast counters' descriptors (the first columns)
        self._row = array("Q", bytes(8 * n))
        self._states = array("B", bytes(len(ports)))
        self._state_fds: list[int | None] = []
        self._rate_fds: list[int | None] = []

    # --- sampling -------------------------------------------------------------------------------

    def open(self) -> None:
        self._fds = [os.open(p, os.O_RDONLY) for p in self.paths]
        self._fast_fds = self._fds[: self.nfast]
        self._state_fds = [os.open(p.state_path, os.O_RDONLY) if p.state_path else None for p in self.ports]
        self._rate_fds = [os.open(p.rate_path, os.O_RDONLY) if p.rate_path else None for p in self.ports]
        self._read_slow_fields()

    def close(self) -> None:
        for fd in self._fds + [f for f in self._state_fds + self._rate_fds if f is not None]:
            os.close(fd)
        self._fds, self._state_fds, self._rate_fds = [], [], []
        self._fast_fds = []

    def _read_slow_fields(self) -> None:
        pread = os.pread
        for p, port in enumerate(self.ports):
            fd = self._rate_fds[p]
            if fd is not None:
                self.rates[p] = parse_rate(port.kind, pread(fd, 64, 0).decode(errors="replace"))
            fd = self._state_fds[p]
            if fd is not None:
                self._states[p] = parse_state(port.kind, pread(fd, 64, 0).decode(errors="replace"))

    def sample(self, late: float = 0.0, at: float | None = None) -> None:
        """One sample: the fast counters, and every SLOW_EVERY samples the rest, state and rate
        (``at``: the wall-clock time to record, for tests; default now)."""
        row = self._row
        slow = self.count % SLOW_EVERY == 0
        fds = self._fds if slow else self._fast_fds
        try:  # the common case in C: no bytecode per counter (map over os.pread, then int)
            row[: len(fds)] = array(
                "Q", map(int, map(os.pread, fds, repeat(32, len(fds)), repeat(0, len(fds))))
            )
        except (OSError, ValueError, OverflowError):
            for i, fd in enumerate(fds):
                try:  # noqa: SIM105 - contextlib.suppress costs a call per counter
                    row[i] = int(os.pread(fd, 32, 0))
                except (OSError, ValueError, OverflowError):
                    pass  # a counter that cannot be read this once keeps its last value
        if slow:
            self._read_slow_fields()
        slot = self.count % self.capacity
        n, p = self.width, len(self.ports)
        with self.lock:
            self.values[slot * n : slot * n + n] = row
            self.states[slot * p : slot * p + p] = self._states
            self.times[slot] = time.time() if at is None else at
            self.late[slot] = late
            self.count += 1

    def start(self) -> None:
        self.open()
        self._thread = threading.Thread(target=self._run, name="net-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._fds:
            self.close()

    def _run(self) -> None:
        self._raise_priority()
        clock, period = time.monotonic, self.interval_s
        due = clock()
        sleep = time.sleep  # cheaper than an Event's timed wait; stop() is seen within one period
        while not self._stop.is_set():
            now = clock()
            if now < due:
                sleep(due - now)
                now = clock()
            behind = now - due
            if behind >= period:  # a slot was lost (the machine stalled): keep the grid, count it
                skipped = int(behind // period)
                self.missed += skipped
                due += skipped * period
                behind = now - due
            self.sample(behind)
            self.busy_s += clock() - now
            due += period

    def _raise_priority(self) -> None:
        """Run this thread ahead of the node's other work so that a busy node does not delay its
        samples: real-time where asked and allowed (SAMPLER_RT_PRIORITY), else nice -10; an agent
        without the right to either (not root, no CAP_SYS_NICE) samples at normal priority."""
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, SAMPLER_NICE)
            self.priority = SAMPLER_NICE
        except (PermissionError, OSError):
            self.priority = os.getpriority(os.PRIO_PROCESS, tid)
        self.scheduling = f"normal (nice {self.priority})"
        if self.realtime:
            try:
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(SAMPLER_RT_PRIORITY))
                self.scheduling = f"real-time (FIFO {SAMPLER_RT_PRIORITY})"
            except (PermissionError, OSError, AttributeError):
                pass

    # --- reading the ring -----------------------------------------------------------------------

    def _window(
        self, first: int, end: int | None = None
    ) -> tuple[list[float], list[list[int]], list[list[int]], list[float]]:
        """Samples ``first`` .. ``end`` - 1 (default: the newest; clipped to the ring): times,
        each column's values, each port's states, lateness; oldest first."""
        n, p, cap = self.width, len(self.ports), self.capacity
        with self.lock:
            end = self.count if end is None else min(end, self.count)
            first = max(first, end - cap, 0)
            if first >= end:
                return [], [[] for _ in range(n)], [[] for _ in range(p)], []
            a, b = first % cap, (end - 1) % cap + 1  # slots a..b, wrapping when b <= a

            def take(arr, width, col):
                if b > a:
                    return list(arr[a * width + col : b * width : width])
                return list(arr[a * width + col :: width]) + list(arr[col : b * width : width])

            times = take(self.times, 1, 0)
            late = take(self.late, 1, 0)
            columns = [take(self.values, n, c) for c in range(n)]
            states = [take(self.states, p, c) for c in range(p)]
        return times, columns, states, late

    def summary(self) -> list[dict]:
        """Per-port figures for the samples since the previous summary, up to the newest sample
        that read every counter (so fast and slow counters cover the same span; the window
        before the first new sample is included, so no change between two reports is lost)."""
        with self.lock:
            count = self.count
        if count == 0:
            return []
        end = (count - 1) // SLOW_EVERY * SLOW_EVERY + 1  # one past the newest full sample
        out = self.summarize(max(self.reported - 1, 0), end)
        self.reported = end
        return out

    def _port_deltas(self, p: int, columns) -> tuple[dict[str, list[int]], dict[str, int], bool]:
        """A port's counters over the window: per-window changes (in the counters' units, bytes
        for data), the newest raw values, and whether any was reset."""
        deltas, newest, reset = {}, {}, False
        for name, *_ in self.ports[p].counters:
            c = self.index[(p, name)]
            values = columns[c]
            d, was_reset = counter_deltas(values)
            scale = self.scale[c]
            deltas[name] = [x * scale for x in d] if scale != 1 else d
            newest[name] = values[-1]
            reset = reset or was_reset
        return deltas, newest, reset

    def _spans(self, times: list[float]) -> list[float]:
        """Each window's length in seconds (a clock that did not move counts as one period)."""
        return [(b - a) if b > a else self.interval_s for a, b in zip(times, times[1:], strict=False)]

    def summarize(self, first: int, end: int | None = None) -> list[dict]:
        times, columns, states, _ = self._window(first, end)
        if not times:
            return []
        dt = self._spans(times)
        span = times[-1] - times[0]
        out = []
        for p, port in enumerate(self.ports):
            roles = ROLES[port.kind]
            rate_bytes = self.rates[p] * 1e9 / 8
            deltas, newest, reset = self._port_deltas(p, columns)
            entry: dict = {
                "port": port.name,
                "rail": port.rail,
                "seconds": round(span, 3),
                "state": STATE_NAMES.get(states[p][-1], "unknown"),
                "rate_gbps": float(self.rates[p]),
                "windows": len(dt),
                "counters": newest,
            }
            tx, rx = deltas.get(roles["tx"]), deltas.get(roles["rx"])
            if tx is not None:
                entry["tx_bytes"] = sum(tx)
            if rx is not None:
                entry["rx_bytes"] = sum(rx)
            ways = [w for w in (tx, rx) if w is not None]
            if ways and rate_bytes > 0 and dt:
                busiest = [max(pair) for pair in zip(*ways, strict=True)]
                # a window's timing error can read above the line: clipped to it
                util = sorted(
                    min(100.0, b / t / rate_bytes * 100.0) for b, t in zip(busiest, dt, strict=True)
                )
                entry["util"] = {
                    "mean": round(sum(util) / len(util), 2),
                    "p50": round(percentile(util, 50), 2),
                    "p99": round(percentile(util, 99), 2),
                    "max": round(util[-1], 2),
                }
                entry["bursts"] = sum(1 for u in util if u > BURST_UTIL)
            if span > 0:
                for name, figure in CONGESTION.items():
                    if name in deltas:
                        entry[figure] = round(sum(deltas[name]) / span, 2)
            wait = deltas.get(roles.get("wait", ""))
            if wait is not None and dt:
                entry["xmit_wait_share"] = round(sum(1 for w in wait if w > 0) / len(wait), 4)
            errors = {name: sum(deltas[name]) for name in ERROR_COUNTERS if name in deltas}
            errors = {name: count for name, count in errors.items() if count}
            if errors:
                entry["errors"] = errors
            downs = deltas.get(roles["down"], [])
            entry["flaps"] = [round(times[i + 1], 2) for i, d in enumerate(downs) if d > 0]
            entry["reset"] = reset
            out.append(entry)
        return out

    def trace(self, seconds: float = 60.0) -> dict:
        """The last ``seconds`` of 10 ms windows: per port, utilization each way (percent of its
        rate), the congestion counters' changes per window and the state's changes, as lists."""
        want = int(round(seconds / self.interval_s)) + 1
        with self.lock:
            end = self.count
        times, columns, states, _ = self._window(end - want)
        dt = self._spans(times)
        ports = []
        for p, port in enumerate(self.ports):
            roles = ROLES[port.kind]
            rate_bytes = self.rates[p] * 1e9 / 8 or 1.0
            deltas, _, _ = self._port_deltas(p, columns)
            series: dict = {"port": port.name}
            for way in ("tx", "rx"):
                if roles[way] in deltas:
                    series[f"{way}_util"] = [
                        round(min(100.0, b / t / rate_bytes * 100.0), 1)
                        for b, t in zip(deltas[roles[way]], dt, strict=True)
                    ]
            for name in CONGESTION:
                if name in deltas:
                    series[name] = deltas[name]
            # the state as (window, state) at the start and at each change: runs, not one per window
            changes, last = [], None
            for k, code in enumerate(states[p][1:]):
                if code != last:
                    changes.append([k, STATE_NAMES.get(code, "unknown")])
                    last = code
            series["states"] = changes
            ports.append(series)
        return {
            "start": times[0] if times else time.time(),
            "interval_ms": self.interval_s * 1000,
            "t_ms": [round((t - times[0]) * 1000, 1) for t in times[1:]],
            "ports": ports,
        }

    def jitter_ms(self) -> list[float]:
        """How late each sample in the ring ran behind its schedule, in ms."""
        return [x * 1000.0 for x in self._window(0)[3]]

    def inventory(self) -> list[dict]:
        return [port.describe(float(self.rates[p])) for p, port in enumerate(self.ports)]
