"""The distributed area's rank launcher (conformance/_distributed.py): every
rank's crash, exception and hang comes back bounded, with what it observed
before."""

from __future__ import annotations

from kit_support import OPENREG_RANKS, SCENARIO_ENV
from privateuse1_conformance.conformance._distributed import Raised, run_ranks


def test_a_crashing_rank_and_a_raising_step_are_reported_with_what_came_before():
    outcomes = run_ranks(OPENREG_RANKS, "orccl", "crash_one", module="kit_dist_scenarios", budget=120,
                         env=SCENARIO_ENV)
    zero, one = outcomes
    assert zero.ok and zero.observed["before"] == 0 and zero.observed["after"] == "done"
    assert isinstance(zero.observed["raises"], Raised) and "ZeroDivisionError" in zero.observed["raises"].message
    assert one.exit == "signal SIGABRT" and one.observed == {"before": 1}
    assert "SIGABRT" in one.describe()


def test_a_hanging_rank_is_killed_at_the_budget_and_keeps_its_observations():
    outcomes = run_ranks(OPENREG_RANKS, "orccl", "hang_one", module="kit_dist_scenarios", budget=30,
                         env=SCENARIO_ENV)
    zero, one = outcomes
    assert zero.ok
    # Killed either way: still running, or (on a very busy machine) not started.
    assert one.exit is not None and one.exit.startswith("killed"), one.exit
    if "still running" in one.exit:
        assert one.observed == {"started": True}
