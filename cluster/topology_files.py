"""Read a topology file (YAML or JSON) or a preset into a validated ``TopologySpec``."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from cluster.builder import known_chip_names
from engine.presets import PRESETS, preset_document
from engine.topology_spec import TopologyError, TopologySpec, parse_topology


def load_document(path: str | Path) -> object:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TopologyError([f"{path}: cannot be read ({exc.strerror})"]) from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise TopologyError(
            [f"{path}: is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}"]
        ) from None


def resolve_topology(source: str) -> TopologySpec:
    """``source`` is a preset name (demo, 10k, 100k) or a path to a YAML/JSON topology file."""
    doc = preset_document(source) if source in PRESETS else load_document(source)
    return parse_topology(doc, known_chip_names())
