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
class Contract:
    id: str
    area: str
    level: str
    statement: str
    source: str
    features: tuple[str, ...] = ()
    retired: str | None = None

    @property
    def level_rank(self) -> int:
        return LEVELS.index(self.level)


@dataclass
class Registry:
    path: Path
    schema_version: int
    levels: dict[str, str]
    areas: dict[str, str]
    features: dict[str, Feature]
    contracts: dict[str, Contract] = field(default_factory=dict)

    def active(self) -> list[Contract]:
        """Contracts that are not retired, in registry order."""
        return [c for c in self.contracts.values() if c.retired is None]

    def up_to(self, level: str) -> list[Contract]:
        """Active contracts of `level` and the levels below it."""
        rank = LEVELS.index(level)
        return [c for c in self.active() if c.level_rank <= rank]

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
    registry = Registry(
        path=path,
        schema_version=int(need(data, "schema_version", "the registry")),
        levels=dict(levels),
        areas=dict(need(data, "areas", "the registry")),
        features=features,
    )
    for index, entry in enumerate(need(data, "contract", "the registry")):
        where = f"contract #{index + 1}"
        contract_id = need(entry, "id", where)
        where = f"contract {contract_id}"
        if not ID_PATTERN.match(contract_id):
            raise RegistryError(f"{path}: {where}: ID must look like 'DM-SET-001'")
        if contract_id in registry.contracts:
            raise RegistryError(f"{path}: {where}: duplicate ID")
        unknown = set(entry) - {"id", "area", "level", "statement", "source", "features", "retired"}
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
        registry.contracts[contract_id] = Contract(
            id=contract_id,
            area=area,
            level=level,
            statement=need(entry, "statement", where),
            source=need(entry, "source", where),
            features=contract_features,
            retired=entry.get("retired"),
        )
    return registry


def default_path() -> Path:
    """The registry shipped with the suite."""
    from importlib import resources

    return Path(str(resources.files("privateuse1_conformance.conformance") / "contracts.toml"))
