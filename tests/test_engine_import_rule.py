"""The engine is a pure core: it must never import Django, Celery, Channels or the web stack."""

import ast
import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "engine"
FORBIDDEN = {
    "django",
    "celery",
    "channels",
    "channels_redis",
    "rest_framework",
    "daphne",
    "uvicorn",
    "redis",
    "kombu",
    "cluster",
    "scheduling",
    "monitoring",
    "config",
    "sim",
    "bench",
}


def _imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_engine_module_imports_a_framework():
    offenders = {
        str(path.relative_to(ENGINE.parent)): sorted(_imported_roots(path) & FORBIDDEN)
        for path in ENGINE.rglob("*.py")
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}, f"engine modules import frameworks: {offenders}"


def test_importing_every_engine_module_loads_no_framework():
    modules = [f"engine.{p.stem}" for p in ENGINE.glob("*.py") if p.stem != "__init__"]
    assert modules, "no engine modules found"
    code = (
        "import sys, importlib\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(FORBIDDEN)!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ENGINE.parent
    )
    assert out.stdout.strip() == ""


def test_the_rule_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from django.db import models\nimport numpy\n")
    assert _imported_roots(bad) & FORBIDDEN == {"django"}
