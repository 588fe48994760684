"""The free-GPU pool: counts stay exact through takes and gives, and placement obeys its rules."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.placement import LEVELS, FreePool
from tests.engine_helpers import layout_for

LAYOUT = layout_for(datacenters=2, pods_per_dc=2, racks=3, nodes_per_rack=2, chips=("H100-SXM", "A100-80G"))


def _assert_counts_exact(pool: FreePool) -> None:
    fresh = FreePool(pool.layout, pool.free)
    assert np.array_equal(fresh.node_free, pool.node_free)
    for k in range(1, len(LEVELS)):
        assert np.array_equal(fresh.level_free[k], pool.level_free[k])


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.booleans(), st.integers(0, 1), st.integers(1, 100), st.integers(0, 5)), max_size=25
    )
)
def test_counts_stay_exact_and_placements_stay_in_one_domain(ops):
    pool = FreePool(LAYOUT, np.ones(LAYOUT.topo.num_gpus, dtype=bool))
    held: list[np.ndarray] = []
    for place, chip, gpus, level in ops:
        if place or not held:
            placed = pool.place(chip, gpus, level)
            if placed is not None:
                chosen, lvl, dom = placed
                assert len(np.unique(chosen)) == gpus
                assert set(LAYOUT.node_chip[LAYOUT.gpu_node[chosen]]) == {chip}
                assert set(LAYOUT.node_domain[lvl][LAYOUT.gpu_node[chosen]]) == {dom} and lvl <= level
                held.append(chosen)
        else:
            pool.give(held.pop(0))
        _assert_counts_exact(pool)
    taken = np.concatenate(held) if held else np.array([], dtype=np.int64)
    assert not pool.free[taken].any()


def test_a_gang_takes_whole_nodes_before_partial_ones():
    free = np.ones(LAYOUT.topo.num_gpus, dtype=bool)
    free[0:3] = False  # node 0 partly used
    pool = FreePool(LAYOUT, free)
    chosen, level, _ = pool.place(0, 16, 1)  # one rack: nodes 0 (5 free), 1 (8), ...
    nodes = set(LAYOUT.gpu_node[chosen].tolist())
    assert LEVELS[level] == "rack" and 0 not in nodes and len(nodes) == 2


def test_all_free_in_returns_every_free_gpu_of_the_chip():
    free = np.ones(LAYOUT.topo.num_gpus, dtype=bool)
    free[::3] = False
    pool = FreePool(LAYOUT, free)
    got = pool.all_free_in(3, 0, 0)  # datacenter 0, H100
    expected = np.flatnonzero(
        free & (LAYOUT.node_chip[LAYOUT.gpu_node] == 0) & (LAYOUT.node_domain[3][LAYOUT.gpu_node] == 0)
    )
    assert np.array_equal(np.sort(got), expected)
