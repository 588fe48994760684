"""Step-time model and parallel-plan search for large training jobs (pure, NumPy).

For a dense transformer (parameters N, layers L, hidden size h, sequence length s, global batch
B tokens) on n GPUs of one chip type, a plan is tensor x pipeline x data parallel sizes
(t, p, d), micro-batch size b (sequences), virtual pipeline stages v (interleaved 1F1B) and
whether activations are fully recomputed. The model, term by term (notation and sources in the
project's hetero.md references, section 3):

- FLOPs per step: 6*N*B + 12*L*h*s*B (attention); x4/3 with full recomputation.
- Compute: FLOPs / (t*p*d * peak BF16 * kernel efficiency). Kernel efficiency per chip:
  A100 0.65 (Megatron-LM reaches 52% MFU end to end on 3,072 A100, arXiv 2104.04473), Hopper
  0.60 (Llama 3 405B: 38-43% MFU end to end at 8k-16k H100, arXiv 2407.21783), other chips 0.55
  (no published large-scale anchor; a parameter).
- Pipeline bubble: (p-1)/(v*m) of the compute time, m = micro-batches per replica; with v = 1
  this is the 1F1B bubble (p-1)/(m+p-1) of the step.
- Tensor parallel stays inside a node: 4 all-reduces per layer per micro-batch (6 with
  recomputation), each of b*s*h*2 bytes, ring cost 2(t-1)/t * size / NVLink bandwidth + latency.
- Pipeline point-to-point: b*s*h*2/t bytes per hop (scatter-gather over the tensor group); the
  fill and drain, 2*(p-1) hops, are exposed; steady-state sends overlap compute.
- Data-parallel gradient all-reduce of 2*N/(t*p) bytes per GPU, ring over the bandwidth of the
  lowest level holding the data-parallel group, hierarchical across datacenters (reduce-scatter
  inside each, all-reduce of the shards over the datacenter link: 2(k-1)/k * 2N / link
  bandwidth for k datacenters). Only ``dp_exposed`` of it (default 20%) is not hidden behind
  the backward pass.
- Memory per GPU: bf16 weights and gradients (4 bytes per parameter of the GPU's shard) plus
  fp32 master weights and Adam moments sharded over data parallel (12/d bytes); activations
  34*s*b*h/t bytes per layer per micro-batch in flight (sequence parallel with selective
  recomputation, Korthikanti et al., arXiv 2205.05198), or 2*s*b*h/t with full recomputation;
  the first pipeline stage holds min(p, m) micro-batches of its L/p layers. Plans that do not fit
  in the chip's memory less ``memory_reserve_gib`` are rejected.

Sanity anchor (tested): Llama 3 405B, 16M-token steps on 16,384 H100 with the published layout
TP8 PP16 DP128 comes out at about 6 s per step (published 38-43% MFU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from engine.chips import BY_NAME, ChipSpec

SPAN_LEVELS = ("node", "rack", "pod", "datacenter", "region", "cluster")
GIB = 2**30


@dataclass(frozen=True)
class ModelSpec:
    """A dense transformer training job: what the step-time model needs to know."""

    params: float  # parameters
    layers: int
    hidden: int
    seq_len: int  # tokens per sequence
    batch_tokens: int  # global batch, tokens per step
    name: str = ""

    def validate(self) -> None:
        for name in ("params", "layers", "hidden", "seq_len", "batch_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"model.{name} must be a positive number, got {value!r}")
        if self.batch_tokens < self.seq_len:
            raise ValueError("model.batch_tokens must hold at least one sequence (seq_len tokens)")

    @property
    def sequences(self) -> float:
        return self.batch_tokens / self.seq_len

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        if not isinstance(data, dict):
            raise ValueError("model must be an object")
        if "preset" in data:
            preset = MODELS.get(data["preset"])
            if preset is None:
                raise ValueError(f"model.preset {data['preset']!r} is unknown; known: {', '.join(MODELS)}")
            return preset
        unknown = set(data) - {"params", "layers", "hidden", "seq_len", "batch_tokens", "name"}
        if unknown:
            raise ValueError(f"model.{sorted(unknown)[0]} is not a model field")
        missing = [k for k in ("params", "layers", "hidden", "seq_len", "batch_tokens") if k not in data]
        if missing:
            raise ValueError(f"model.{missing[0]} is required")
        spec = cls(**data)
        spec.validate()
        return spec


# Public model shapes (Llama 3 Herd of Models, Table 3; GPT-3 paper, Table 2.1).
MODELS: dict[str, ModelSpec] = {
    "llama3-8b": ModelSpec(8.0e9, 32, 4096, 8192, 4 * 2**20, "llama3-8b"),
    "llama3-70b": ModelSpec(70.6e9, 80, 8192, 8192, 16 * 2**20, "llama3-70b"),
    "llama3-405b": ModelSpec(405e9, 126, 16384, 8192, 16 * 2**20, "llama3-405b"),
    "gpt3-175b": ModelSpec(175e9, 96, 12288, 2048, 3_200_000, "gpt3-175b"),
}


@dataclass(frozen=True)
class Fabric:
    """Network and efficiency defaults; the inventory overrides the datacenter link bandwidth."""

    gpus_per_node: int = 8
    gpus_per_rack: int = 40
    gpus_per_pod: int = 1000
    gpus_per_datacenter: int = 25000
    nic_gbps_per_gpu: float = 50.0  # GB/s: one 400 Gb/s NIC per GPU (rail-optimized fabric)
    bus_efficiency: float = 0.8  # achieved bus bandwidth / line rate (NCCL on RoCE/IB)
    pod_oversubscription: float = 2.0  # between pods of a datacenter (Meta, Alibaba HPN: tier 3)
    datacenter_link_gbps: float = 400.0  # GB/s between two datacenters (3.2 Tb/s)
    latency_s: tuple[float, ...] = (5e-6, 10e-6, 15e-6, 25e-6, 5e-4, 5e-4)  # per span level
    kernel_efficiency: dict[str, float] = field(
        default_factory=lambda: {"A100-80G": 0.65, "H100-SXM": 0.60, "H200": 0.60}
    )
    default_kernel_efficiency: float = 0.55
    dp_exposed: float = 0.2
    memory_reserve_gib: float = 0.75  # CUDA context and allocator slack

    def efficiency(self, chip: ChipSpec) -> float:
        return self.kernel_efficiency.get(chip.name, self.default_kernel_efficiency)

    def level_for(self, gpus: int) -> int:
        """The smallest span level whose domain holds ``gpus`` GPUs."""
        return int(self.levels_for(np.array([gpus]))[0])

    def levels_for(self, gpus: np.ndarray) -> np.ndarray:
        """``level_for`` of every entry of ``gpus`` (region when no datacenter holds it)."""
        sizes = np.array(
            [self.gpus_per_node, self.gpus_per_rack, self.gpus_per_pod, self.gpus_per_datacenter]
        )
        return np.searchsorted(sizes, gpus, side="left")

    def bandwidth(self, level: int, chip: ChipSpec) -> float:
        """Per-GPU bus bandwidth (GB/s) for a collective whose GPUs span ``level``."""
        if level == 0:
            return chip.link_bandwidth_gbps / 2 * self.bus_efficiency  # NVLink figure is bidirectional
        if level <= 2:
            return self.nic_gbps_per_gpu * self.bus_efficiency
        return self.nic_gbps_per_gpu * self.bus_efficiency / self.pod_oversubscription


@dataclass(frozen=True)
class Plan:
    chip: str
    gpus: int  # GPUs allocated
    tp: int
    pp: int
    dp: int
    virtual_stages: int
    micro_batch: int  # sequences per micro-batch
    micro_batches: int  # per data-parallel replica per step
    recompute: bool
    step_s: float
    tokens_per_s: float
    memory_gib: float
    mfu: float
    breakdown: dict[str, float]  # seconds per step: compute, bubble, tp, pp, dp (exposed)

    @property
    def gpus_used(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def tokens_per_gpu_s(self) -> float:
        return self.tokens_per_s / self.gpus

    def as_dict(self) -> dict:
        data = asdict(self)
        data["tokens_per_gpu_s"] = self.tokens_per_gpu_s
        return data

    def describe(self) -> str:
        return (
            f"TP{self.tp} PP{self.pp} DP{self.dp} on {self.gpus} {self.chip}: "
            f"{self.step_s:.2f} s/step, {self.tokens_per_s:,.0f} tokens/s"
        )


class NoFeasiblePlan(ValueError):
    """No plan fits the job on these GPUs (memory, or too few GPUs for the model)."""


_TP = (1, 2, 4, 8)
_PP = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 18, 20, 24, 28, 32, 40, 48, 64, 96, 128)
_VS = (1, 2, 4)
_MB = (1, 2, 4)


def _grid(model: ModelSpec, gpus: int, fabric: Fabric, fixed: dict | None):
    axes = {
        "tp": [t for t in _TP if t <= fabric.gpus_per_node and t <= gpus],
        "pp": [p for p in _PP if p <= model.layers and p <= gpus],
        "vs": list(_VS),
        "mb": list(_MB),
        "rc": [0, 1],
    }
    for key, value in (fixed or {}).items():
        axes[key] = [value]
    mesh = np.meshgrid(*[np.asarray(v, dtype=np.int64) for v in axes.values()], indexing="ij")
    t, p, v, b, rc = (a.ravel() for a in mesh)
    d = gpus // (t * p)
    ok = (d >= 1) & ((v == 1) | ((p > 1) & (p * v <= model.layers)))
    ok &= b * d <= model.sequences  # at least one micro-batch per replica
    return t[ok], p[ok], d[ok], v[ok], b[ok], rc[ok]


def _evaluate(model, chip, gpus, fabric, span_level, datacenters, t, p, d, v, b, rc):
    """Vectorized step time and memory for arrays of plan parameters."""
    n_used = t * p * d
    L, h, s, N, B = model.layers, model.hidden, model.seq_len, model.params, model.batch_tokens
    m = np.ceil(model.sequences / (b * d))
    flops = 6 * N * B + 12 * L * h * s * B
    hw_flops = flops * np.where(rc == 1, 4 / 3, 1.0)
    compute = hw_flops / (n_used * chip.bf16_tflops * 1e12 * fabric.efficiency(chip))
    bubble = compute * (p - 1) / (v * m)

    act_bytes = b * s * h * 2.0  # one micro-batch's activations at a layer boundary, bf16
    lat = fabric.latency_s
    nvlink = fabric.bandwidth(0, chip) * 1e9
    ar = 2 * (t - 1) / t * act_bytes / nvlink + lat[0]
    tp = np.where(t > 1, m * (L / p) * np.where(rc == 1, 6, 4) * ar, 0.0)

    pp_level = np.minimum(fabric.levels_for(t * p), span_level)
    pp_bw = np.array([fabric.bandwidth(level, chip) for level in range(len(SPAN_LEVELS))])[pp_level] * 1e9
    hop = act_bytes / t / pp_bw + np.asarray(lat)[pp_level]
    pp = np.where(p > 1, 2 * (p - 1) * hop, 0.0)

    k = max(1, datacenters)
    grad = 2.0 * N / (t * p)  # bytes of gradient per GPU
    if k > 1:
        d_local = np.maximum(1, d // k)
        local_bw = fabric.bandwidth(3, chip) * 1e9
        dp = 2 * (d_local - 1) / d_local * grad / local_bw + 2 * (d_local - 1) * lat[3]
        dp = dp + 2 * (k - 1) / k * 2.0 * N / (fabric.datacenter_link_gbps * 1e9) + 2 * (k - 1) * lat[4]
    else:
        dp_level = min(span_level, fabric.level_for(gpus))
        dp_bw = fabric.bandwidth(max(dp_level, 1), chip) * 1e9
        dp = 2 * (d - 1) / d * grad / dp_bw + 2 * (d - 1) * lat[max(dp_level, 1)]
    dp = np.where(d > 1, dp, 0.0) * fabric.dp_exposed

    step = compute + bubble + tp + pp + dp
    per_layer = np.where(rc == 1, 2.0, 34.0) * s * b * h / t
    in_flight = np.minimum(p, m)
    memory = N / (t * p) * (4 + 12 / d) + in_flight * (L / p) * per_layer
    memory = memory + np.where(rc == 1, 34.0 * s * b * h / t, 0.0)
    return step, memory, {"compute": compute, "bubble": bubble, "tp": tp, "pp": pp, "dp": dp}, m


def _ranked(model, chip, gpus, fabric, span_level, datacenters, fixed, keep=None):
    """Evaluate the plan grid; returns a builder of Plan objects and the feasible plans' indices,
    fastest first (ties go to fewer pipeline stages and no recomputation). ``keep(tp, pp, dp)``:
    a mask over the grid of the plans that may be chosen at all (None: all that fit memory)."""
    build, order, _ = _table(model, chip, gpus, fabric, span_level, datacenters, fixed, keep)
    return build, order


class PlanTable(NamedTuple):
    """Every feasible plan on some GPUs, fastest first: ``build(i)`` makes the i-th a Plan;
    the arrays are per plan in that order (parts: seconds per step by term)."""

    build: Callable[[int], Plan]
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    virtual_stages: np.ndarray
    micro_batch: np.ndarray
    recompute: np.ndarray
    micro_batches: np.ndarray
    step: np.ndarray
    memory: np.ndarray
    parts: dict[str, np.ndarray]


@lru_cache(maxsize=512)
def one_site_table(model: ModelSpec, chip: str, gpus: int, span_level: int) -> PlanTable:
    """Every feasible plan for ``model`` on ``gpus`` of ``chip`` whose GPUs span ``span_level`` at
    most (default fabric, one datacenter), fastest first, evaluated once for every caller that
    reads the same plans (raises NoFeasiblePlan when none fits)."""
    build, order, (t, p, d, v, b, rc, m, step, memory, parts) = _table(
        model, chip, gpus, None, span_level, 1, None
    )
    return PlanTable(
        lambda i: build(int(order[i])),
        *(a[order] for a in (t, p, d, v, b, rc, m, step, memory)),
        {k: val[order] for k, val in parts.items()},
    )


def _table(model, chip, gpus, fabric, span_level, datacenters, fixed, keep=None):
    """``_ranked``, and the evaluated grid: (t, p, d, v, b, rc, m, step, memory, parts)."""
    fabric = fabric or Fabric()
    spec = BY_NAME[chip] if isinstance(chip, str) else chip
    if gpus <= 0:
        raise NoFeasiblePlan("a plan needs at least one GPU")
    if span_level is None:
        span_level = fabric.level_for(gpus)
    t, p, d, v, b, rc = _grid(model, gpus, fabric, fixed)
    if len(t) == 0:
        raise NoFeasiblePlan(f"no parallel layout of {model.name or 'the model'} fits {gpus} GPUs")
    step, memory, parts, m = _evaluate(model, spec, gpus, fabric, span_level, datacenters, t, p, d, v, b, rc)
    budget = (spec.memory_gib - fabric.memory_reserve_gib) * GIB
    fits = np.flatnonzero(memory <= budget)
    if len(fits) == 0:
        best = int(np.argmin(memory))
        raise NoFeasiblePlan(
            f"{model.name or 'the model'} does not fit on {gpus} {spec.name}: the smallest plan needs "
            f"{memory[best] / GIB:.0f} GiB per GPU, the chip has {spec.memory_gib:.0f} GiB"
        )
    if keep is not None:
        fits = fits[keep(t[fits], p[fits], d[fits])]
    order = fits[np.lexsort((rc[fits], p[fits], step[fits]))]
    flops = model.batch_tokens * (6 * model.params + 12 * model.layers * model.hidden * model.seq_len)

    def build(i: int) -> Plan:
        return Plan(
            chip=spec.name,
            gpus=gpus,
            tp=int(t[i]),
            pp=int(p[i]),
            dp=int(d[i]),
            virtual_stages=int(v[i]),
            micro_batch=int(b[i]),
            micro_batches=int(m[i]),
            recompute=bool(rc[i]),
            step_s=float(step[i]),
            tokens_per_s=model.batch_tokens / float(step[i]),
            memory_gib=float(memory[i] / GIB),
            mfu=flops / float(step[i]) / (gpus * spec.bf16_tflops * 1e12),
            breakdown={k: float(val[i]) for k, val in parts.items()},
        )

    return build, order, (t, p, d, v, b, rc, m, step, memory, parts)


def plans(
    model: ModelSpec,
    chip: str | ChipSpec,
    gpus: int,
    *,
    fabric: Fabric | None = None,
    span_level: int | None = None,
    datacenters: int = 1,
    fixed: dict | None = None,
) -> list[Plan]:
    """Every feasible plan for ``model`` on ``gpus`` GPUs of ``chip``, fastest first.

    ``span_level`` is the lowest common topology level of the placement (index in SPAN_LEVELS;
    default: the smallest level that holds ``gpus``); ``datacenters`` how many it spans.
    ``fixed`` pins plan axes, e.g. {"tp": 8, "pp": 16}.
    """
    build, order = _ranked(model, chip, gpus, fabric, span_level, datacenters, fixed)
    return [build(int(i)) for i in order]


def best_plan(
    model: ModelSpec,
    chip: str | ChipSpec,
    gpus: int,
    *,
    fabric: Fabric | None = None,
    span_level: int | None = None,
    datacenters: int = 1,
    fixed: dict | None = None,
) -> Plan:
    """The fastest feasible plan (raises NoFeasiblePlan when none fits); see ``plans``."""
    build, order = _ranked(model, chip, gpus, fabric, span_level, datacenters, fixed)
    return build(int(order[0]))


def rank_chips(model: ModelSpec, gpus: int, chips: list[str], *, fabric: Fabric | None = None) -> list[dict]:
    """Chip types ranked by modelled throughput per price (tokens per dollar), best first.

    Gavel's cost policy (OSDI'20): argmax over types of throughput / price. Chips where the job
    does not fit are listed last with the reason.
    """
    ranking = []
    for name in chips:
        spec = BY_NAME.get(name)
        if spec is None:
            ranking.append({"chip": name, "feasible": False, "reason": "not in the chip catalogue"})
            continue
        try:
            plan = best_plan(model, spec, gpus, fabric=fabric)
        except NoFeasiblePlan as exc:
            ranking.append({"chip": name, "feasible": False, "reason": str(exc)})
            continue
        dollars_per_s = gpus * spec.price_per_gpu_hour / 3600
        ranking.append(
            {
                "chip": name,
                "feasible": True,
                "tokens_per_s": plan.tokens_per_s,
                "price_per_gpu_hour": spec.price_per_gpu_hour,
                "tokens_per_dollar": plan.tokens_per_s / dollars_per_s,
                "plan": f"TP{plan.tp} PP{plan.pp} DP{plan.dp}",
                "step_s": plan.step_s,
            }
        )
    ranking.sort(key=lambda r: (not r["feasible"], -r.get("tokens_per_dollar", 0.0)))
    return ranking


def describe_ranking(ranking: list[dict]) -> str:
    parts = []
    for r in ranking:
        if r["feasible"]:
            parts.append(f"{r['chip']} {r['tokens_per_dollar'] / 1e6:.1f}M tokens/$")
        else:
            parts.append(f"{r['chip']} infeasible")
    return "chip ranking by tokens per dollar: " + ", ".join(parts)


def retained_per_gpu(before: Plan, after: Plan) -> float:
    """Per-GPU throughput of ``after`` relative to ``before`` (1.0: scaled perfectly)."""
    return after.tokens_per_gpu_s / before.tokens_per_gpu_s
