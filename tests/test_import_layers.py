"""The layers import only downwards: engine (the pure core) imports nothing of ours; sim imports
only the core; the apps go cluster <- scheduling <- monitoring with no edge back; no module
imports another package's private (underscore) names; no package's modules import each other in
a cycle; and the project's own imports sit at the top of the module, not inside functions
(but for the short list below, each with its reason)."""

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
    # the agent defines its report's network fields (myriad_agent.network); ingest checks them
    "monitoring": {"engine", "sim", "cluster", "scheduling", "myriad_agent"},
}


# project imports inside functions that must stay there: (file, module imported) -> why
INNER_ALLOWED = {
    ("cluster/apps.py", "cluster.api.authentication"): "Django app loading: receivers connect in ready()",
    ("scheduling/apps.py", "cluster.signals"): "Django app loading: receivers connect in ready()",
    ("scheduling/apps.py", "scheduling"): "Django app loading: its receivers import models and tasks",
    ("monitoring/apps.py", "cluster.signals"): "Django app loading: receivers connect in ready()",
    ("monitoring/apps.py", "monitoring"): "Django app loading: its receivers import models and tasks",
    ("monitoring/apps.py", "scheduling.cycle"): "Django app loading: the signals it listens to",
    ("monitoring/apps.py", "scheduling.launch"): "Django app loading: the signals it listens to",
    ("monitoring/apps.py", "scheduling.signals"): "Django app loading: the signals it listens to",
    ("myriad_agent/gpus.py", "myriad_agent"): "the fake NVML is loaded only when a test or the demo asks",
}
CHECKED = (*ALLOWED, "config")  # bench and tests import Django's modules after django.setup()


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
    bad.write_text("from monitoring.faults.services import report_fault\nfrom scheduling.store import _key\n")
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(tree: ast.Module):
    """Imports run when the module loads: in its body, under a module-level if or try (not
    ``if TYPE_CHECKING``), never in a function or class body."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]


def _targets(node, known: set[str]) -> set[str]:
    """Our modules an import statement loads (``from p import m`` loads p.m when that is a module)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    if node.level or not node.module:
        return set()
    found = {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known}
    return found | ({node.module} if node.module in known else set())


def import_cycles(names: dict[str, Path]) -> list[list[str]]:
    """Groups of modules (dotted name -> file) that import each other, directly or round a loop,
    when they load."""
    graph = {
        name: {
            t
            for node in _top_level_imports(ast.parse(path.read_text()))
            for t in _targets(node, set(names))
            if t != name
        }
        for name, path in names.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def inner_imports(paths) -> list[str]:
    """Our modules imported inside a function, less the allowed list."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    if module.split(".")[0] in OURS and (_name(path), module) not in INNER_ALLOWED:
                        found.append(f"{_name(path)}:{node.lineno} imports {module} inside {fn.name}")
    return found


def test_no_package_has_an_import_cycle():
    cycles = [
        c for package in CHECKED for c in import_cycles({_module_name(p): p for p in _modules(package)})
    ]
    assert cycles == []


def test_our_imports_sit_at_the_top_of_the_module():
    found = [p for package in CHECKED for p in inner_imports(_modules(package))]
    assert found == []
    used = set()
    for package in CHECKED:
        for path in _modules(package):
            for fn in ast.walk(ast.parse(path.read_text())):
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    used |= {(_name(path), n.module) for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)}
    assert set(INNER_ALLOWED) - used == set()  # the allowed list names only imports still there


def test_the_rules_see_a_cycle_and_an_import_inside_a_function(tmp_path):
    pkg = tmp_path / "monitoring"
    pkg.mkdir()
    (pkg / "a.py").write_text("from monitoring.b import x\n")
    (pkg / "b.py").write_text("from monitoring import c\n")
    (pkg / "c.py").write_text("import monitoring.a\n\ndef f():\n    from scheduling.store import Holdings\n")
    paths = sorted(pkg.glob("*.py"))

    cycles = import_cycles({f"monitoring.{p.stem}": p for p in paths})
    assert cycles == [["monitoring.a", "monitoring.b", "monitoring.c"]]
    assert [line.split(" imports ")[1] for line in inner_imports(paths)] == ["scheduling.store inside f"]
