"""Run every benchmark and write benchmarks/results.json plus a table of
ratios against the targets of the performance issue.

    python benchmarks/run_all.py [--quick] [--suite-only] [--distributed-only]

--quick leaves out the suite's two default runs (one worker, and the
default's one per core: minutes each). --suite-only re-takes the suite's
figures alone and puts them into the existing benchmarks/results.json;
--distributed-only does the same for the process group's all_reduce.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CXX_BENCH = REPO / "build" / "dev" / "benchmarks" / "cxx" / "openreg_bench_device"
RUNTIME_BUILD = REPO / "build" / "openreg" / "runtime"
MODES_BENCH = RUNTIME_BUILD / "openreg_bench_modes"
KERNELS_MODULE = RUNTIME_BUILD / "libopenreg_test_kernels.so"


def cxx_benchmarks() -> tuple[list[dict], list[dict]]:
    """(device management rows, allocator rows) from the Google Benchmark binary."""
    if not CXX_BENCH.exists():
        missing = [{"name": "C++ benchmarks not built (install libbenchmark-dev, then make build)"}]
        return missing, missing
    out = subprocess.run([str(CXX_BENCH), "--benchmark_format=json", "--benchmark_min_time=0.3"],
                         capture_output=True, text=True, check=True).stdout
    times = {b["name"]: b["real_time"] for b in json.loads(out)["benchmarks"]}
    tls = times["BM_ThreadLocalReadWrite"]
    floor = times["BM_DeviceGuardNoOpImpl"]
    device, allocator = [], []
    for name, ns in times.items():
        base, _, size = name.partition("/")
        if size:  # allocator pairs, per size: against malloc/free of that size
            allocator.append({"name": name, "bytes": int(size), "ns": round(ns, 1),
                              "pairs_per_s": round(1e9 / ns),
                              "ratio_to_malloc": round(ns / times[f"BM_HostMallocFree/{size}"], 2)})
            continue
        row = {"name": name, "ns": round(ns, 2), "ratio_to_tls": round(ns / tls, 1)}
        if name.startswith("BM_DeviceGuard"):
            row["ratio_to_noop_guard"] = round(ns / floor, 2)
        if name == "BM_DeviceGuardSameDevice":
            row["target_ratio_to_tls"] = 3.0
        device.append(row)
    return device, allocator


def execution_modes() -> list[dict]:
    """The runtime in thread and process mode (OPENREG_EXECUTOR), side by side: one
    row per benchmark with both times, from one run of each mode on this machine."""
    if not MODES_BENCH.exists():
        return [{"name": "execution-mode benchmarks not built (install libbenchmark-dev, then make build)"}]
    times: dict[str, dict[str, float]] = {}
    for mode in ("thread", "process"):
        env = {**__import__("os").environ, "OPENREG_EXECUTOR": mode, "OPENREG_DEVICE_COUNT": "1",
               "OPENREG_DEVICE_MEMORY": "1G"}
        out = subprocess.run([str(MODES_BENCH), str(KERNELS_MODULE), "--benchmark_format=json",
                              "--benchmark_min_time=0.3"],
                             capture_output=True, text=True, check=True, env=env).stdout
        for b in json.loads(out)["benchmarks"]:
            times.setdefault(b["name"].removesuffix("/real_time"), {})[mode] = b["real_time"]
    rows = []
    for name, by_mode in times.items():
        row = {"name": name, "thread_ns": round(by_mode["thread"], 1),
               "process_ns": round(by_mode["process"], 1)}
        base, _, size = name.partition("/")
        if base.startswith("BM_Copy"):
            memcpy = times[f"BM_HostMemcpy/{size}"]["thread"]
            row["thread_ratio_to_memcpy"] = round(memcpy / by_mode["thread"], 2)
            row["process_ratio_to_memcpy"] = round(memcpy / by_mode["process"], 2)
            if size == str(256 << 20):
                row["process_target_ratio_to_memcpy"] = 0.5
        if base == "BM_EmptyKernelRoundTrip":
            row["process_target_us"] = 20
        rows.append(row)
    return rows


def torch_execution_modes() -> list[dict]:
    """PyTorch operators in thread and process mode, side by side (bench_modes_torch.py,
    one interpreter per mode), with the CPU's call as the reference."""
    by_mode = {}
    for mode in ("thread", "process"):
        env = {**__import__("os").environ, "OPENREG_EXECUTOR": mode}
        out = subprocess.run([sys.executable, str(HERE / "bench_modes_torch.py")], capture_output=True,
                             text=True, check=True, env=env).stdout
        by_mode[mode] = json.loads(out.splitlines()[-1])["us"]
    return [{"name": name, "thread_us": by_mode["thread"][name], "process_us": by_mode["process"][name]}
            for name in by_mode["thread"]]


