"""Loading and validating the contract registry (conformance/contracts.toml).

The registry is data; this module only reads it, checks its shape, and
answers questions about it. Nothing else in the kit lists contract IDs.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LEVELS = ("core", "standard", "full")
ID_PATTERN = re.compile(r"^[A-Z]{2}-[A-Z0-9]+-\d{3}$")
# A clause of a contract's statement: the contract ID and the clause's number.
CLAUSE_PATTERN = re.compile(r"\b([A-Z]{2}-[A-Z0-9]+-\d{3})\.(\d+)\b")


class RegistryError(ValueError):
    """The registry file is malformed."""


def read_toml(path: Path, error: type[Exception], what: str) -> dict:
    """The TOML document at `path`, or `error` saying that the `what` there
    cannot be read (the kit's data files and a vendor's manifest and
    expectations alike)."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise error(f"cannot read {what} {path}: {e}") from e


@dataclass(frozen=True)
class Feature:
    name: str
    optional: bool
    description: str


@dataclass(frozen=True)
class KnownFix:
    """A symptom with a known fix (the vendor guide's): a failure of the
    contract whose clause is `clause` (when given) and whose message, root
    cause or details match `symptom` (a regular expression, when given)."""

    fix: str                   # what to register or change, in a few words
    guide: str                 # where the vendor guide explains it: "vendor-guide.md#<section>"
    symptom: str = ""
    clause: str = ""

    def matches(self, clause: str, text: str) -> bool:
        return ((not self.clause or clause == self.clause)
                and (not self.symptom or re.search(self.symptom, text) is not None))


@dataclass(frozen=True)
class Contract:
    id: str
    area: str
    level: str
    statement: str
    source: str
    features: tuple[str, ...] = ()
    retired: str | None = None
    # The statement split into what can be decided separately: each "and",
    # each entry point, each argument form. Clause k is "<id>.k" (from 1).
    clauses: tuple[str, ...] = ()
    decided_by: str = ""       # the observation that decides the contract
    other_choices: str = ""    # why a conforming backend making other legitimate choices passes
    min_torch: str = ""        # the first torch release with the APIs the contract needs ("" = any supported)
    # Clauses knowingly without a check or without a mutant, with the reason.
    waive_check: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    waive_mutant: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    known_fixes: tuple[KnownFix, ...] = field(default=(), compare=False, hash=False)

    def known_fix(self, clause: str, text: str) -> KnownFix | None:
        """The first known fix whose symptom a failure (its clause, and its
        message, cause and details as `text`) shows."""
        return next((fix for fix in self.known_fixes if fix.matches(clause, text)), None)

    @property
    def level_rank(self) -> int:
        return LEVELS.index(self.level)

    def clause_ids(self) -> list[str]:
        return [f"{self.id}.{k}" for k in range(1, len(self.clauses) + 1)]

    def checked_clauses(self) -> list[str]:
        """The clauses a pass needs decided: every clause with a check (a
        clause waived for checking has none)."""
        return [c for c in self.clause_ids() if c not in self.waive_check]


@dataclass
class Registry:
    path: Path
    schema_version: int
    levels: dict[str, str]
    areas: dict[str, str]
    features: dict[str, Feature]
    contracts: dict[str, Contract] = field(default_factory=dict)
    # Level -> optional features of which a backend must claim one to reach it.
    level_requirements: dict[str, list[str]] = field(default_factory=dict)

    def active(self) -> list[Contract]:
        """Contracts that are not retired, in registry order."""
        return [c for c in self.contracts.values() if c.retired is None]

    def up_to(self, level: str) -> list[Contract]:
        """Active contracts of `level` and the levels below it."""
        rank = LEVELS.index(level)
        return [c for c in self.active() if c.level_rank <= rank]

    def clause(self, clause_id: str) -> str:
        """The text of clause `clause_id` (e.g. DM-SET-001.2)."""
        contract_id, _, number = clause_id.partition(".")
        contract = self.get(contract_id)
        if not number.isdigit() or not 1 <= int(number) <= len(contract.clauses):
            raise KeyError(f"unknown clause {clause_id!r}")
        return contract.clauses[int(number) - 1]

    def leave_out_for_torch(self, torch_version: str) -> dict[str, str]:
        """Retire, for this run, the contracts that need a newer torch than
        `torch_version`; returns contract ID -> why (their tests are not run,
        and they count toward no level)."""
        from dataclasses import replace

        from .versions import release

        running = release(torch_version)
        left_out = {}
        for contract in self.active():
            if contract.min_torch and running < release(contract.min_torch):
                reason = f"needs torch >= {contract.min_torch}, this run has {torch_version}"
                self.contracts[contract.id] = replace(contract, retired=reason)
                left_out[contract.id] = reason
        return left_out

    def get(self, contract_id: str) -> Contract:
        try:
            return self.contracts[contract_id]
        except KeyError:
            raise KeyError(f"unknown contract ID {contract_id!r}") from None


