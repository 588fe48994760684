"""Workloads for the simulator, calibrated to published trace summaries (pure, seeded).

- Run times: the 201 quantiles (every 0.5%) of the Philly run-time sample (Jeon et al., ATC'19;
  `philly_runtime.csv` of alibaba/clusterdata cluster-trace-gpu-v2020, CC BY 4.0; median 1,186 s,
  mean 14,613 s), sampled by inverse transform with linear interpolation.
- Sizes and outcomes from a published summary (``trace``): Acme's LLM cluster Kalos (Hu et al.,
  NSDI'24, `cluster_summary.csv`, CC BY 4.0; the default): median 1 GPU, mean 26.77, at most
  1,024, 39.7% fail and 6.2% are cancelled; or Helios (Hu et al., SC'21,
  `helios_cluster_summary.csv`): mean 3.716 GPUs, at most 2,048, 15.5% fail, 22.1% are cancelled.
  55% of jobs take 1 GPU, the rest powers of two with a probability falling geometrically per
  doubling at the rate that gives the mean; failed and cancelled jobs stop at a uniformly drawn
  point of their run.
- Large pretraining gangs of 1,024 to 16,384 GPUs running for days fill the cluster up to the
  target load, the way LLM clusters are used; an optional share of them is elastic.
A workload can also be read from a file (sim.simulation.load_workload).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sim.traces import PHILLY_RUNTIME_QUANTILES

ONE_GPU_SHARE = 0.55  # both summaries have a median of 1 GPU; the share above a half is an assumption


@dataclass(frozen=True)
class TraceProfile:
    """Job sizes and outcomes of a published cluster summary."""

    name: str
    mean_gpus: float
    max_gpus: int
    failed: float
    cancelled: float

    def size_probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """Sizes 1, 2, 4 .. max_gpus: 1 GPU with ONE_GPU_SHARE, the rest falling geometrically per
        doubling at the rate that gives ``mean_gpus`` (found by bisection)."""
        k = np.arange(1, int(np.log2(self.max_gpus)) + 1)
        sizes = np.concatenate([[1], 2**k])

        def probabilities(decay: float) -> np.ndarray:
            w = decay**k
            return np.concatenate([[ONE_GPU_SHARE], w / w.sum() * (1 - ONE_GPU_SHARE)])

        lo, hi = 1e-3, 2.0
        for _ in range(80):
            mid = (lo + hi) / 2
            if (probabilities(mid) * sizes).sum() < self.mean_gpus:
                lo = mid
            else:
                hi = mid
        return sizes, probabilities((lo + hi) / 2)


# Acme (Hu et al., NSDI'24) cluster_summary.csv, Kalos: 26.77 GPUs per job on average, at most
# 1,024; 39.7% failed, 6.2% cancelled. Helios (Hu et al., SC'21) helios_cluster_summary.csv, all
# four clusters: 3.716 GPUs per job, at most 2,048 (Acme's row for Helios); 15.5% failed, 22.1%
# cancelled.
TRACES = {
    "kalos": TraceProfile("kalos", 26.77, 1024, 0.397, 0.062),
    "helios": TraceProfile("helios", 3.716, 2048, 0.155, 0.221),
}
PRETRAIN_SIZES = (1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class SimJob:
    id: int
    queue: str
    gpus: int
    arrival: float  # seconds from the start of the simulation
    work_s: float  # run time it needs at full size, seconds (less when it fails or is cancelled early)
    chip: str
    topology: str = "datacenter"
    priority: int = 0
    kind: str = "training"
    outcome: str = "completed"  # completed, failed, cancelled
    min_gpus: int | None = None
    size_step: int = 1
    parameters: float = 0.0  # model parameters, for checkpoint size and restart load


def runtime_quantile(u: np.ndarray) -> np.ndarray:
    q = np.asarray(PHILLY_RUNTIME_QUANTILES)
    return np.interp(u * (len(q) - 1), np.arange(len(q)), q)


def sample_sizes(rng: np.random.Generator, n: int, trace: str = "kalos") -> np.ndarray:
    sizes, p = TRACES[trace].size_probabilities()
    return sizes[rng.choice(len(sizes), size=n, p=p)]


def topology_for(gpus: int) -> str:
    return "node" if gpus <= 8 else "pod" if gpus <= 512 else "datacenter"


def generate(
    capacity: dict[str, int],
    days: float,
    *,
    seed: int = 0,
    jobs: int | None = None,
    target_load: float = 0.8,
    pretrain_share: float = 0.6,
    elastic_share: float = 0.0,
    trace: str = "kalos",
) -> list[SimJob]:
    """A seeded workload for a cluster with ``capacity`` GPUs per chip type over ``days``.

    ``pretrain_share`` of the GPU-time goes to large gangs; the trace-calibrated stream fills the
    rest up to ``target_load`` (or is ``jobs`` jobs long when given)."""
    if trace not in TRACES:
        raise ValueError(f"trace {trace!r} is unknown; known: {', '.join(TRACES)}")
    rng = np.random.default_rng([seed, 11])
    horizon = days * 86_400.0
    out = _pretraining(rng, capacity, horizon, pretrain_share, elastic_share)
    out += _stream(rng, capacity, horizon, jobs, max(0.0, target_load - pretrain_share), trace)
    out.sort(key=lambda j: j.arrival)
    return [
        SimJob(i + 1, *[getattr(j, f) for f in SimJob.__dataclass_fields__ if f != "id"])
        for i, j in enumerate(out)
    ]


def _chip_shares(capacity: dict[str, int]) -> tuple[list[str], np.ndarray]:
    chips = sorted(capacity)
    total = sum(capacity.values())
    return chips, np.array([capacity[c] / total for c in chips])


def _pretraining(rng, capacity, horizon: float, share: float, elastic_share: float) -> list[SimJob]:
    """Large pretraining gangs arriving over the first half, running for days, until they use
    ``share`` of the cluster's GPU-time."""
    chips, chip_p = _chip_shares(capacity)
    budget = share * sum(capacity.values()) * horizon
    out, t = [], 0.0
    while budget > 0:
        chip = chips[int(rng.choice(len(chips), p=chip_p))]
        # gangs of 1,024-16,384 GPUs, at most half of the chip type; smaller clusters get smaller gangs
        sizes = [x for x in PRETRAIN_SIZES if x <= capacity[chip] // 2]
        sizes = sizes or [x for x in (64, 128, 256, 512) if x <= capacity[chip] // 2] or [8]
        size = int(rng.choice(sizes))
        work = float(np.clip(rng.lognormal(np.log(5 * 86_400.0), 0.6), 86_400.0, 30 * 86_400.0))
        elastic = rng.random() < elastic_share
        out.append(
            SimJob(
                0,
                "pretrain",
                size,
                t,
                work,
                chip,
                "datacenter",
                10,
                "training",
                "completed",
                min_gpus=size // 2 if elastic else None,
                size_step=8 if elastic else 1,
                parameters=size * 5e7,
            )
        )
        budget -= size * min(work, horizon - t)
        t += rng.exponential(horizon / 20)
        if t >= horizon:
            t = horizon * rng.random() * 0.5
    return out


def _stream(rng, capacity, horizon: float, jobs: int | None, load: float, trace: str) -> list[SimJob]:
    """The trace-calibrated stream: ``jobs`` jobs, or as many as use ``load`` of the GPU-time."""
    chips, chip_p = _chip_shares(capacity)
    profile = TRACES[trace]
    probe_sizes = sample_sizes(rng, 20_000, trace)
    probe_work = runtime_quantile(rng.random(20_000))
    mean_gpu_s = float((probe_sizes * probe_work).mean())
    if jobs is None:
        jobs = int(load * sum(capacity.values()) * horizon / mean_gpu_s)
    arrivals = np.sort(rng.random(jobs)) * horizon
    sizes = sample_sizes(rng, jobs, trace)
    work = np.maximum(runtime_quantile(rng.random(jobs)), 1.0)
    outcome_draw = rng.random(jobs)
    cut = rng.random(jobs)
    job_chips = rng.choice(len(chips), size=jobs, p=chip_p)
    queues = rng.choice(["research", "dev"], size=jobs, p=[0.6, 0.4])
    out = []
    for i in range(jobs):
        outcome = (
            "failed"
            if outcome_draw[i] < profile.failed
            else ("cancelled" if outcome_draw[i] < profile.failed + profile.cancelled else "completed")
        )
        w = float(work[i]) * (float(cut[i]) if outcome != "completed" else 1.0)
        size = int(min(sizes[i], capacity[chips[job_chips[i]]]))
        out.append(
            SimJob(
                0,
                str(queues[i]),
                size,
                float(arrivals[i]),
                max(w, 1.0),
                chips[job_chips[i]],
                topology_for(size),
                0,
                "training" if size >= 8 else "batch",
                outcome,
                parameters=size * 5e7,
            )
        )
    return out


WORKLOAD_COLUMNS = (
    "arrival_s",
    "gpus",
    "work_s",
    "chip",
    "queue",
    "topology",
    "priority",
    "outcome",
    "min_gpus",
    "size_step",
    "parameters",
)


def load_workload(rows: list[dict], chips: set[str], where: str = "workload") -> list[SimJob]:
    """Jobs from rows of a workload file (CSV rows or JSON objects). Required: arrival_s, gpus,
    work_s, chip; optional: queue (research), topology (by size), priority (0), outcome
    (completed), min_gpus and size_step (elastic), parameters (checkpoint size). Every error names
    the row and the column."""
    jobs = []
    for i, row in enumerate(rows, start=1):
        at = f"{where} row {i}"
        unknown = sorted(set(row) - set(WORKLOAD_COLUMNS))
        if unknown:
            raise ValueError(f"{at}: unknown column {unknown[0]}; known: {', '.join(WORKLOAD_COLUMNS)}")

        def number(key, default=None, *, integer=False, minimum=0.0, row=row, at=at):
            value = row.get(key, default)
            if value in (None, ""):
                if default is None:
                    raise ValueError(f"{at}: column {key} is required")
                return default
            try:
                value = int(value) if integer else float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{at}: column {key} must be a number, got {value!r}") from None
            if value < minimum:
                raise ValueError(f"{at}: column {key} must be at least {minimum}")
            return value

        chip = str(row.get("chip") or "")
        if chip not in chips:
            raise ValueError(
                f"{at}: column chip {chip!r} is not in the cluster; known: {', '.join(sorted(chips))}"
            )
        gpus = number("gpus", integer=True, minimum=1)
        low = number("min_gpus", -1, integer=True, minimum=-1)
        outcome = str(row.get("outcome") or "completed")
        if outcome not in ("completed", "failed", "cancelled"):
            raise ValueError(f"{at}: column outcome must be completed, failed or cancelled")
        jobs.append(
            SimJob(
                0,
                str(row.get("queue") or "research"),
                gpus,
                number("arrival_s"),
                number("work_s", minimum=1.0),
                chip,
                str(row.get("topology") or topology_for(gpus)),
                number("priority", 0, integer=True, minimum=-(10**6)),
                "training" if gpus >= 8 else "batch",
                outcome,
                min_gpus=low if low > 0 else None,
                size_step=number("size_step", 1, integer=True, minimum=1),
                parameters=number("parameters", gpus * 5e7),
            )
        )
    jobs.sort(key=lambda j: j.arrival)
    return [replace(j, id=i + 1) for i, j in enumerate(jobs)]


@dataclass(frozen=True)
class SimService:
    """An inference service in the simulation: replicas follow its load profile (engine.inference)."""

    name: str
    chip: str
    replica_gpus: int
    capacity_rps: float
    max_replicas: int
    min_replicas: int = 1
    headroom: float = 0.2
    profile: tuple[tuple[str, object], ...] = ()  # engine.inference.LoadProfile as sorted items

    def load_profile(self) -> dict:
        return dict(self.profile)


def default_services(capacity: dict[str, int], share: float = 0.1) -> list[SimService]:
    """One chat service on the largest chip type, sized to ``share`` of it at its peak (14:00 UTC),
    a tenth of that at night, with the minute bursts of the Azure conversation trace."""
    if share <= 0 or not capacity:
        return []
    chip = max(capacity, key=capacity.get)
    replicas = int(capacity[chip] * share) // 8
    if replicas < 1:
        return []
    peak = replicas * 40.0 / 1.2
    profile = {
        "kind": "diurnal",
        "trough_rps": peak / 10,
        "peak_rps": peak,
        "peak_hour": 14,
        "burst": "azure-conv",
    }
    return [SimService("chat", chip, 8, 40.0, replicas, 1, 0.2, tuple(sorted(profile.items())))]
