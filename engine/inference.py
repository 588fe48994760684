"""Inference services: load profiles and the replica autoscaler (pure).

A service has replicas of a fixed size (a fraction of a GPU, one GPU or several) and a capacity
per replica in requests/s. Its load follows a profile over the day:

- ``diurnal``: a cosine between ``trough_rps`` and ``peak_rps`` peaking at ``peak_hour`` (UTC);
- ``points``: [[hour, rps], ...] over the day, interpolated linearly and wrapping at midnight.

Either may be modulated by a per-minute burst pattern (multipliers with mean 1, repeated every
hour): ``burst: "azure-code"`` or ``"azure-conv"`` use the minute-by-minute request counts of the
Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA'24; CC BY 4.0), so replicas see the
real minute-scale burstiness of a coding assistant or a chat service.

The autoscaler keeps ``ceil(load * (1 + headroom) / capacity)`` replicas within
[min_replicas, max_replicas]. It scales up at once and down only after the load has stayed low for
``scale_down_delay_s`` (no flapping on bursts). The inference queue's priority and its cohort's
reclaim policy make peak replicas take back GPUs that training borrowed (training shrinks or is
preempted and requeued with its progress); in the valley training borrows them again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.azure_bursts import PER_MINUTE

SECONDS_PER_DAY = 86400.0


def replica_topology(replica_gpus: int) -> str:
    """The largest domain one inference replica may span: one node up to 8 GPUs, else one pod."""
    return "node" if replica_gpus <= 8 else "pod"


def _burst(name: str) -> tuple[float, ...]:
    counts = PER_MINUTE.get(name)
    if counts is None:
        raise ValueError(f"load_profile.burst {name!r} is unknown; known: {', '.join(PER_MINUTE)}")
    mean = sum(counts) / len(counts)
    return tuple(c / mean for c in counts)


@dataclass(frozen=True)
class LoadProfile:
    kind: str = "diurnal"
    trough_rps: float = 0.0
    peak_rps: float = 0.0
    peak_hour: float = 14.0
    points: tuple[tuple[float, float], ...] = ()
    burst: str = ""
    _multipliers: tuple[float, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_dict(cls, data: dict) -> LoadProfile:
        if not isinstance(data, dict):
            raise ValueError("load_profile must be an object")
        allowed = {"kind", "trough_rps", "peak_rps", "peak_hour", "points", "burst"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"load_profile.{unknown[0]} is not a profile field")
        kind = data.get("kind", "diurnal")
        burst = data.get("burst", "") or ""
        multipliers = _burst(burst) if burst else ()
        if kind == "diurnal":
            trough, peak = _number(data, "trough_rps", 0.0), _number(data, "peak_rps", None)
            hour = _number(data, "peak_hour", 14.0)
            if peak < trough:
                raise ValueError("load_profile.peak_rps must be at least trough_rps")
            if not 0 <= hour < 24:
                raise ValueError("load_profile.peak_hour must be in [0, 24)")
            return cls("diurnal", trough, peak, hour, (), burst, multipliers)
        if kind == "points":
            raw = data.get("points")
            if not isinstance(raw, list) or not raw:
                raise ValueError("load_profile.points must be a non-empty list of [hour, rps] pairs")
            points = []
            for i, p in enumerate(raw):
                if (
                    not isinstance(p, list | tuple)
                    or len(p) != 2
                    or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in p)
                ):
                    raise ValueError(f"load_profile.points[{i}] must be [hour, rps]")
                if not 0 <= p[0] < 24 or p[1] < 0:
                    raise ValueError(f"load_profile.points[{i}]: hour in [0, 24), rps >= 0")
                points.append((float(p[0]), float(p[1])))
            points.sort()
            return cls("points", 0.0, max(p[1] for p in points), 0.0, tuple(points), burst, multipliers)
        raise ValueError(f"load_profile.kind {kind!r} is unknown; known: diurnal, points")

    def as_dict(self) -> dict:
        if self.kind == "points":
            data = {"kind": "points", "points": [list(p) for p in self.points]}
        else:
            data = {
                "kind": "diurnal",
                "trough_rps": self.trough_rps,
                "peak_rps": self.peak_rps,
                "peak_hour": self.peak_hour,
            }
        if self.burst:
            data["burst"] = self.burst
        return data

    def rate(self, t: float) -> float:
        """Requests per second at ``t`` (epoch seconds, UTC)."""
        hour = (t % SECONDS_PER_DAY) / 3600.0
        if self.kind == "points":
            base = _interpolate(self.points, hour)
        else:
            phase = 2 * math.pi * (hour - self.peak_hour) / 24.0
            base = self.trough_rps + (self.peak_rps - self.trough_rps) * (1 + math.cos(phase)) / 2
        if self._multipliers:
            minute = int(t // 60) % len(self._multipliers)
            base *= self._multipliers[minute]
        return base


def _number(data: dict, key: str, default: float | None) -> float:
    value = data.get(key, default)
    if value is None:
        raise ValueError(f"load_profile.{key} is required")
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ValueError(f"load_profile.{key} must be a number >= 0, got {value!r}")
    return float(value)


def _interpolate(points: tuple[tuple[float, float], ...], hour: float) -> float:
    if len(points) == 1:
        return points[0][1]
    # wrap: the last point connects to the first one, 24 h later
    extended = [(points[-1][0] - 24, points[-1][1]), *points, (points[0][0] + 24, points[0][1])]
    for (h0, r0), (h1, r1) in zip(extended, extended[1:], strict=False):
        if h0 <= hour <= h1:
            return r0 if h1 == h0 else r0 + (r1 - r0) * (hour - h0) / (h1 - h0)
    return points[-1][1]


@dataclass(frozen=True)
class ScaleDecision:
    load_rps: float
    desired: int  # replicas the load calls for (within bounds)
    target: int  # replicas to have now (desired, or more while a scale-down waits)
    reason: str


def decide(
    load_rps: float,
    *,
    replicas: int,
    capacity_rps: float,
    headroom: float,
    min_replicas: int,
    max_replicas: int,
    low_since: float | None,
    now: float,
    scale_down_delay_s: float,
) -> ScaleDecision:
    """How many replicas to run now. ``replicas``: replicas running or pending; ``low_since``: since
    when the load has called for fewer replicas than that (None: it does not)."""
    need = math.ceil(load_rps * (1 + headroom) / capacity_rps - 1e-9) if capacity_rps > 0 else max_replicas
    desired = max(min_replicas, min(max_replicas, need))
    if desired > replicas:
        return ScaleDecision(
            load_rps, desired, desired, f"load {load_rps:.1f} req/s needs {desired} replicas (had {replicas})"
        )
    if desired < replicas:
        if low_since is not None and now - low_since >= scale_down_delay_s:
            return ScaleDecision(
                load_rps,
                desired,
                desired,
                f"load {load_rps:.1f} req/s needs {desired} replicas for {now - low_since:.0f} s: "
                f"scaling down from {replicas}",
            )
        return ScaleDecision(load_rps, desired, replicas, "waiting before scaling down")
    return ScaleDecision(load_rps, desired, replicas, "steady")