def distributed() -> list[dict]:
    """all_reduce among two ranks, OpenReg's process group next to gloo
    (bench_distributed.py), in each execution mode."""
    rows = []
    for mode in ("thread", "process"):
        env = {**__import__("os").environ, "OPENREG_EXECUTOR": mode}
        out = subprocess.run([sys.executable, str(HERE / "bench_distributed.py")], capture_output=True,
                             text=True, check=True, env=env).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--suite-only", action="store_true")
    parser.add_argument("--distributed-only", action="store_true")
    args = parser.parse_args()
    if args.distributed_only:
        results = json.loads((HERE / "results.json").read_text())
        results["distributed"] = distributed()
        (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        print_table(results)
        print(f"\nwritten {HERE / 'results.json'} (the process group's figures)")
        return 0
    suite_args = [sys.executable, str(HERE / "bench_suite.py"), "--output", str(HERE / "results-suite.json")]
    if args.quick:
        suite_args += ["--quick"]
    if args.suite_only:
        results = json.loads((HERE / "results.json").read_text())
        subprocess.run(suite_args, check=True)
        results["suite"] = json.loads((HERE / "results-suite.json").read_text())
        (HERE / "results-suite.json").unlink()
        (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        print_table(results)
        print(f"\nwritten {HERE / 'results.json'} (the suite's figures)")
        return 0

    sys.path.insert(0, str(HERE))
    import bench_backend

    results = {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                           "cpus": __import__("os").cpu_count()}}
    results["device_management_cxx"], results["allocator_cxx"] = cxx_benchmarks()
    results["execution_modes"] = execution_modes()
    results["torch_execution_modes"] = torch_execution_modes()
    results.update(bench_backend.run())
    subprocess.run(suite_args, check=True)
    results["suite"] = json.loads((HERE / "results-suite.json").read_text())
    (HERE / "results-suite.json").unlink()
    # torch.compile with Inductor against eager, and compile times, on
    # openreg and on the CPU (its own interpreter: it compiles models).
    inductor_json = HERE / "results-inductor.json"
    subprocess.run([sys.executable, str(HERE / "bench_inductor.py"), "--json", str(inductor_json)], check=True)
    results["inductor"] = json.loads(inductor_json.read_text())
    inductor_json.unlink()
    results["distributed"] = distributed()
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"\nwritten {HERE / 'results.json'}")
    return 0


