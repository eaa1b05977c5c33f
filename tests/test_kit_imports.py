"""The dependency rules of docs/DESIGN (the architecture runs one way), read
off the sources:

- the harness's modules import each other without a cycle, counting imports
  made only for type checking and imports inside functions (a cycle there is
  a design knot even when Python resolves it at run time);
- the reports depend only on the result model: nothing in reports/ imports
  the harness or the suite;
- the kit (harness, suite, reports) never imports a particular backend;
- OpenReg's runtime knows no torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "privateuse1_conformance"
KIT_FOLDERS = {"harness": ROOT / "harness", "reports": ROOT / "reports", "conformance": ROOT / "conformance"}


def _modules(folder: Path, prefix: str) -> dict[str, Path]:
    found = {}
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((prefix, *parts))] = path
    return found


def _imports(name: str, path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it, as absolute names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {name: {m for m in _imports(name, path) if m in modules and m != name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_harness_imports_run_one_way():
    modules = _modules(KIT_FOLDERS["harness"], f"{PACKAGE}.harness")
    cycles = _cycles(_graph(modules))
    assert not cycles, f"import cycles among the harness's modules: {cycles}"


def test_the_reports_depend_only_on_the_result_model():
    modules = _modules(KIT_FOLDERS["reports"], f"{PACKAGE}.reports")
    wrong = {name: sorted(m for m in _imports(name, path)
                          if m.startswith((f"{PACKAGE}.harness", f"{PACKAGE}.conformance")))
             for name, path in modules.items()}
    assert not {k: v for k, v in wrong.items() if v}, wrong


def test_the_kit_never_imports_a_particular_backend():
    backends = ("openreg", "openreg_autoload", "pu1_sync", "pu1_faulty")
    hits = {}
    for folder, prefix in ((KIT_FOLDERS["harness"], "harness"), (KIT_FOLDERS["reports"], "reports"),
                           (KIT_FOLDERS["conformance"], "conformance")):
        for name, path in _modules(folder, f"{PACKAGE}.{prefix}").items():
            bad = sorted(m for m in _imports(name, path) if m.split(".")[0] in backends)
            if bad:
                hits[name] = bad
    assert not hits, f"the kit imports a particular backend: {hits}"


def test_openregs_runtime_knows_no_torch():
    runtime = ROOT / "reference_backend" / "runtime"
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sorted(runtime.rglob("*")) if p.suffix in (".cpp", ".h", ".txt")
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if "#include" in line and any(k in line for k in ("<torch/", "<ATen/", "<c10/"))]
    assert not hits, hits
