"""torch.compile with Inductor on OpenReg: compiled against eager, and the
compile time, for the two models of tests/test_inductor.py, next to the
same measurements on the CPU in the same run (docs/reference-backend/inductor.md).

    python benchmarks/bench_inductor.py [--json results.json]

Each time is the best of several repeats of a synchronized step (forward,
or forward and backward); compile times are of the first call, once with an
empty Inductor cache (a fresh TORCHINDUCTOR_CACHE_DIR: kernels compiled) and
once with the cache warm (a fresh process's dynamo, Inductor's caches
filled by the first), each measured in its own interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

REPEATS = 20


def models():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.GELU(),
                              torch.nn.Linear(512, 10))
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 10))
    return {"mlp": (mlp, (64, 256)), "cnn": (cnn, (16, 3, 32, 32))}


def synchronize(device: str) -> None:
    if device != "cpu":
        torch.openreg.synchronize()


def best_of(step, device: str) -> float:
    step()
    synchronize(device)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        step()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def step_times(name: str, device: str) -> dict:
    model, shape = models()[name]
    model = model.to(device)
    x = torch.randn(shape, device=device)
    compiled = torch.compile(model)

    def forward(m):
        return lambda: m(x)

    def train(m):
        def run():
            for p in m.parameters():
                p.grad = None
            m(x).square().sum().backward()
        return run

    row = {}
    for what, make in (("forward", forward), ("forward+backward", train)):
        eager = best_of(make(model), device)
        fast = best_of(make(compiled), device)
        row[what] = {"eager_ms": round(eager * 1e3, 3), "compiled_ms": round(fast * 1e3, 3),
                     "speedup": round(eager / fast, 2)}
    return row


def compile_time(name: str, device: str, cache_dir: str) -> float:
    """Seconds of the first compiled forward+backward, in a new interpreter."""
    code = (
        "import sys, time, torch\n"
        "sys.path.insert(0, %r)\n"
        "import bench_inductor as b\n"
        "model, shape = b.models()[%r]\n"
        "model = model.to(%r); x = torch.randn(shape, device=%r)\n"
        "start = time.perf_counter()\n"
        "torch.compile(model)(x).sum().backward(); b.synchronize(%r)\n"
        "print(time.perf_counter() - start)\n"
    ) % (os.path.dirname(os.path.abspath(__file__)), name, device, device, device)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    import openreg  # noqa: F401

    results = {"threads": torch.get_num_threads(), "models": {}}
    for name in ("mlp", "cnn"):
        entry = {}
        for device in ("openreg", "cpu"):
            times = step_times(name, device)
            with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache:
                cold = compile_time(name, device, cache)
                warm = compile_time(name, device, cache)
            times["compile_s"] = {"cold": round(cold, 2), "warm": round(warm, 2)}
            entry[device] = times
        results["models"][name] = entry
    print(f"{'model':<5} {'device':<8} {'step':<17} {'eager ms':>9} {'compiled ms':>12} {'speedup':>8}")
    for name, entry in results["models"].items():
        for device, times in entry.items():
            for what in ("forward", "forward+backward"):
                t = times[what]
                print(f"{name:<5} {device:<8} {what:<17} {t['eager_ms']:>9} {t['compiled_ms']:>12} {t['speedup']:>8}")
            print(f"{name:<5} {device:<8} compile (s): cold {times['compile_s']['cold']}, warm {times['compile_s']['warm']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
