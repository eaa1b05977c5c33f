"""Scenarios for tests/test_kit_distributed.py: ranks that crash, hang or
raise, run by the kit's rank launcher (conformance/_distributed.py)."""

import os
import time


def crash_one(r):
    r.record("before", r.rank)
    if r.rank == 1:
        os.abort()
    r.step("raises", lambda: 1 / 0)
    r.record("after", "done")


def hang_one(r):
    r.record("started", True)
    if r.rank == 1:
        time.sleep(3600)
