"""Plans for one gang split over several chip types (pure, NumPy): per-type layouts with gradient
resharding, one common layout, or a pipeline split with the larger-memory chips on the early
stages and layers by throughput. Built on engine.steptime's model; formulas in docs/plans.md."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.chips import BY_NAME
from engine.steptime import GIB, Fabric, ModelSpec, NoFeasiblePlan, Plan, best_plan


@dataclass(frozen=True)
class MixedPlan:
    """One job split over several chip types: each type runs its own data-parallel replicas
    (tensor and pipeline parallel stay within one chip type); the global batch is shared in
    proportion to each type's modelled throughput, then rebalanced until the types finish
    their share together; one gradient all-reduce spans every replica. When the types are
    sharded differently (their own best layouts), gradient shards are exchanged between the
    layouts first; the planner compares that with one common layout and keeps the faster.

    Mixed efficiency compares with each type's GPUs running their share of the batch as a job of
    their own. Under this model the costs of mixing are the wider span of the all-reduce, the
    resharding, and the rounding of the batch split: two types of equal compute and one layout
    (H100 and H200) come out close to 100%.

    The planner also tries a pipeline split: every pipeline runs through both types, the
    larger-memory type on the early stages (they hold the most activations under 1F1B), layers
    per stage in proportion to the stage's throughput, tensor parallel within each stage's type;
    it keeps whichever layout is fastest."""

    parts: tuple[Plan, ...]  # one per chip type, with that type's share of the batch
    sequences: dict[str, int]  # sequences of the global batch per chip type
    step_s: float
    tokens_per_s: float
    homogeneous_tokens_per_s: float | None  # each type's GPUs running their share as jobs of their own
    efficiency: float | None  # tokens_per_s / homogeneous (None: a type cannot hold the model alone)
    reshard_s: float = 0.0  # exposed gradient resharding between differently sharded types
    layout: str = "data-parallel split"  # or "pipeline split"
    stages: tuple[dict, ...] = ()  # pipeline split: per chip type, stages and layers per stage

    def as_dict(self) -> dict:
        return {
            "layout": self.layout,
            "stages": list(self.stages),
            "reshard_s": self.reshard_s,
            "parts": [p.as_dict() for p in self.parts],
            "sequences": self.sequences,
            "step_s": self.step_s,
            "tokens_per_s": self.tokens_per_s,
            "homogeneous_tokens_per_s": self.homogeneous_tokens_per_s,
            "efficiency": self.efficiency,
        }


class _Search:
    """The per-type and common-layout candidates of one mixed plan."""

    def __init__(
        self, model: ModelSpec, gpus_by_chip: dict[str, int], fabric: Fabric, span_level, datacenters
    ):
        self.model, self.gpus_by_chip, self.fabric, self.span_level = model, gpus_by_chip, fabric, span_level
        self.where = {"fabric": fabric, "span_level": span_level, "datacenters": datacenters}
        self.seq_total = int(round(model.sequences))

    def share_of(self, sequences: int) -> ModelSpec:
        m = self.model
        return ModelSpec(m.params, m.layers, m.hidden, m.seq_len, sequences * m.seq_len, m.name)

    def balanced(self, fixed: dict | None) -> tuple[dict[str, Plan], dict[str, int]]:
        """First split the batch by peak compute, then rebalance on the model until the types
        finish together."""
        gpus, fabric = self.gpus_by_chip, self.fabric
        share = _split(
            self.seq_total,
            {c: n * BY_NAME[c].bf16_tflops * fabric.efficiency(BY_NAME[c]) for c, n in gpus.items()},
        )
        parts: dict[str, Plan] = {}
        for _ in range(8):
            for c, n in gpus.items():
                parts[c] = best_plan(self.share_of(share[c]), c, n, fixed=fixed, **self.where)
            busy = {c: p.step_s - p.breakdown["dp"] for c, p in parts.items()}
            if max(busy.values()) - min(busy.values()) <= 0.01 * max(busy.values()):
                break
            share = _split(self.seq_total, {c: share[c] / busy[c] for c in share})
        return parts, share

    def step_of(self, parts: dict[str, Plan]) -> tuple[float, float]:
        """(step time, of which gradient resharding between differently sharded replicas)."""
        busy = max(p.step_s - p.breakdown["dp"] for p in parts.values())
        # the one all-reduce spans the whole job: its exposed part at the slowest type's shard size
        dp = max(p.breakdown["dp"] for p in parts.values())
        reshard = 0.0
        if len({(p.tp, p.pp) for p in parts.values()}) > 1:
            # replicas sharded differently exchange gradient shards between layouts before the
            # all-reduce: a reduce-scatter and an all-gather of the finest shard over the job's span
            finest = min(p.tp * p.pp for p in parts.values())
            slowest = min((BY_NAME[p.chip] for p in parts.values()), key=lambda c: c.bf16_tflops)
            bandwidth = self.fabric.bandwidth(max(self.span_level, 1), slowest) * 1e9
            reshard = self.fabric.dp_exposed * 2 * (2.0 * self.model.params / finest) / bandwidth
        return busy + dp + reshard, reshard

    def candidates(self) -> list[tuple[dict[str, Plan], dict[str, int]]]:
        """Each type's own best layout, and one common layout (that of the type with most GPUs)."""
        found = []
        try:
            own, own_share = self.balanced(None)
            found.append((own, own_share))
            largest = max(self.gpus_by_chip, key=self.gpus_by_chip.get)
            found.append(self.balanced({"tp": own[largest].tp, "pp": own[largest].pp}))
        except NoFeasiblePlan:
            pass  # a type cannot hold the model alone, or the common layout does not fit its memory
        return found

    def homogeneous(self, share: dict[str, int]) -> float:
        """The ideal: each type's GPUs running their share of the batch as a job of their own."""
        return sum(
            share[c]
            * self.model.seq_len
            / best_plan(self.share_of(share[c]), c, n, fabric=self.fabric).step_s
            for c, n in self.gpus_by_chip.items()
        )