def load(path: str | Path) -> Registry:
    """Read and validate the registry at `path`."""
    path = Path(path)
    data = read_toml(path, RegistryError, "contract registry")

    def need(table: dict, key: str, where: str):
        if key not in table:
            raise RegistryError(f"{path}: {where} lacks '{key}'")
        return table[key]

    levels = need(data, "levels", "the registry")
    if tuple(levels) != LEVELS:
        raise RegistryError(f"{path}: [levels] must be exactly {LEVELS}, got {tuple(levels)}")
    features = {
        name: Feature(name, bool(spec.get("optional", False)), spec.get("description", ""))
        for name, spec in need(data, "features", "the registry").items()
    }
    requirements = {}
    for level, needed in data.get("level_requirements", {}).items():
        if level not in LEVELS:
            raise RegistryError(f"{path}: [level_requirements] names {level!r}, not one of {LEVELS}")
        if not isinstance(needed, list) or not needed or not all(
                isinstance(f, str) and f in features and features[f].optional for f in needed):
            raise RegistryError(f"{path}: [level_requirements] {level} must list optional features of [features]")
        requirements[level] = list(needed)
    registry = Registry(
        path=path,
        schema_version=int(need(data, "schema_version", "the registry")),
        levels=dict(levels),
        areas=dict(need(data, "areas", "the registry")),
        features=features,
        level_requirements=requirements,
    )
    for index, entry in enumerate(need(data, "contract", "the registry")):
        where = f"contract #{index + 1}"
        contract_id = need(entry, "id", where)
        where = f"contract {contract_id}"
        if not ID_PATTERN.match(contract_id):
            raise RegistryError(f"{path}: {where}: ID must look like 'DM-SET-001'")
        if contract_id in registry.contracts:
            raise RegistryError(f"{path}: {where}: duplicate ID")
        unknown = set(entry) - {"id", "area", "level", "statement", "source", "features", "retired", "clauses",
                                "decided_by", "other_choices", "waive_check", "waive_mutant", "min_torch",
                                "known_fix"}
        if unknown:
            raise RegistryError(f"{path}: {where}: unknown keys {sorted(unknown)}")
        area, level = need(entry, "area", where), need(entry, "level", where)
        if area not in registry.areas:
            raise RegistryError(f"{path}: {where}: unknown area {area!r}")
        if level not in LEVELS:
            raise RegistryError(f"{path}: {where}: level must be one of {LEVELS}, got {level!r}")
        contract_features = tuple(entry.get("features", ()))
        for feature in contract_features:
            if feature not in features:
                raise RegistryError(f"{path}: {where}: unknown feature {feature!r}")
        min_torch = str(entry.get("min_torch", ""))
        if min_torch:
            from .versions import release

            try:
                release(min_torch)
            except ValueError:
                raise RegistryError(f"{path}: {where}: min_torch must be a torch release like '2.14', "
                                    f"got {min_torch!r}") from None
        clauses = tuple(entry.get("clauses", ()))
        if not all(isinstance(c, str) and c.strip() for c in clauses):
            raise RegistryError(f"{path}: {where}: clauses must be non-empty strings")
        waivers = {}
        for key in ("waive_check", "waive_mutant"):
            table = entry.get(key, {})
            for number, reason in table.items():
                if not (str(number).isdigit() and 1 <= int(number) <= len(clauses)):
                    raise RegistryError(f"{path}: {where}: {key} names clause {number}, but the contract "
                                        f"has clauses 1..{len(clauses)}")
                if not str(reason).strip():
                    raise RegistryError(f"{path}: {where}: {key} for clause {number} needs a reason")
            waivers[key] = {f"{contract_id}.{number}": str(reason) for number, reason in table.items()}
        fixes = []
        for number, table in enumerate(entry.get("known_fix", ()), 1):
            what = f"{where}: known_fix #{number}"
            if not isinstance(table, dict) or set(table) - {"fix", "guide", "symptom", "clause"}:
                raise RegistryError(f"{path}: {what}: a table of fix, guide, symptom and clause")
            fix = KnownFix(**{key: str(value) for key, value in table.items()})
            if not fix.fix.strip() or not re.fullmatch(r"[\w./-]+\.md#[\w-]+", fix.guide):
                raise RegistryError(f"{path}: {what}: needs a fix and a guide like 'vendor-guide.md#section'")
            if not (fix.symptom or fix.clause):
                raise RegistryError(f"{path}: {what}: needs a symptom or a clause to recognise it by")
            if fix.clause and fix.clause not in [f"{contract_id}.{k}" for k in range(1, len(clauses) + 1)]:
                raise RegistryError(f"{path}: {what}: clause {fix.clause!r} is not one of this contract's")
            try:
                re.compile(fix.symptom)
            except re.error as e:
                raise RegistryError(f"{path}: {what}: symptom is not a regular expression: {e}") from None
            fixes.append(fix)
        registry.contracts[contract_id] = Contract(
            id=contract_id,
            area=area,
            level=level,
            statement=need(entry, "statement", where),
            source=need(entry, "source", where),
            features=contract_features,
            retired=entry.get("retired"),
            clauses=clauses,
            decided_by=entry.get("decided_by", ""),
            other_choices=entry.get("other_choices", ""),
            waive_check=waivers["waive_check"],
            waive_mutant=waivers["waive_mutant"],
            min_torch=min_torch,
            known_fixes=tuple(fixes),
        )
    return registry


def default_path() -> Path:
    """The registry shipped with the suite."""
    from importlib import resources

    return Path(str(resources.files("privateuse1_conformance.conformance") / "contracts.toml"))
