"""The layers import only downwards: engine (the pure core) imports nothing of ours; sim imports
only the core; the apps go cluster <- scheduling <- monitoring with no edge back; and no module
imports another package's private (underscore) names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = {"engine", "sim", "cluster", "scheduling", "monitoring", "config", "bench", "tests", "myriad_agent"}
# who may import whom (a package may always import itself)
ALLOWED = {
    "myriad_agent": set(),  # the node agent is installed alone on GPU nodes
    "engine": set(),
    "sim": {"engine"},
    "cluster": {"engine"},
    "scheduling": {"engine", "sim", "cluster"},
    "monitoring": {"engine", "sim", "cluster", "scheduling"},
}


def _imports(path: Path):
    """(module imported, names taken from it) for every absolute import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, tuple(alias.name for alias in node.names)


def _modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" not in path.parts:
            yield path


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def layer_violations(package: str, paths) -> list[str]:
    problems = []
    for path in paths:
        for module, names in _imports(path):
            root = module.split(".")[0]
            if root in OURS and root != package and root not in ALLOWED[package]:
                problems.append(f"{_name(path)} imports {module}")
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if root in OURS and root != package and private:
                problems.append(f"{_name(path)} takes private {', '.join(private)} from {module}")
    return problems


def test_every_package_imports_only_the_layers_below_it():
    problems = [p for package in ALLOWED for p in layer_violations(package, _modules(package))]
    assert problems == []


def test_no_module_takes_another_packages_private_names():
    problems = []
    for package in ("bench", "config"):
        for path in _modules(package):
            for module, names in _imports(path):
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                if module.split(".")[0] in OURS - {package} and private:
                    problems.append(f"{path.relative_to(ROOT)} takes {private} from {module}")
    assert problems == []


def test_the_rule_sees_an_edge_back_and_a_private_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from monitoring.services import report_fault\nfrom scheduling.store import _key\n")
    problems = layer_violations("cluster", [bad])
    assert len(problems) == 3, problems  # monitoring and scheduling are above cluster; _key is private


def test_no_module_is_over_500_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for package in (*ALLOWED, "config")
        for p in _modules(package)
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}


def test_no_function_is_much_over_60_lines():
    """Functions stay readable: about 60 lines, a little more where a signature, a docstring or one
    literal (a report's dictionary) takes the room."""
    long = {}
    for package in (*ALLOWED, "config"):
        for path in _modules(package):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    size = node.end_lineno - node.lineno + 1
                    if size > 75:
                        long[f"{path.relative_to(ROOT)}:{node.name}"] = size
    assert long == {}