def mixed_plan(
    model: ModelSpec,
    gpus_by_chip: dict[str, int],
    *,
    fabric: Fabric | None = None,
    span_level: int | None = None,
    datacenters: int = 1,
) -> MixedPlan:
    """Plan ``model`` over GPUs of several chip types; see MixedPlan."""
    fabric = fabric or Fabric()
    if len(gpus_by_chip) < 2:
        raise ValueError("a mixed plan needs at least two chip types")
    if span_level is None:
        span_level = fabric.level_for(sum(gpus_by_chip.values()))
    search = _Search(model, gpus_by_chip, fabric, span_level, datacenters)
    candidates = search.candidates()
    piped = _pipeline_split(model, gpus_by_chip, fabric, span_level) if len(gpus_by_chip) == 2 else None
    if not candidates and piped is None:
        raise NoFeasiblePlan(f"no mixed plan of {model.name or 'the model'} fits {gpus_by_chip}")
    step, homogeneous = math.inf, None
    if candidates:
        parts, share = min(candidates, key=lambda c: search.step_of(c[0])[0])
        step, reshard = search.step_of(parts)
        homogeneous = search.homogeneous(share)
    if piped is not None and piped[0] < step:
        step, parts_list, stages = piped
        tokens = model.batch_tokens / step
        return MixedPlan(
            parts=tuple(parts_list),
            sequences={},
            step_s=step,
            tokens_per_s=tokens,
            homogeneous_tokens_per_s=homogeneous,
            # not defined when a type cannot hold the model alone: mixing is what makes it run
            efficiency=tokens / homogeneous if homogeneous else None,
            layout="pipeline split",
            stages=tuple(stages),
        )
    tokens = model.batch_tokens / step
    return MixedPlan(
        parts=tuple(parts.values()),
        sequences=dict(share),
        step_s=step,
        tokens_per_s=tokens,
        homogeneous_tokens_per_s=homogeneous,
        efficiency=tokens / homogeneous,
        reshard_s=reshard,
    )


