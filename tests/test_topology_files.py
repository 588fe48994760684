"""Topology documents: presets, validation errors that name the entry, nothing built on error."""

import copy
import json

import pytest
from django.core.management import CommandError, call_command

from cluster.models import GPU, Node, Region
from engine.chips import BY_NAME
from engine.presets import PRESETS, preset_document
from engine.topology_spec import TopologyError, parse_topology
from tests.conftest import SMALL_TOPOLOGY

CHIPS = set(BY_NAME)


@pytest.mark.parametrize(
    ("name", "gpus", "nodes", "datacenters", "regions"),
    [("demo", 3072, 384, 3, 2), ("10k", 10_000, 1250, 2, 1), ("100k", 100_000, 12_500, 3, 1)],
)
def test_presets_have_the_documented_shape(name, gpus, nodes, datacenters, regions):
    spec = parse_topology(preset_document(name), CHIPS)
    assert (spec.total_gpus, spec.total_nodes) == (gpus, nodes)
    assert sum(len(r.datacenters) for r in spec.regions) == datacenters
    assert len(spec.regions) == regions


def test_the_100k_preset_mixes_chip_types():
    spec = parse_topology(preset_document("100k"), CHIPS)
    chips = {pod.chip_type for _, dc in spec.datacenters() for pod in dc.pods}
    assert chips == {"H100-SXM", "H200", "A100-80G", "B200", "MI300X", "Ascend-910B"}
    assert set(PRESETS) == {"demo", "10k", "100k"}


def _errors(doc) -> list[str]:
    with pytest.raises(TopologyError) as info:
        parse_topology(doc, CHIPS)
    return info.value.errors


def test_an_unknown_chip_type_is_named_with_its_path():
    doc = copy.deepcopy(SMALL_TOPOLOGY)
    doc["regions"][0]["datacenters"][1]["pods"][0]["chip_type"] = "H900"
    errors = _errors(doc)
    assert len(errors) == 1
    assert errors[0].startswith("regions[0].datacenters[1].pods[0].chip_type: unknown chip type 'H900'")


def test_every_problem_is_reported_at_once():
    doc = copy.deepcopy(SMALL_TOPOLOGY)
    pods = doc["regions"][0]["datacenters"][0]["pods"][0]
    pods["racks"] = 0
    pods["gpus_per_node"] = "eight"
    pods["colour"] = "blue"
    doc["regions"][0]["datacenters"][1]["name"] = "dc1"
    doc["links"][0]["between"] = ["dc1", "nowhere"]
    errors = "\n".join(_errors(doc))
    assert "regions[0].datacenters[0].pods[0].racks: must be between 1 and 1024, got 0" in errors
    assert "regions[0].datacenters[0].pods[0].gpus_per_node: must be a whole number, got 'eight'" in errors
    assert "regions[0].datacenters[0].pods[0].colour: unknown field" in errors
    assert "regions[0].datacenters[1].name: duplicate datacenter name 'dc1'" in errors
    assert "links[0].between[1]: 'nowhere' names no datacenter" in errors


def test_missing_fields_and_wrong_shapes_are_named():
    errors = _errors({"regions": [{"name": "r", "datacenters": [{"name": "d"}]}], "links": {}})
    assert "regions[0].datacenters[0].pods: is required" in errors
    assert "links: must be a list" in errors
    assert _errors([1, 2]) == [": must be a mapping, got list"]


def test_spare_nodes_cannot_exceed_the_pod():
    doc = copy.deepcopy(SMALL_TOPOLOGY)
    doc["regions"][0]["datacenters"][0]["pods"][0]["spare_nodes"] = 5
    assert _errors(doc) == ["regions[0].datacenters[0].pods[0].spare_nodes: must be between 0 and 4, got 5"]


def test_link_latency_defaults_from_distance():
    spec = parse_topology(SMALL_TOPOLOGY, CHIPS)
    (link,) = spec.links
    assert link.latency_ms == pytest.approx(40 * 0.005)  # 5 us per km of fibre


def test_build_cluster_from_a_yaml_file(db, tmp_path):
    import yaml

    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(SMALL_TOPOLOGY))
    call_command("build_cluster", str(path))
    assert GPU.objects.count() == 2 * 2 * 2 * 8 + 3 * 4
    assert Node.objects.filter(is_spare=True).count() == 2  # one per H100 pod


def test_a_bad_file_builds_nothing_and_says_why(db, tmp_path):
    doc = copy.deepcopy(SMALL_TOPOLOGY)
    doc["regions"][0]["datacenters"][0]["pods"][0]["nodes_per_rack"] = -1
    path = tmp_path / "site.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CommandError, match=r"regions\[0\]\.datacenters\[0\]\.pods\[0\]\.nodes_per_rack"):
        call_command("build_cluster", str(path))
    assert not Region.objects.exists() and not GPU.objects.exists()


def test_unparseable_and_missing_files_are_reported(db, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("regions: [\n")
    with pytest.raises(CommandError, match="is not valid YAML"):
        call_command("build_cluster", str(path))
    with pytest.raises(CommandError, match="cannot be read"):
        call_command("build_cluster", str(tmp_path / "absent.yaml"))


def test_check_validates_without_writing(db, capsys):
    call_command("build_cluster", "demo", "--check")
    assert "valid: 3072 GPUs on 384 nodes" in capsys.readouterr().out
    assert not Region.objects.exists()
