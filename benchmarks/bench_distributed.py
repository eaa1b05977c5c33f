"""all_reduce among two ranks: OpenReg's process group (orccl, on openreg
tensors) next to gloo (on CPU tensors), in the same processes and run.

    python benchmarks/bench_distributed.py [--iterations N]

Prints one JSON line: per size (4 KiB, 64 MiB), each backend's median time
per all_reduce (the call and the wait for its result: a device
synchronization for openreg tensors), its latency in microseconds and its
bus bandwidth (2 (n - 1) / n x bytes / time, NCCL's convention), with the
targets of the distributed issue: at 64 MiB at least gloo's bus bandwidth,
at 4 KiB a latency within 2x gloo's. Run in each execution mode by
run_all.py (OPENREG_EXECUTOR).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = {"4 KiB": 4 << 10, "64 MiB": 64 << 20}
WORLD = 2


def rank_main(rank: int, store: str, iterations: int) -> None:
    import torch
    import torch.distributed as dist

    import openreg  # noqa: F401 - registers orccl

    torch.accelerator.set_device_index(rank % torch.accelerator.device_count())
    dist.init_process_group(backend="cpu:gloo,openreg:orccl", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    results = {}
    for label, size in SIZES.items():
        results[label] = {}
        for backend, device in (("gloo", "cpu"), ("orccl", "openreg")):
            t = torch.ones(size // 4, dtype=torch.float32, device=device)
            count = iterations if size < (1 << 20) else max(3, iterations // 50)
            times = []
            for k in range(count + 2):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(t)
                if device != "cpu":
                    torch.accelerator.synchronize()
                elapsed = time.perf_counter() - start
                if k >= 2:  # warm-up: first use of the size
                    times.append(elapsed)
            median = statistics.median(times)
            results[label][backend] = {"latency_us": round(median * 1e6, 1),
                                       "bus_gb_s": round(2 * (WORLD - 1) / WORLD * size / median / 1e9, 3)}
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(results))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.store, args.iterations)
        return 0
    store = tempfile.mktemp(prefix="bench-distributed-")
    children = [subprocess.Popen([sys.executable, __file__, "--rank", str(rank), "--store", store,
                                  "--iterations", str(args.iterations)], stdout=subprocess.PIPE, text=True)
                for rank in range(WORLD)]
    outputs = [child.communicate(timeout=600)[0] for child in children]
    if any(child.returncode for child in children):
        print(f"a rank failed: exit statuses {[c.returncode for c in children]}", file=sys.stderr)
        return 1
    results = json.loads(outputs[0].strip().splitlines()[-1])
    small, large = results["4 KiB"], results["64 MiB"]
    results["targets"] = {
        "latency_4kib_ratio_to_gloo": round(small["orccl"]["latency_us"] / small["gloo"]["latency_us"], 2),
        "latency_4kib_target_ratio": 2.0,
        "bus_bandwidth_64mib_ratio_to_gloo": round(large["orccl"]["bus_gb_s"] / large["gloo"]["bus_gb_s"], 2),
        "bus_bandwidth_64mib_target_ratio": 1.0,
    }
    results["mode"] = os.environ.get("OPENREG_EXECUTOR", "thread")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
