"""Statement coverage: which check decides each clause of each contract, and
which mutant proves that check can fail.

Checks name the clause they decide in the suite's sources: in Python as the
first argument of check() or scope() (check("DM-SET-001.2", ...)) or in a
"# decides DM-SET-001.2" comment above a test; in the C++ contract tests as a
"// decides GD-DEV-001.1" comment in the TEST_F body. The scan attributes a
clause mention to the function (or GoogleTest case) it appears in, a comment
above a function to that function. Mutants name their clauses in
conformance/mutants.toml. A clause with no check or no mutant is a gap unless
the registry waives it with a reason (waive_check / waive_mutant).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .registry import CLAUSE_PATTERN, Registry

_TEST_F = re.compile(r"^TEST_F\((\w+), (\w+)\)", re.MULTILINE)


_DECIDES_COMMENT = re.compile(r"#\s*decides\b(.*)$")


def _python_mentions(path: Path, comments_only: bool = False) -> dict[str, set[str]]:
    """clause -> {"file::test"} for one Python source file.

    A mention belongs to the top-level function or class it appears in (a
    comment above one, to the one below). A helper's mention belongs to the
    tests that reach the helper, directly or through other helpers: those
    are the checks that decide the clause. A helper no test reaches keeps
    the mention itself."""
    stat = path.stat()
    both = _python_scan(path, stat.st_mtime_ns, stat.st_size)
    return {clause: set(owners) for clause, owners in both[comments_only].items()}


# Where scans are kept between runs, by the digest of the file and of this
# scanner: a run reads the suite's clauses before its first test, and parsing
# every test module costs most of a second of a quick run's start.
CACHE_ENV = "PU1C_CLAUSE_CACHE"


def _cache_folder() -> Path:
    from .paths import user_cache

    return user_cache("clauses", CACHE_ENV)


@functools.lru_cache(maxsize=1)
def _scanner_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes() + CLAUSE_PATTERN.pattern.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=256)
def _python_scan(path: Path, mtime_ns: int, size: int) -> tuple[dict[str, frozenset[str]], dict[str, frozenset[str]]]:
    """(every mention, "# decides" comments only) of one file, parsed once
    (a run asks for both; the file's mtime and size key the cache), and kept
    on disk by the file's and the scanner's digest (a folder that cannot be
    written only costs the parse)."""
    data = path.read_bytes()
    cached = _cache_folder() / f"{path.name}-{hashlib.sha256(data).hexdigest()[:24]}-{_scanner_digest()}.json"
    try:
        both = json.loads(cached.read_text())
        return tuple({c: frozenset(o) for c, o in table.items()} for table in both)
    except (OSError, ValueError):
        pass
    scanned = _parse_scan(path, data.decode("utf-8"))
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        temporary = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps([{c: sorted(o) for c, o in table.items()} for table in scanned]))
        os.replace(temporary, cached)
    except OSError:
        pass
    return scanned


def _parse_scan(path: Path, source: str) -> tuple[dict[str, frozenset[str]], dict[str, frozenset[str]]]:
    tree = ast.parse(source)
    tops = []   # (first line, last line, name, node) of top-level functions, classes and names bound once
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            tops.append((first, node.end_lineno or node.lineno, node.name, node))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                tops.append((node.lineno, node.end_lineno or node.lineno, targets[0].id, node))
    docstrings = set()  # lines of docstrings: clause IDs there are examples, not checks
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    names = {name for _, _, name, _ in tops}
    uses = {name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in names} - {name}
            for _, _, name, node in tops}
    tests = [test for _, _, test, _ in tops if test.startswith("test_")]
    reached = {}  # test -> every top-level name it reaches
    for test in tests:
        seen, todo = set(), [test]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(uses.get(name, ()))
        reached[test] = seen

    def owners_of(number: int) -> list[str]:
        inside = [name for first, last, name, _ in tops if first <= number <= last]
        following = [(first, name) for first, _, name, _ in tops if first > number]
        if inside:
            owner = inside[0]
        elif following:
            owner = min(following)[1]
        else:
            return []
        if owner.startswith("test_"):
            return [owner]
        return [test for test in tests if owner in reached[test]] or [owner]

    found: dict[str, set[str]] = {}
    comments: dict[str, set[str]] = {}
    for number, line in enumerate(source.splitlines(), start=1):
        if number in docstrings:
            continue
        for table, text in ((found, line), (comments, _comment_text(line))):
            for match in CLAUSE_PATTERN.finditer(text):
                owners = owners_of(number)
                table.setdefault(match.group(0), set()).update(f"{path.name}::{o}" for o in owners)
    return ({c: frozenset(o) for c, o in found.items()}, {c: frozenset(o) for c, o in comments.items()})


def _comment_text(line: str) -> str:
    comment = _DECIDES_COMMENT.search(line)
    return comment.group(1) if comment else ""


def _cxx_mentions(path: Path) -> dict[str, set[str]]:
    """clause -> {"file::Suite.Case"} for one C++ source file."""
    source = path.read_text(encoding="utf-8")
    cases = [(m.start(), f"{m.group(1)}.{m.group(2)}") for m in _TEST_F.finditer(source)]
    found: dict[str, set[str]] = {}
    for match in CLAUSE_PATTERN.finditer(source):
        before = [name for start, name in cases if start < match.start()]
        if before:
            found.setdefault(match.group(0), set()).add(f"{path.name}::{before[-1]}")
    return found


def declared_by_comment(suite_dir: Path) -> dict[str, list[str]]:
    """Clause -> the Python tests that declare it with a "# decides" comment
    (the whole test is its check: a pass decides it) and the C++ cases that
    name it (a GoogleTest case is one check)."""
    found: dict[str, set[str]] = {}
    for path in sorted(suite_dir.glob("test_*.py")):
        for clause, owners in _python_mentions(path, comments_only=True).items():
            found.setdefault(clause, set()).update(owners)
    for path in sorted((suite_dir / "cxx").glob("*.cpp")):
        for clause, owners in _cxx_mentions(path).items():
            found.setdefault(clause, set()).update(owners)
    return {clause: sorted(owners) for clause, owners in found.items()}


def checks_by_clause(suite_dir: Path) -> dict[str, list[str]]:
    """Every clause the suite's sources mention -> the checks that mention it."""
    found: dict[str, set[str]] = {}
    for path in sorted(suite_dir.glob("*.py")):
        for clause, owners in _python_mentions(path).items():
            found.setdefault(clause, set()).update(owners)
    for path in sorted((suite_dir / "cxx").glob("*.cpp")):
        for clause, owners in _cxx_mentions(path).items():
            found.setdefault(clause, set()).update(owners)
    return {clause: sorted(owners) for clause, owners in found.items()}


@dataclass
class ClauseCoverage:
    clause: str
    text: str
    checks: list[str] = field(default_factory=list)
    mutants: list[str] = field(default_factory=list)
    waived_check: str = ""
    waived_mutant: str = ""

    @property
    def gaps(self) -> list[str]:
        gaps = []
        if not self.checks and not self.waived_check:
            gaps.append("no check")
        if not self.mutants and not self.waived_mutant:
            gaps.append("no mutant")
        return gaps


@dataclass
class Coverage:
    clauses: dict[str, ClauseCoverage]
    unknown: list[str]       # "where: clause" for mentions of clauses the registry lacks
    no_clauses: list[str]    # active contracts whose statement is not split into clauses

    def gaps(self) -> list[ClauseCoverage]:
        return [c for c in self.clauses.values() if c.gaps]


def coverage(registry: Registry, suite_dir: Path, mutant_clauses: dict[str, list[str]]) -> Coverage:
    """The coverage of every clause of the active contracts. `mutant_clauses`
    maps mutant ID -> the clauses it breaks."""
    checks = checks_by_clause(suite_dir)
    clauses: dict[str, ClauseCoverage] = {}
    no_clauses = []
    for contract in registry.active():
        if not contract.clauses:
            no_clauses.append(contract.id)
        for clause_id, text in zip(contract.clause_ids(), contract.clauses):
            clauses[clause_id] = ClauseCoverage(
                clause_id, text, checks.get(clause_id, []),
                waived_check=contract.waive_check.get(clause_id, ""),
                waived_mutant=contract.waive_mutant.get(clause_id, ""))
    unknown = [f"{', '.join(owners)}: {clause}" for clause, owners in checks.items() if clause not in clauses]
    for mutant, ids in sorted(mutant_clauses.items()):
        for clause in ids:
            if clause in clauses:
                clauses[clause].mutants.append(mutant)
            else:
                unknown.append(f"mutant {mutant}: {clause}")
    return Coverage(clauses, sorted(unknown), no_clauses)


def _contract_ids(node: ast.expr, constants: dict[str, list[str]]) -> list[str]:
    """The contract IDs an argument of @contract(...) names, where it can be
    read without running the module: a string, or a starred module constant
    (a tuple or list of strings)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Starred) and isinstance(node.value, ast.Name):
        return list(constants.get(node.value.id, []))
    return []


def suite_tests(suite_dir: Path) -> dict[str, list[str]]:
    """Every test function of the suite ("file::function") -> the contract
    IDs its @pytest.mark.contract(...) decorators name (those that can be
    read from the source; empty when they come from its parameters, as the
    C++ cases' do). `verify` requires every test function of a level in a
    complete run's report: this list comes from the kit's own sources, not
    from the report."""
    tests: dict[str, list[str]] = {}
    for path in sorted(suite_dir.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases, constants = {"contract"}, {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                if isinstance(node.value, ast.Attribute) and node.value.attr == "contract":
                    aliases.add(name)
                elif isinstance(node.value, (ast.Tuple, ast.List)) and all(
                        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts):
                    constants[name] = [e.value for e in node.value.elts]
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.name.startswith("test_"):
                continue
            ids: list[str] = []
            for decorator in node.decorator_list:
                if not isinstance(decorator, ast.Call):
                    continue
                func = decorator.func
                named = (isinstance(func, ast.Name) and func.id in aliases) or (
                    isinstance(func, ast.Attribute) and func.attr == "contract")
                if named:
                    for argument in decorator.args:
                        ids += _contract_ids(argument, constants)
            tests[f"{path.name}::{node.name}"] = ids
    return tests
