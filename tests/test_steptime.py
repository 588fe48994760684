"""The step-time model and plan search: published anchors and the elastic/mixed targets."""

import pytest

from engine.mixedplan import mixed_plan
from engine.steptime import (
    MODELS,
    Fabric,
    ModelSpec,
    NoFeasiblePlan,
    best_plan,
    plans,
    rank_chips,
    retained_per_gpu,
)


def test_llama3_405b_published_layout_steps_in_about_six_seconds():
    # Llama 3 405B: 16M-token steps, TP8 PP16 DP128 on 16,384 H100, 38-43% MFU published.
    plan = plans(MODELS["llama3-405b"], "H100-SXM", 16384, fixed={"tp": 8, "pp": 16})[0]
    assert (plan.tp, plan.pp, plan.dp) == (8, 16, 128)
    assert 5.0 <= plan.step_s <= 7.0
    assert 0.36 <= plan.mfu <= 0.48
    assert plan.memory_gib <= 80


def test_search_finds_a_plan_at_least_as_fast_as_the_published_one():
    model = MODELS["llama3-405b"]
    published = plans(model, "H100-SXM", 16384, fixed={"tp": 8, "pp": 16})[0]
    best = best_plan(model, "H100-SXM", 16384)
    assert best.step_s <= published.step_s + 1e-9
    assert best.gpus_used <= 16384
    assert best.tp <= 8  # tensor parallel never leaves a node


def test_plans_that_do_not_fit_in_memory_are_rejected():
    model = MODELS["llama3-405b"]
    with pytest.raises(NoFeasiblePlan, match="does not fit on 8 H100-SXM"):
        best_plan(model, "H100-SXM", 8)
    # every returned plan fits the chip
    for plan in plans(model, "H100-SXM", 1024)[:50]:
        assert plan.memory_gib <= 80 - Fabric().memory_reserve_gib


def test_shrinking_1000_to_900_keeps_90_percent_of_per_gpu_throughput():
    model = MODELS["llama3-70b"]
    before = best_plan(model, "H100-SXM", 1000)
    after = best_plan(model, "H100-SXM", 900)
    assert after.gpus == 900 and after.gpus_used <= 900
    # the global batch is fixed: both plans process the same tokens per step
    assert retained_per_gpu(before, after) >= 0.9


def test_crossing_datacenters_costs_time_only_through_communication():
    model = MODELS["llama3-70b"]
    inside = best_plan(model, "H100-SXM", 2048, span_level=3)
    across = best_plan(model, "H100-SXM", 2048, span_level=4, datacenters=2)
    assert across.step_s >= inside.step_s
    slow = Fabric(datacenter_link_gbps=5.0)
    slower = best_plan(model, "H100-SXM", 2048, span_level=4, datacenters=2, fabric=slow)
    assert slower.step_s > across.step_s


def test_chip_ranking_orders_by_tokens_per_dollar_and_lists_infeasible_last():
    ranking = rank_chips(MODELS["llama3-405b"], 64, ["H100-SXM", "MI300X", "Ascend-910B", "TPU-v9"])
    feasible = [r for r in ranking if r["feasible"]]
    assert [r["tokens_per_dollar"] for r in feasible] == sorted(
        (r["tokens_per_dollar"] for r in feasible), reverse=True
    )
    assert ranking[-1]["chip"] == "TPU-v9" and not ranking[-1]["feasible"]
    assert all(not r["feasible"] for r in ranking[len(feasible) :])


def test_mixed_hopper_job_at_10k_gpus_reaches_95_percent():
    model = MODELS["llama3-70b"]
    mixed = mixed_plan(model, {"H100-SXM": 5000, "H200": 5000})
    assert mixed.efficiency >= 0.95
    assert sum(mixed.sequences.values()) == round(model.sequences)
    assert {p.chip for p in mixed.parts} == {"H100-SXM", "H200"}
    assert all(p.tp <= 8 for p in mixed.parts)


def test_mixed_batch_shares_follow_throughput():
    model = MODELS["llama3-70b"]
    mixed = mixed_plan(model, {"A100-80G": 4096, "H100-SXM": 4096})
    # H100 is about 3x an A100 in BF16: it gets most of the batch, and both finish together
    assert mixed.sequences["H100-SXM"] > 2 * mixed.sequences["A100-80G"]
    busy = [p.step_s - p.breakdown["dp"] for p in mixed.parts]
    assert max(busy) - min(busy) <= 0.05 * max(busy)
    assert mixed.efficiency <= 1.0 + 1e-9
    layouts = {(p.tp, p.pp) for p in mixed.parts}
    assert (mixed.reshard_s > 0) == (len(layouts) > 1)  # differently sharded types pay to reshard


@pytest.mark.parametrize(
    "data, field",
    [
        ({"params": -1, "layers": 2, "hidden": 8, "seq_len": 8, "batch_tokens": 64}, "model.params"),
        ({"params": 1e9, "layers": 2, "hidden": 8, "seq_len": 8}, "model.batch_tokens"),
        ({"preset": "nope"}, "model.preset"),
        ({"params": 1e9, "layers": 2, "hidden": 8, "seq_len": 8, "batch_tokens": 64, "x": 1}, "model.x"),
    ],
)
def test_model_errors_name_the_field(data, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        ModelSpec.from_dict(data)


def test_a_pipeline_split_puts_the_larger_memory_chip_first_when_one_type_cannot_hold_the_model():
    model = MODELS["llama3-70b"]
    with pytest.raises(NoFeasiblePlan):
        best_plan(model, "Ascend-910B", 16)  # 64 GiB chips: the model does not fit on 16 alone
    mixed = mixed_plan(model, {"Ascend-910B": 16, "H200": 16})
    assert mixed.layout == "pipeline split"
    assert [s["chip"] for s in mixed.stages] == ["H200", "Ascend-910B"]  # early stages: most memory
    # the faster, larger chip carries more layers per stage; every layer is placed
    h200, ascend = mixed.stages
    assert h200["layers_per_stage"] > ascend["layers_per_stage"]
    total = h200["stages"] * h200["layers_per_stage"] + ascend["stages"] * ascend["layers_per_stage"]
    assert total == pytest.approx(model.layers, abs=0.1)
    assert mixed.efficiency is None  # not defined: one type could not run it alone
