"""Plans that cut the pipeline at the links between datacenters (pure, NumPy).

A gang over k datacenters either keeps whole model replicas in each (engine.sites: only the
data-parallel gradients cross a link) or cuts every replica's pipeline at the links: each
datacenter holds whole pipeline stages of every replica, as many as its share of the GPUs
(stages hold equal layers), the datacenters in a chain. Then each stage's gradient all-reduce
stays inside its datacenter, and what crosses a link is the activations going forward and their
gradients coming back at the cut: per step and direction, every micro-batch of every replica,
d x m x b x s x h x 2 bytes (bf16). Over the plan's step time inside one datacenter
(engine.steptime), the model changes two things:

- the fill and drain: 2(k-1) of the pipeline's 2(p-1) exposed hops cross a link, the d
  replicas' micro-batch at once over the bandwidth the link leaves the job, plus its latency;
- the steady state: the sends overlap compute (as inside a datacenter), but no step is shorter
  than the time the link takes to carry them.

With v interleaved (virtual) stages every chunk's pass crosses each cut, and the wrap from the
last stage back to the first crosses it the other way: a micro-batch crosses each link 2v - 1
times each way per step, and the fill and drain cross it v times each.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from itertools import permutations
from typing import NamedTuple

import numpy as np

from engine.placement import LEVELS
from engine.steptime import ModelSpec, NoFeasiblePlan, Plan, one_site_table

DATACENTER_LEVEL = LEVELS.index("datacenter")


class CutPlan(NamedTuple):
    """The best cut plan on a split, with its stages per datacenter in chain order."""

    plan: Plan
    stages: tuple[tuple[int, int], ...]  # (datacenter, pipeline stages there), in pipeline order
    bytes_per_step: float  # bytes each link of the chain carries per step, each way


def _grid_in_one_site(model: ModelSpec, chip: str, gpus: int):
    """Every plan on ``gpus`` that fits memory with two or more stages, inside one datacenter,
    fastest first (engine.steptime.one_site_table): (t, p, d, v, b, rc, m, step, hop, rows, table),
    rows: their places in the table; None without one."""
    try:
        table = one_site_table(model, chip, gpus, DATACENTER_LEVEL)
    except NoFeasiblePlan:
        return None
    keep = table.pp >= 2
    if not keep.any():
        return None
    columns = (table.tp, table.pp, table.dp, table.virtual_stages, table.micro_batch, table.recompute)
    t, p, d, v, b, rc = (a[keep] for a in columns)
    hop = table.parts["pp"][keep] / (2 * (p - 1))  # one exposed hop inside the datacenter
    m, step = table.micro_batches[keep], table.step[keep]
    return t, p, d, v, b, rc, m, step, hop, np.flatnonzero(keep), table


def stage_quanta(model: ModelSpec, chip: str, gpus: int, most: int = 4) -> tuple[int, ...]:
    """GPUs of one pipeline stage across every replica (TP x DP) of the fastest plans with
    stages, distinct, at most ``most``: the quanta a cut split keeps whole in each datacenter."""
    try:
        grid = _grid_in_one_site(model, chip, gpus)
    except KeyError:  # a chip the catalogue does not know
        return ()
    if grid is None:
        return ()
    sizes: list[int] = []
    for q in (grid[0] * grid[2]).tolist():
        if q not in sizes:
            sizes.append(q)
            if len(sizes) == most:
                break
    return tuple(sizes)


def chain(split: dict[int, int], room: dict[tuple[int, int], float]) -> tuple[int, ...] | None:
    """The datacenters' order along the pipeline: the chain whose thinnest link leaves the most
    room (None: no chain has room on every link)."""
    best, best_room = None, 0.0
    for order in permutations(sorted(split)):
        if order[0] > order[-1]:
            continue  # a chain and its reverse are the same links
        least = min(room.get((min(a, b), max(a, b)), 0.0) for a, b in zip(order, order[1:], strict=False))
        if least > best_room:
            best, best_room = order, least
    return best


def cut_plan(
    model: ModelSpec, chip: str, split: tuple[tuple[int, int], ...], room_bytes: float, latency_s: float
) -> CutPlan | None:
    """The fastest cut plan on ``split`` ((datacenter, GPUs) in chain order) with ``room_bytes``
    per second left on the chain's thinnest link and ``latency_s`` one way on its longest (None:
    no plan puts whole stages of every replica in each datacenter)."""
    return _cut_plan(model, chip, split, round3(room_bytes), round(latency_s, 6))


@lru_cache(maxsize=4096)
def _cut_plan(model, chip, split, room_bytes, latency_s):
    gpus = sum(n for _, n in split)
    k = len(split)
    if k < 2 or room_bytes <= 0:
        return None
    grid = _grid_in_one_site(model, chip, gpus)
    if grid is None:
        return None
    t, p, d, v, b, rc, m, step, hop, rows, table = grid
    q = t * d
    per_dc = np.stack([n // q for _, n in split])  # whole stages each datacenter holds, per plan
    ok = (per_dc >= 1).all(axis=0) & (per_dc.sum(axis=0) >= p) & (p >= k)
    if not ok.any():
        return None
    act = b * model.seq_len * model.hidden * 2.0  # one micro-batch at the cut, bf16
    crossing = d * act / room_bytes + latency_s
    fill = step + 2 * (k - 1) * (v * crossing - hop)
    per_step = (2 * v - 1) * d * m * act
    total = np.maximum(fill, per_step / room_bytes)
    total = np.where(ok, total, np.inf)
    i = int(np.lexsort((rc, p, total))[0])
    stages = _stages(per_dc[:, i], int(p[i]))
    inside = table.build(int(rows[i]))  # the same plan inside one datacenter
    faster = inside.step_s / float(total[i])
    plan = replace(
        inside,
        step_s=float(total[i]),
        tokens_per_s=inside.tokens_per_s * faster,
        mfu=inside.mfu * faster,
        breakdown={**inside.breakdown, "link": float(total[i] - step[i])},
    )
    return CutPlan(plan, tuple((dc, n) for (dc, _), n in zip(split, stages, strict=True)), float(per_step[i]))


def _stages(whole: np.ndarray, p: int) -> list[int]:
    """``p`` stages over datacenters that hold ``whole`` stages each: in proportion to what each
    holds, at least one each (largest remainders first)."""
    share = whole * p / whole.sum()
    out = np.maximum(1, np.floor(share)).astype(int)
    out = np.minimum(out, whole)
    for j in np.argsort(-(share - np.floor(share)), kind="stable"):
        if out.sum() >= p:
            break
        if out[j] < whole[j]:
            out[j] += 1
    while out.sum() > p:
        out[int(np.argmax(out))] -= 1
    return [int(x) for x in out]


def stage_ranges(counts) -> list[str]:
    """The stages each datacenter holds, in pipeline order, from how many: [4, 2] -> ["1-4", "5-6"]."""
    out, first = [], 1
    for n in counts:
        out.append(f"{first}" if n == 1 else f"{first}-{first + n - 1}")
        first += n
    return out


def describe(stages: tuple[tuple[int, int], ...], names: dict[int, str]) -> str:
    """e.g. "stages 1-10 in bj1, 11-16 in bj2"."""
    ranges = stage_ranges(n for _, n in stages)
    return "stages " + ", ".join(
        f"{r} in {names.get(dc, str(dc))}" for r, (dc, _) in zip(ranges, stages, strict=True)
    )


def round3(x: float) -> float:
    """Three significant digits, so that the plan caches hold over the links' moving loads."""
    if x <= 0:
        return 0.0
    digits = 2 - int(math.floor(math.log10(x)))
    return round(x, digits)
