"""Splitting a run into shards (``--shard K/N``) that CI runs as N jobs.

The split is a pure function of the run's selection: the tests a run would
run (after ``--level``, ``--contract``, ``--test``, ``-k``, ``-m`` and the
``--operators`` selection) are sorted by their report IDs, and test *i* of
that order (counting from 0) goes to shard ``i % N + 1``. Every job of a CI
matrix that runs the same kit, torch, backend and options therefore computes
the same split, with no file passed between jobs; consecutive tests (an
operator's neighbours in the alphabet, a file's tests) land in different
shards, which spreads the slow ones.

Each shard's report records its part (`provenance.shard`): K, N, how many
tests the whole run selected and the sha256 of their IDs. ``privateuse1-
conformance merge`` (reports/merge.py) refuses shards that disagree on any
of it, and the merged report's tests must hash to that digest: a lost,
duplicated or foreign shard cannot produce a report that verifies.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

import pytest

from privateuse1_conformance.reports.model import selection_digest


@dataclass(frozen=True)
class Shard:
    index: int   # K, from 1
    count: int   # N

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse(text: str) -> Shard:
    """'K/N' with 1 <= K <= N; ValueError naming the valid form otherwise."""
    index, slash, count = str(text).strip().partition("/")
    try:
        shard = Shard(int(index), int(count))
    except ValueError:
        shard = None
    if not slash or shard is None or not 1 <= shard.index <= shard.count:
        raise ValueError(f"--shard: expected K/N with whole numbers 1 <= K <= N (e.g. 2/4), got {text!r}")
    return shard


def argparse_type(text: str) -> Shard:
    try:
        return parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def part(test_ids: list[str], shard: Shard) -> set[str]:
    """The test IDs of `shard`: every N-th of the sorted IDs, from the K-th."""
    ordered = sorted(set(test_ids))
    return set(ordered[shard.index - 1::shard.count])


class Selector:
    """The plugin that keeps one shard's tests. Its collection hook runs
    last, after every other selection, so that the split is of the tests
    the run would otherwise run (in an xdist worker too: each worker keeps
    the same shard, and reports the whole selection to the controller)."""

    def __init__(self, shard: Shard, test_id: Callable[[str], str]) -> None:
        self.shard = shard
        self.test_id = test_id
        self.selected: int | None = None     # the whole run's test count, before the split
        self.digest: str | None = None       # selection_digest of the whole run's test IDs
        self.ids: set[str] = set()           # the whole run's test IDs
        self.kept = 0

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        ids = {item.nodeid: self.test_id(item.nodeid) for item in items}
        self.ids = set(ids.values())
        self.selected = len(self.ids)
        self.digest = selection_digest(ids.values())
        mine = part(list(ids.values()), self.shard)
        kept = [item for item in items if ids[item.nodeid] in mine]
        dropped = [item for item in items if ids[item.nodeid] not in mine]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        self.kept = len(kept)
        if hasattr(config, "workeroutput"):  # xdist worker: tell the controller
            config.workeroutput["privateuse1_shard"] = [self.selected, self.digest]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:  # xdist controller
        reported = getattr(node, "workeroutput", {}).get("privateuse1_shard")
        if reported:
            self.selected, self.digest = reported

    def record(self, expectations_decided: list[str]) -> dict:
        """provenance.shard. Until the selection is known (before collection;
        in an xdist controller, until the workers stop) it says 0 tests
        selected, which no merge accepts."""
        return {"index": self.shard.index, "count": self.shard.count, "selected": self.selected or 0,
                "selection_sha256": self.digest or selection_digest([]),
                "expectations_decided": list(expectations_decided)}
