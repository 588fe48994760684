"""Built-in cluster shapes, written as ordinary topology documents.

- ``demo``: 3,072 GPUs (2 regions, 3 datacenters, 12 pods of 256 GPUs), mixed chips.
- ``10k``: 10,000 GPUs (1 region, 2 datacenters, 10 pods of 1,000 GPUs).
- ``100k``: 100,000 GPUs on 12,500 nodes x 8 (three campuses of 40k/40k/20k GPUs 60-90 km apart,
  100 pods of 1,000 GPUs), mixed chips: H100, H200, A100, B200, MI300X and Ascend 910B.

A pod is one network block of the HPN fabric (25 racks of 5 nodes here, 1,000 GPUs), the
granularity at which a large gang keeps its traffic on one tier of switches.
"""

from __future__ import annotations

from typing import Any


def _pods(chip: str, count: int, racks: int = 25, per_rack: int = 5, spares: int = 2) -> dict[str, Any]:
    return {
        "chip_type": chip,
        "count": count,
        "racks": racks,
        "nodes_per_rack": per_rack,
        "gpus_per_node": 8,
        "spare_nodes": spares,
    }


def _demo() -> dict[str, Any]:
    small = {"racks": 8, "per_rack": 4, "spares": 1}
    return {
        "name": "demo",
        "regions": [
            {
                "name": "north",
                "datacenters": [
                    {
                        "name": "bj1",
                        "location": "Beijing",
                        "power_budget_kw": 4000,
                        "pods": [_pods("H100-SXM", 4, **small)],
                    },
                    {
                        "name": "bj2",
                        "location": "Langfang",
                        "power_budget_kw": 4000,
                        "pods": [_pods("H200", 2, **small), _pods("A100-80G", 2, **small)],
                    },
                ],
            },
            {
                "name": "east",
                "datacenters": [
                    {
                        "name": "sh1",
                        "location": "Shanghai",
                        "power_budget_kw": 4000,
                        "pods": [_pods("MI300X", 2, **small), _pods("Ascend-910B", 2, **small)],
                    },
                ],
            },
        ],
        "links": [
            {"between": ["bj1", "bj2"], "distance_km": 60, "bandwidth_gbps": 12800},
            {"between": ["bj1", "sh1"], "distance_km": 1100, "bandwidth_gbps": 3200},
            {"between": ["bj2", "sh1"], "distance_km": 1050, "bandwidth_gbps": 3200},
        ],
    }


def _ten_k() -> dict[str, Any]:
    return {
        "name": "10k",
        "regions": [
            {
                "name": "north",
                "datacenters": [
                    {
                        "name": "bj1",
                        "location": "Beijing",
                        "power_budget_kw": 12000,
                        "pods": [_pods("H100-SXM", 5)],
                    },
                    {
                        "name": "bj2",
                        "location": "Langfang",
                        "power_budget_kw": 12000,
                        "pods": [_pods("H200", 3), _pods("A100-80G", 2)],
                    },
                ],
            }
        ],
        "links": [{"between": ["bj1", "bj2"], "distance_km": 60, "bandwidth_gbps": 12800}],
    }


def _hundred_k() -> dict[str, Any]:
    """Three campuses of one metro area, 40k/40k/20k GPUs, 60-90 km apart, joined by DCI links of
    400 Gb/s lanes (3.2-12.8 Tb/s): the shape power and floor space force on a 100k-GPU cluster
    (README, "Sites")."""
    return {
        "name": "100k",
        "regions": [
            {
                "name": "north",
                "datacenters": [
                    {
                        "name": "bj1",
                        "location": "Beijing",
                        "power_budget_kw": 60000,
                        "pods": [_pods("H100-SXM", 25), _pods("H200", 15)],
                    },
                    {
                        "name": "bj2",
                        "location": "Langfang",
                        "power_budget_kw": 60000,
                        "pods": [_pods("H100-SXM", 20), _pods("A100-80G", 10), _pods("B200", 10)],
                    },
                    {
                        "name": "bj3",
                        "location": "Zhuozhou",
                        "power_budget_kw": 30000,
                        "pods": [_pods("H100-SXM", 5), _pods("MI300X", 10), _pods("Ascend-910B", 5)],
                    },
                ],
            },
        ],
        "links": [
            {"between": ["bj1", "bj2"], "distance_km": 60, "lanes": 32, "lane_gbps": 400},
            {"between": ["bj1", "bj3"], "distance_km": 65, "lanes": 16, "lane_gbps": 400},
            {"between": ["bj2", "bj3"], "distance_km": 90, "lanes": 8, "lane_gbps": 400},
        ],
    }


PRESETS = {"demo": _demo, "10k": _ten_k, "100k": _hundred_k}


def preset_document(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]()
