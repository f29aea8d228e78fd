"""The architecture as a test: layers are folders, imports only point down, no circles, no giant modules.

Function-level imports count: a circle hidden inside a function is still a circle. The layer
order is docs/ARCHITECTURE.md's; each folder's __init__.py says what it must not import.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "swarm_node"
BENCH = ROOT.joinpath("bench")  # spelled so that the crossing check below does not flag this file

BASE = {"config", "errors", "fsutil", "logutil", "metrics", "status", "tracking"}
#: rank of each layer; a module may import its own layer's folder and any lower rank.
RANKS = {"base": 0, "tasks": 1, "wire": 2, "net": 3, "train": 4, "swarm": 4, "node": 5, "harness": 6,
         "commands": 7, "package": 8}
MAX_LINES = 500


def layer_of(module: str) -> str:
    parts = module.split(".")[1:]  # drop "swarm_node"
    if not parts or parts[0] in ("__init__", "__main__"):
        return "package"
    if parts[0] in BASE:
        return "base"
    return parts[0]


def modules(root: Path, prefix: str) -> dict[str, Path]:
    found = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).with_suffix("")
        name = ".".join([prefix, *rel.parts])
        found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, module: str, known: dict[str, Path]) -> set[str]:
    """Every module of `known` that `path` imports, at any depth of the file."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            candidates = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        for name in candidates:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def graph(root: Path, prefix: str) -> dict[str, set[str]]:
    known = modules(root, prefix)
    return {m: imports(p, m, known) for m, p in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop(); on_stack.discard(w); component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_package_or_bench():
    assert circles(graph(PACKAGE, "swarm_node")) == []
    assert circles(graph(BENCH, "bench")) == []


def test_imports_only_point_down_the_layers():
    upward = []
    for module, targets in graph(PACKAGE, "swarm_node").items():
        mine = layer_of(module)
        for target in targets:
            theirs = layer_of(target)
            if theirs == mine or target == "swarm_node":
                continue
            if RANKS[theirs] >= RANKS[mine]:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_bench_and_tests_do_not_import_each_other():
    crossing = []
    for folder, other in (("bench", "tests"), ("tests", "bench")):
        for path in (ROOT / folder).glob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n == other or n.startswith(other + ".") for n in names):
                    crossing.append(f"{path.relative_to(ROOT)} imports {other}")
            if f"/ \"{other}\"" in path.read_text(encoding="utf-8") and "sys.path" in path.read_text(encoding="utf-8"):
                crossing.append(f"{path.relative_to(ROOT)} puts {other}/ on sys.path")
    assert crossing == []


def test_no_module_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for folder in ("swarm_node", "bench") for p in (ROOT / folder).rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_the_checker_sees_a_circle_and_an_upward_import(tmp_path):
    pkg = tmp_path / "swarm_node"
    (pkg / "train").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train" / "__init__.py").write_text("")
    (pkg / "train" / "a.py").write_text("def f():\n    from swarm_node.train import b\n")
    (pkg / "train" / "b.py").write_text("from swarm_node.train.a import f\nfrom swarm_node.node import run\n")
    (pkg / "node.py").write_text("run = 1\n")
    edges = graph(pkg, "swarm_node")
    assert circles(edges) == [["swarm_node.train.a", "swarm_node.train.b"]]
    assert "swarm_node.node" in edges["swarm_node.train.b"] and layer_of("swarm_node.node") == "node"
    assert RANKS[layer_of("swarm_node.node")] > RANKS[layer_of("swarm_node.train.b")]