def print_table(results: dict) -> None:
    print("\n== targets ==")

    def line(what: str, value: str, target: str, met: bool | None) -> None:
        verdict = "" if met is None else ("met" if met else "MISSED")
        print(f"{what:<62} {value:>18} {target:>16}  {verdict}")

    cxx = {r["name"]: r for r in results["device_management_cxx"] if "ns" in r}
    if cxx:
        guard = cxx["BM_DeviceGuardSameDevice"]
        line("DeviceGuard enter+exit vs thread-local read/write (C++)", f"x{guard['ratio_to_tls']}",
             "<= x3", guard["ratio_to_tls"] <= 3)
        line("  (same, vs PyTorch's no-op guard implementation)", f"x{guard['ratio_to_noop_guard']}", "", None)
    for r in results["device_management_python"]:
        if r.get("target_ratio"):
            line(f"{r['name']} vs no-op pybind11 call", f"x{r['ratio']}", f"<= x{r['target_ratio']}",
                 r["ratio"] <= r["target_ratio"])
    for r in results["small_ops"]:
        if r.get("target_ratio"):
            line(f"{r['name']} vs CPU (sync)", f"x{r['ratio']}", f"<= x{r['target_ratio']}",
                 r["ratio"] <= r["target_ratio"])
        if r.get("target_us"):
            line(r["name"], f"{r['openreg_us']} us", f"< {r['target_us']} us", r["openreg_us"] < r["target_us"])
    for r in results["copies"]:
        if r.get("target_ratio"):
            line(f"{r['name']} vs memcpy", f"x{r['ratio_to_memcpy']}", f">= x{r['target_ratio']}",
                 r["ratio_to_memcpy"] >= r["target_ratio"])
    for r in results["allocator_cxx"]:
        if "ns" in r and not r["name"].startswith("BM_HostMallocFree"):
            line(f"{r['name']} (C++, allocate+free) vs malloc/free", f"{r['ns']} ns x{r['ratio_to_malloc']}",
                 "(no target)", None)
    for r in results.get("torch_execution_modes", []):
        line(f"torch {r['name']}, thread / process mode"[:62], f"{r['thread_us']:.1f} / {r['process_us']:.1f} us",
             "", None)
    for r in results.get("execution_modes", []):
        if "thread_ns" not in r:
            continue
        line(f"runtime {r['name']}, thread / process mode",
             f"{r['thread_ns'] / 1000:.1f} / {r['process_ns'] / 1000:.1f} us", "", None)
        if r.get("process_target_us"):
            us = r["process_ns"] / 1000
            line(f"  process mode {r['name']}", f"{us:.1f} us", f"< {r['process_target_us']} us",
                 us < r["process_target_us"])
        if r.get("process_target_ratio_to_memcpy"):
            line(f"  process mode {r['name']} vs memcpy", f"x{r['process_ratio_to_memcpy']}",
                 f">= x{r['process_target_ratio_to_memcpy']}",
                 r["process_ratio_to_memcpy"] >= r["process_target_ratio_to_memcpy"])
    for row in results.get("distributed", []):
        mode, small, large, targets = row["mode"], row["4 KiB"], row["64 MiB"], row["targets"]
        default = mode == "thread"  # the targets hold for the default execution mode
        line(f"all_reduce 4 KiB, 2 ranks, orccl vs gloo ({mode} mode)",
             f"{small['orccl']['latency_us']:.0f} us x{targets['latency_4kib_ratio_to_gloo']}",
             f"<= x{targets['latency_4kib_target_ratio']:g}" if default else "",
             targets["latency_4kib_ratio_to_gloo"] <= targets["latency_4kib_target_ratio"] if default else None)
        line(f"all_reduce 64 MiB bus bandwidth, orccl vs gloo ({mode} mode)",
             f"{large['orccl']['bus_gb_s']:.2f} GB/s x{targets['bus_bandwidth_64mib_ratio_to_gloo']}",
             f">= x{targets['bus_bandwidth_64mib_target_ratio']:g}" if default else "",
             targets["bus_bandwidth_64mib_ratio_to_gloo"] >= targets["bus_bandwidth_64mib_target_ratio"]
             if default else None)
    suite = results["suite"]
    iso = suite["isolation"]
    line("isolation overhead per test", f"{iso['overhead_per_test_ms']} ms", "< 20 ms",
         iso["overhead_per_test_ms"] < 20)
    core = suite["core"]
    line("core run (1 worker): run time / its tests' own time", f"x{core['overhead_ratio']}",
         f"<= x{core['target_overhead_ratio']}", core["overhead_ratio"] <= core["target_overhead_ratio"])
    rerun = suite["rerun"]
    line("one-contract rerun: command time besides its tests", f"{rerun['before_and_after_tests_s']} s",
         "(no target)", None)
    for row in suite.get("core_by_devices", [])[1:]:
        line(f"core run growth, {suite['core_by_devices'][0]['devices']} -> {row['devices']} devices",
             f"x{row['growth']}", f"<= x{row['devices'] / suite['core_by_devices'][0]['devices']:g}",
             row["growth"] <= row["devices"] / suite["core_by_devices"][0]["devices"])
    runs = suite.get("default_run")
    if runs:
        line(f"default run: {runs['default']['workers']} workers vs 1", f"x{runs['speedup']} faster",
             f">= x{runs['target_speedup']}", runs["speedup"] >= runs["target_speedup"])
        line("default run: verdicts that differ with the number of workers",
             f"{len(runs['verdicts_differing'])} of {runs['verdicts_compared']}", "0",
             not runs["verdicts_differing"])
    for name, entry in results.get("inductor", {}).get("models", {}).items():
        for device, times in entry.items():
            for what in ("forward", "forward+backward"):
                line(f"torch.compile {name} {what} on {device}, eager / compiled",
                     f"x{times[what]['speedup']}", "(no target)", None)
            line(f"torch.compile {name} first call on {device}, cold / warm cache",
                 f"{times['compile_s']['cold']} / {times['compile_s']['warm']} s", "(no target)", None)


if __name__ == "__main__":
    sys.exit(main())
