"""Long stress run of OpenReg through PyTorch: worker threads on every device,
several streams each, copies, operators and stream ordering, with every
result checked against the CPU, while another thread loops
torch.openreg.empty_cache() (the workload of tests/stress_openreg.py, which
tests/test_openreg_stress.py runs for a few seconds).

    python benchmarks/stress.py [--seconds 120] [--devices 2] [--threads 2]
                                [--workload mixed|fill] [--json]

Prints iterations, checks, checks per second and every problem found; exits
with 1 on any wrong result, exception or hung thread, 0 otherwise. Not part
of run_all.py (it measures correctness under load, not speed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import stress_openreg  # noqa: E402 - needs the path above; imports no backend yet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    stress_openreg.add_arguments(parser, seconds=120.0)
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = parser.parse_args(argv)
    # (Sets OPENREG_DEVICE_COUNT to --devices before openreg is imported.)
    summary = stress_openreg.run_from_args(args)
    print(json.dumps(summary.as_dict()) if args.json else summary.text(), flush=True)
    stress_openreg.leave(0 if summary.ok else 1, bool(summary.hangs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