def _pipeline_split(model: ModelSpec, gpus_by_chip: dict[str, int], fabric: Fabric, span_level: int):
    """The fastest pipeline that runs through both chip types, or None: (step s, per-type plans,
    stage table). Layers per stage follow each stage's throughput (HetPipe, Metis); a stage whose
    memory does not hold its layers rules the candidate out."""
    (a, n_a), (b, n_b) = sorted(gpus_by_chip.items(), key=lambda kv: -BY_NAME[kv[0]].memory_gib)
    best = None
    for t in (1, 2, 4, 8):
        if t > fabric.gpus_per_node:
            continue
        seen = set()
        for p_a in range(1, model.layers):
            d = n_a // (t * p_a)
            if d < 1:
                break
            p_a = n_a // (t * d)  # as many stages as the replicas leave room for
            p_b = n_b // (t * d)
            if p_b < 1 or p_a + p_b > model.layers or (d, p_a, p_b) in seen:
                continue
            seen.add((d, p_a, p_b))
            for mb in (1, 2, 4):
                if mb * d > model.sequences:
                    continue
                found = _pipeline_step(model, fabric, span_level, (a, b), t, d, p_a, p_b, mb)
                if found is not None and (best is None or found[0] < best[0]):
                    best = (*found, t, d, p_a, p_b)
    if best is None:
        return None
    return _pipeline_result(model, (a, n_a), (b, n_b), *best)


def _pipeline_step(model, fabric, span_level, chips, t, d, p_a, p_b, mb):
    """(step s, micro-batches, layers per stage of each type) of one pipeline layout, or None
    when a stage's memory cannot hold its layers."""
    a, b = chips
    L, h, s, N = model.layers, model.hidden, model.seq_len, model.params
    p = p_a + p_b
    m = math.ceil(model.sequences / (mb * d))
    act = mb * s * h * 2.0
    per_layer = {}
    for chip in chips:
        spec = BY_NAME[chip]
        flops = (6 * N / L + 12 * h * s) * mb * s
        compute = flops / (t * spec.bf16_tflops * 1e12 * fabric.efficiency(spec))
        ar = 2 * (t - 1) / t * act / (fabric.bandwidth(0, spec) * 1e9) + fabric.latency_s[0] if t > 1 else 0.0
        per_layer[chip] = compute + 4 * ar
    # layers per stage in proportion to the stage's rate; the period is then equal
    rate_total = p_a / per_layer[a] + p_b / per_layer[b]
    layers = {a: L / per_layer[a] / rate_total, b: L / per_layer[b] / rate_total}
    period = L / rate_total
    spec_b, level = BY_NAME[b], max(span_level, 1)
    hop = act / t / (fabric.bandwidth(level, spec_b) * 1e9) + fabric.latency_s[level]
    # memory: stage 0 (type a) holds the most micro-batches in flight; the first type-b stage
    # holds p - p_a of them
    for chip, first_stage in ((a, 0), (b, p_a)):
        params = N * layers[chip] / L / t
        in_flight = min(p - first_stage, m)
        mem = params * (4 + 12 / d) + in_flight * layers[chip] * 34.0 * s * mb * h / t
        if mem > (BY_NAME[chip].memory_gib - fabric.memory_reserve_gib) * GIB:
            return None
    grad = 2.0 * N * max(layers.values()) / L / t
    dp_bw = fabric.bandwidth(level, spec_b) * 1e9
    dp = fabric.dp_exposed * (2 * (d - 1) / d * grad / dp_bw) if d > 1 else 0.0
    return period * (m + p - 1) + 2 * (p - 1) * hop + dp, m, layers


def _pipeline_result(model, first, second, step, m, layers, t, d, p_a, p_b):
    """The per-type plans and the stage table of the chosen pipeline."""
    (a, n_a), (b, n_b) = first, second
    tokens = model.batch_tokens / step
    parts, stages = [], []
    for chip, p_c, n in ((a, p_a, n_a), (b, p_b, n_b)):
        spec = BY_NAME[chip]
        mfu = model.batch_tokens * 6 * model.params / step / ((n_a + n_b) * spec.bf16_tflops * 1e12)
        parts.append(Plan(chip, n, t, p_c, d, 1, 1, m, False, step, tokens, 0.0, mfu, {}))
        stages.append(
            {
                "chip": chip,
                "stages": p_c,
                "layers_per_stage": round(layers[chip], 2),
                "gpus_used": t * p_c * d,
            }
        )
    return step, parts, stages


def _split(total: int, weights: dict[str, float]) -> dict[str, int]:
    """Integer shares of ``total`` in proportion to ``weights`` (largest remainder), each >= 1."""
    names = list(weights)
    w = np.array([max(weights[c], 1e-12) for c in names])
    exact = total * w / w.sum()
    base = np.maximum(np.floor(exact).astype(np.int64), 1)
    for i in np.argsort(-(exact - np.floor(exact)))[: max(0, total - int(base.sum()))]:
        base[i] += 1
    return {c: int(x) for c, x in zip(names, base, strict=True)}
