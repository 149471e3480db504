#!/usr/bin/env python3
"""Ratio table for graphrun's benchmarks (Python 3, stdlib only).

Reads Google Benchmark JSON files (--benchmark_out=x.json
--benchmark_out_format=json) and prints each Session case against its
baselines from the same process, with the targets and PASS/MISS.

    bench/ratios.py sched.json ops.json
    bench/ratios.py --format markdown run1/*.json run2/*.json
    bench/ratios.py --strict *.json    # exit status 1 on any MISS or missing row

A target whose benchmark ran but reported an error (the GEMM bench's
AVX-512 rows on a CPU without AVX-512: "this CPU lacks the level") is
SKIPPED with that message, not MISSING, and --strict does not count it.

Benchmarks are named BM_<Case>_<Variant>. Times are real (wall) times. When
a benchmark appears more than once (several files, or --benchmark_repetitions)
the median is used; a "median" aggregate in the file is used as is.
"""

import argparse
import json
import statistics
import sys

# The call-graph baseline (bench/scheduler/call_graph_bench.cc) at 1 and 2
# threads: the faster of the raw graph laid out in run order and in the DAG's
# order ("A|B" in a denominator: the fastest of those present).
RAW = {t: f"Raw{t}T|RawIdOrder{t}T" for t in (1, 2)}


def call_graph_rows(case, what):
    """A call-graph DAG's rows: default Call nodes (<= 1x), every node a task
    (<= 1.2x), at 1 and 2 threads; declared cheap at 1 thread (reported)."""
    rows = []
    for t in (1, 2):
        threads = "1 thread" if t == 1 else f"{t} threads"
        rows.append((case, f"Call{t}T", RAW[t], "slowdown", 1.0, f"{what}, measured cost, {threads}"))
    for t in (1, 2):
        threads = "1 thread" if t == 1 else f"{t} threads"
        rows.append((case, f"Task{t}T", RAW[t], "slowdown", 1.2,
                     f"{what}, every node a task, {threads}"))
    rows.append((case, "Cheap1T", RAW[1], "slowdown", None, f"{what}, declared cheap"))
    return rows


# (case, numerator, denominator, mode, target, note)
# mode "slowdown": ratio = time(numerator) / time(denominator), PASS when <= target.
# mode "speedup":  ratio = time(denominator) / time(numerator), PASS when >= target.
# target None: informational.
ROWS = [
    ("SmallGraph", "Session", "RawFlowGraph", "slowdown", 2.0,
     "Session::run by name vs prebuilt flow graph, same kernels"),
    ("SmallGraph", "SessionOutputs", "RawFlowGraph", "slowdown", None, "run by Output"),
    ("SmallGraph", "Callable", "RawFlowGraph", "slowdown", None, "prepared Callable"),
    ("SmallGraph", "Session", "RawFlowGraphFloat", "slowdown", None,
     "vs oneTBB floor (float bodies)"),
    ("SmallGraph", "RawFlowGraph", "RawFlowGraphFloat", "slowdown", None,
     "kernels+Tensors on the floor"),
    ("SmallGraph", "Session", "Sequential", "slowdown", None, "vs same kernels in a loop"),
    ("NoOpChain10k", "Session", "RawFlowGraph", "slowdown", 1.25,
     "vs 10k empty continue_nodes"),
    ("NoOpChain10k", "Callable", "RawFlowGraph", "slowdown", None, "prepared Callable"),
    ("NoOpChain10k", "RawFlowGraphKernels", "RawFlowGraph", "slowdown", None,
     "NoOp kernel call in the body"),
    ("NoOpChain10k", "Session", "RawFlowGraphKernels", "slowdown", None,
     "scheduler beyond the kernel call"),
    ("NoOpChain10k", "RawFlowGraphPlanOrder", "RawFlowGraph", "slowdown", None,
     "nodes in breadth-first order"),
    ("Wavefront100x100", "Session", "RawFlowGraph", "slowdown", 1.25,
     "vs 100x100 empty continue_nodes"),
    ("Wavefront100x100", "Callable", "RawFlowGraph", "slowdown", None, "prepared Callable"),
    ("Wavefront100x100", "RawFlowGraphKernels", "RawFlowGraph", "slowdown", None,
     "NoOp kernel call in the body"),
    ("Wavefront100x100", "Session", "RawFlowGraphKernels", "slowdown", None,
     "scheduler beyond the kernel call"),
    ("Wavefront100x100", "RawFlowGraphPlanOrder", "RawFlowGraph", "slowdown", None,
     "nodes in breadth-first order"),
    # A user's own nodes (bench/scheduler/call_graph_bench.cc): default Call nodes on
    # empty bodies vs the fastest plain continue_node graph calling the same function
    # ("A|B": the faster of the raw graph laid out in run order and in the DAG's order).
    ("CallSmall10", "Call1T", RAW[1], "slowdown", 0.7,
     "10 Call nodes, measured cheap: inline, 1 thread"),
    ("CallSmall10", "Call2T", RAW[2], "slowdown", 0.7, "the same, 2 threads"),
    ("CallSmall10", "Task1T", RAW[1], "slowdown", None, "every node a task, 1 thread"),
    *call_graph_rows("CallChain1k", "chain of 1000"),
    *call_graph_rows("CallChain100k", "chain of 100,000"),
    *call_graph_rows("CallTree64k", "binary fan-out tree, 65,535 + sink"),
    *call_graph_rows("CallWavefront256", "wavefront 256x256"),
    ("CallTree64k", "RawIdOrder1T", "Raw1T", "slowdown", None,
     "raw continue_nodes in the DAG's order vs in run order (the baseline), 1 thread"),
    ("CallWavefront256", "RawIdOrder1T", "Raw1T", "slowdown", None,
     "raw continue_nodes in the DAG's order vs in run order (the baseline), 1 thread"),
    ("CallChain10k", "Task1T", RAW[1], "slowdown", None, "chain of 10,000, every node a task"),
    ("ColdChain1M", "Call", "Raw", "slowdown", None,
     "10^6 Call nodes: Graph + Session::create + first run vs raw build + run + destroy"),
    ("ColdChain1k", "Call", "Raw", "slowdown", None, "the same, 10^3 nodes"),
    ("CallChain10k", "Call1T", RAW[1], "slowdown", None, "chain of 10,000, measured cost"),
    ("MatMul64", "Session", "Sequential", "speedup", 1.9,
     "64x 256^3 MatMul + Add tree, 2 cores vs 1"),
    ("MatMul64", "RawFlowGraph", "Sequential", "speedup", None, "what oneTBB alone gets"),
    ("MatMul64", "RawFlowGraphNoIntraOp", "Sequential", "speedup", None,
     "inter-op only (no MatMul split)"),
    ("MatMul64", "Session", "RawFlowGraph", "slowdown", None, "scheduler overhead, heavy nodes"),
    ("MatMul64", "Session1Thread", "Sequential", "slowdown", None, "1-thread session vs loop"),
    ("Gemm256x256x256", "Callable", "OpenBlas", "speedup", 0.9,
     "MatMul op, 1 thread, vs OpenBLAS serial sgemm"),
    ("Gemm64x256x256", "Callable", "OpenBlas", "speedup", 0.9,
     "seed-model MatMul, 1 thread, vs OpenBLAS sgemm"),
    ("Gemm256x256x256", "Avx512", "Baseline", "speedup", 2.5,
     "the GEMM kernel at AVX-512 vs at the SSE2 baseline, same process"),
    ("Gemm64x256x256", "Avx512", "Baseline", "speedup", 2.5,
     "the same, seed-model shape"),
    ("Gemm256x256x256", "Avx2", "Baseline", "speedup", None, "AVX2+FMA vs baseline"),
    ("Gemm256x256x256", "Callable", "Avx512", "slowdown", None,
     "MatMul op through a Callable vs its kernel called directly"),
    ("SeedModel", "Callable2Threads", "Callable1Thread", "slowdown", 0.6,
     "seed model (4 dense layers + head), 2 threads vs 1"),
    ("SeedModel", "Callable1Thread", "PlainLoop", "slowdown", None,
     "1-thread Callable vs the kernels in a plain loop"),
    ("SeedModel", "Unfused1Thread", "Callable1Thread", "slowdown", None,
     "fuse_kernels=false vs fused, 1 thread"),
    ("SeedModel", "Unfused2Threads", "Callable2Threads", "slowdown", None,
     "fuse_kernels=false vs fused, 2 threads"),
    ("SeedModel", "Async2Threads", "Async1Thread", "slowdown", None,
     "through Callable::run_async one at a time, 2 threads vs 1"),
    ("SeedModel", "Async1Thread", "Callable1Thread", "slowdown", None,
     "run_async + future vs the blocking Callable, 1 thread"),
    # Asynchronous calls: batches of 64, time per batch of all threads ("@N": N threads).
    ("Batch", "CallsAsync@1", "CallsBlocking@1", "slowdown", None,
     "8 user Call nodes: run_async batch vs blocking Callable::run loop, 1 thread"),
    ("Batch", "CallsAsync@8", "CallsBlocking@8", "slowdown", None,
     "the same, 8 client threads"),
    ("Batch", "SmallAsync@1", "SmallBlocking@1", "slowdown", None,
     "10 cheap built-in nodes (inline plan): run_async vs blocking, 1 thread"),
    ("Conv2D", "Session", "KernelLoop", "speedup", None, "3x3 conv, parallel_for vs 1 thread"),
    ("Conv2D", "Session1Thread", "KernelLoop", "slowdown", None, "1-thread session vs loop"),
    ("Conv2DSmall", "NaiveLoop", "KernelLoop", "slowdown", None, "7 loops vs im2col + GEMM"),
    ("Conv2DSmall", "Session", "KernelLoop", "slowdown", None, "below the parallel threshold"),
    ("FirstRun1000", "NewSignature", "RawFlowGraph", "slowdown", 1.5,
     "plan+instance+run vs build+run raw"),
    ("FirstRun1000", "NewSignature", "RawFlowGraphFromGraph", "slowdown", None,
     "same, raw also derives its layout"),
    ("FirstRun1000", "FreshSession", "RawFlowGraph", "slowdown", 1.5,
     "+ 1000 kernels made, arena first use"),
    ("FirstRun1000", "NewSignature", "WarmSession", "slowdown", None,
     "first run vs warm run of a signature"),
    ("FirstRun1000", "WarmSession", "WarmRawFlowGraph", "slowdown", None, "warm run vs raw"),
    ("FirstRun1000", "WarmCallable", "WarmRawFlowGraph", "slowdown", None, "warm Callable vs raw"),
    ("PartialSeed", "PartialRun", "TwoRuns", "speedup", 1.8,
     "seed example: one partial run vs two runs"),
    ("PartialSmall", "SetupAndCall", "Run", "slowdown", 2.0,
     "partial run (setup + 1 call) vs run, 10 nodes"),
    ("PartialSmall", "SetupAndTwoCalls", "Run", "slowdown", None,
     "setup + 2 calls vs one run"),
    ("PartialSmall", "SetupAndCancel", "ColdRun", "slowdown", None,
     "setup (+ cancel) vs a cold run"),
    ("PartialSmall", "SetupAndCancel", "Run", "slowdown", None, "setup (+ cancel) vs a warm run"),
    # Concurrency: time is 1 / throughput of all threads ("@N": N threads).
    ("Throughput", "Session@2", "Session@1", "speedup", 1.7,
     "runs/s, 2 client threads vs 1, one session"),
    ("Throughput", "Session@32", "Session@8", "speedup", 0.9,
     "runs/s, 32 client threads vs 8 (no collapse)"),
    ("Throughput", "Callable@2", "Callable@1", "speedup", None, "prepared Callable, 2 vs 1"),
    ("Throughput", "Callable@32", "Callable@8", "speedup", None, "prepared Callable, 32 vs 8"),
    ("Throughput", "RawFlowGraph@2", "RawFlowGraph@1", "speedup", None,
     "private raw flow graphs, 2 vs 1"),
    ("Throughput", "RawFlowGraph@32", "RawFlowGraph@8", "speedup", None,
     "private raw flow graphs, 32 vs 8"),
    ("Throughput", "Sequential@2", "Sequential@1", "speedup", None,
     "plain loops, 2 vs 1: the machine's ceiling"),
    ("Throughput", "Session@1", "RawFlowGraph@1", "slowdown", None, "1 thread: session vs raw"),
    ("Throughput", "Session@2", "RawFlowGraph@2", "slowdown", None, "2 threads: session vs raw"),
    ("Throughput", "Session@8", "RawFlowGraph@8", "slowdown", None, "8 threads: session vs raw"),
    ("Throughput", "Session@32", "RawFlowGraph@32", "slowdown", None, "32 threads: session vs raw"),
    ("AssignAdd", "Session@1", "Mutex@1", "slowdown", None, "1 thread: run(AssignAdd) vs mutex add"),
    ("AssignAdd", "Session@8", "Mutex@8", "slowdown", None, "8 threads: run(AssignAdd) vs mutex add"),
    ("AssignAdd", "Session@8", "Session@1", "slowdown", None, "updates/s: 1 thread / 8 threads"),
    ("AssignAdd", "SessionUnlocked@8", "Session@8", "slowdown", None,
     "use_locking=false vs locked, 8 threads"),
    # Remote sessions (bench/service_bench.cc): server and client in one process.
    ("RemoteSmall", "RemoteSession", "Session", "slowdown", None,
     "RemoteSession::run over loopback vs in-process Session::run, 10 nodes"),
    ("RemoteSmall", "RemoteSession", "Stub", "slowdown", None,
     "RemoteSession vs the generated stub, same request"),
    ("RemoteSmall", "Stub", "EmptyRpc", "slowdown", None,
     "a Run RPC vs an almost empty unary RPC"),
    ("RemoteThroughput", "RemoteSession@8", "Session@8", "slowdown", None,
     "runs/s, 8 client threads: remote vs in-process"),
    ("RemoteThroughput", "RemoteSession@8", "RemoteSession@1", "speedup", None,
     "remote runs/s, 8 client threads vs 1"),
    ("RemoteThroughput", "Session@8", "Session@1", "speedup", None,
     "in-process runs/s, 8 client threads vs 1"),
    # Case 14 (bench/mpi/mpi_bench.cc, under mpirun): graphrun's AllReduce (a
    # Callable, progress thread, point-to-point exchange) vs MPI_Allreduce, same ranks.
    ("AllReduce4B", "Graphrun", "Mpi", "slowdown", None, "1 float: latency"),
    ("AllReduce4K", "Graphrun", "Mpi", "slowdown", None, "1024 floats"),
    ("AllReduce1M", "Graphrun", "Mpi", "slowdown", None, "262144 floats (1 MiB)"),
    # Send/Recv round trips between ranks 0 and 1: one step on each rank per
    # round trip vs MPI_Send/MPI_Recv.
    ("PingPong4B", "Graphrun", "Mpi", "slowdown", 1.5, "round trip, 1 float: latency"),
    # One graph across 2 ranks (a DistributedSession, 1 thread each) vs the
    # same graph in one 1-thread Session.
    ("FanOut64", "TwoRanks", "OneRank", "speedup", 1.8,
     "64 MatMuls 256^3, half on rank 1, 1 thread per rank"),
    ("FanOut64", "Halves", "OneRank", "speedup", None,
     "the same halves run locally on ranks 0 and 1 at once: the best split here"),
    ("FanOut64", "TwoRanks", "Halves", "slowdown", None,
     "what distributing the graph costs beyond the machine's best split"),
    ("PingPong1M", "Graphrun", "Mpi", "speedup", 0.8,
     "round trip, 1 MiB each way: bandwidth (>= 0.8 of MPI's)"),
]

# Cases whose per-node time is worth printing.
PER_NODE_CASES = {"NoOpChain10k", "Wavefront100x100", "CallSmall10", "CallChain1k", "CallChain10k",
                  "CallChain100k", "CallChain1M", "CallTree64k", "CallWavefront256"}

STANDARD_FIELDS = {"name", "run_name", "run_type", "repetitions", "repetition_index", "threads",
                   "iterations", "real_time", "cpu_time", "time_unit", "family_index",
                   "per_family_instance_index", "aggregate_name", "aggregate_unit", "nodes"}

# Per-node time of one result against another's (growth with size):
# (case, variant, base case, base variant, target: at most, note).
PER_NODE_ROWS = [
    ("CallChain1M", "Task1T", "CallChain1k", "Task1T", 1.2,
     "per node, every node a task: 10^6 vs 10^3 nodes"),
    ("CallChain1M", "Call1T", "CallChain1k", "Call1T", None,
     "per node, measured cost (inline): 10^6 vs 10^3 nodes"),
    ("CallChain1M", "Raw1T", "CallChain1k", "Raw1T", None,
     "per node, raw continue_nodes: 10^6 vs 10^3 nodes"),
]

# A counter against an absolute bound: (case, variant, counter, target: at most, unit, note).
COUNTER_ROWS = [
    ("ColdChain1M", "Call", "bytes", 650, "B/node",
     "peak RSS: graph + session + plan + instance, 10^6 Call nodes"),
    ("ColdChain1M", "Call", "build_ns", 300, "ns/node", "Graph building (add_node + edge)"),
    ("ColdChain1M", "Call", "first_run_ns", 1000, "ns/node",
     "Session::create + first run (10^6 nodes under 1 s)"),
    ("ColdChain1M", "CallMoved", "bytes", None, "B/node", "the same, graph moved into the session"),
    ("ColdChain1M", "CallMoved", "first_run_ns", None, "ns/node",
     "Session::create(std::move(g)) + first run"),
    ("ColdChain1M", "Raw", "bytes", None, "B/node", "raw continue_nodes, peak RSS"),
    ("ColdChain1M", "NoOp", "bytes", None, "B/node", "NoOp nodes, peak RSS"),
]

UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def base_name(name):
    # "BM_X_Y/real_time", "BM_X_Y/min_time:1.000/real_time" -> "BM_X_Y";
    # "BM_X_Y/real_time/threads:8" -> "BM_X_Y@8" (the thread count matters).
    parts = name.split("/")
    for p in parts[1:]:
        if p.startswith("threads:") and p != "threads:1":
            return parts[0] + "@" + p.split(":", 1)[1]
        if p == "threads:1":
            return parts[0] + "@1"
    return parts[0]


def split_name(base):
    if not base.startswith("BM_") or "_" not in base[3:]:
        return None
    case, variant = base[3:].split("_", 1)
    return case, variant


def load(paths):
    """Returns ({(case, variant): {"ns": median real time, "n": samples, "nodes": int|None}},
    {(case, variant): error message} of benchmarks that reported an error instead of a time)."""
    errors = {}
    samples = {}
    medians = {}
    nodes = {}
    counters = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        for b in data.get("benchmarks", []):
            key = split_name(base_name(b.get("run_name", b["name"])))
            if key is None:
                continue
            if b.get("error_occurred"):
                errors[key] = b.get("error_message") or "the benchmark reported an error"
                continue
            ns = float(b["real_time"]) * UNIT_NS[b.get("time_unit", "ns")]
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    medians.setdefault(key, []).append(ns)
                continue
            samples.setdefault(key, []).append(ns)
            if "nodes" in b:
                nodes[key] = int(b["nodes"])
            for name, value in b.items():
                if name not in STANDARD_FIELDS and isinstance(value, (int, float)):
                    counters.setdefault(key, {}).setdefault(name, []).append(float(value))
    out = {}
    for key in set(samples) | set(medians):
        values = medians.get(key) or samples[key]
        out[key] = {"ns": statistics.median(values), "n": len(values), "nodes": nodes.get(key),
                    "counters": {k: statistics.median(v) for k, v in counters.get(key, {}).items()}}
    return out, errors


def fmt_time(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def lookup(results, case, variants):
    """(result, variant) for `variants` ("A" or "A|B|..."): the fastest of those present."""
    found = [(results[(case, v)], v) for v in variants.split("|") if (case, v) in results]
    return min(found, key=lambda rv: rv[0]["ns"]) if found else (None, variants)


def build_table(results, errors):
    table = []
    for case, num, den, mode, target, note in ROWS:
        a = results.get((case, num))
        b, den = lookup(results, case, den)
        if a is None or b is None:
            if target is None:
                continue  # informational rows only when both sides ran
            missing = num if a is None else den
            error = errors.get((case, missing))
            table.append({"case": case, "pair": f"{num} / {den}", "a": "-", "b": "-",
                          "ratio": "-",
                          "target": f"<= {target:g}x" if mode == "slowdown" else f">= {target:g}x",
                          "verdict": "MISSING" if error is None else "SKIPPED",
                          "note": f"no result for {case}_{missing}" if error is None
                          else f"{case}_{missing}: {error}"})
            continue
        if mode == "slowdown":
            ratio = a["ns"] / b["ns"]
            pair = f"{num} / {den}"
            tgt = None if target is None else f"<= {target:g}x"
            ok = None if target is None else ratio <= target
        else:
            ratio = b["ns"] / a["ns"]
            pair = f"{den} / {num} (speedup)"
            tgt = None if target is None else f">= {target:g}x"
            ok = None if target is None else ratio >= target
        ta, tb = fmt_time(a["ns"]), fmt_time(b["ns"])
        if case in PER_NODE_CASES and a["nodes"] and b["nodes"]:
            ta += f" ({a['ns'] / a['nodes']:.1f} ns/node)"
            tb += f" ({b['ns'] / b['nodes']:.1f} ns/node)"
        table.append({"case": case, "pair": pair, "a": ta, "b": tb, "ratio": f"{ratio:.2f}x",
                      "target": tgt or "-",
                      "verdict": "-" if ok is None else ("PASS" if ok else "MISS"),
                      "note": note})
    for case, variant, bcase, bvariant, target, note in PER_NODE_ROWS:
        a = results.get((case, variant))
        b = results.get((bcase, bvariant))
        tgt = None if target is None else f"<= {target:g}x"
        if a is None or b is None or not a["nodes"] or not b["nodes"]:
            if target is not None:
                table.append({"case": case, "pair": f"{variant} per node / {bcase}", "a": "-",
                              "b": "-", "ratio": "-", "target": tgt, "verdict": "MISSING",
                              "note": note})
            continue
        pa, pb = a["ns"] / a["nodes"], b["ns"] / b["nodes"]
        ratio = pa / pb
        ok = None if target is None else ratio <= target
        table.append({"case": case, "pair": f"{variant} per node / {bcase}",
                      "a": f"{pa:.1f} ns/node", "b": f"{pb:.1f} ns/node", "ratio": f"{ratio:.2f}x",
                      "target": tgt or "-",
                      "verdict": "-" if ok is None else ("PASS" if ok else "MISS"), "note": note})
    for case, variant, counter, target, unit, note in COUNTER_ROWS:
        r = results.get((case, variant))
        value = None if r is None else r["counters"].get(counter)
        tgt = None if target is None else f"<= {target:g} {unit}"
        if value is None:
            if target is not None:
                table.append({"case": case, "pair": f"{variant} {counter}", "a": "-", "b": "-",
                              "ratio": "-", "target": tgt, "verdict": "MISSING", "note": note})
            continue
        ok = None if target is None else value <= target
        table.append({"case": case, "pair": f"{variant} {counter}", "a": f"{value:.0f} {unit}",
                      "b": "-", "ratio": "-", "target": tgt or "-",
                      "verdict": "-" if ok is None else ("PASS" if ok else "MISS"), "note": note})
    return table


COLUMNS = [("case", "case"), ("pair", "ratio of"), ("a", "numerator"), ("b", "denominator"),
           ("ratio", "ratio"), ("target", "target"), ("verdict", "verdict"), ("note", "note")]


def print_text(table):
    widths = {k: max(len(h), *(len(r[k]) for r in table)) for k, h in COLUMNS}
    print("  ".join(h.ljust(widths[k]) for k, h in COLUMNS).rstrip())
    print("  ".join("-" * widths[k] for k, _ in COLUMNS))
    for r in table:
        print("  ".join(r[k].ljust(widths[k]) for k, _ in COLUMNS).rstrip())


def print_markdown(table):
    print("| " + " | ".join(h for _, h in COLUMNS) + " |")
    print("|" + "|".join("---" for _ in COLUMNS) + "|")
    for r in table:
        print("| " + " | ".join(r[k] for k, _ in COLUMNS) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="Google Benchmark JSON output files")
    parser.add_argument("--format", choices=["text", "markdown"], default="text")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a target is missed or its results are missing")
    args = parser.parse_args()
    results, errors = load(args.json)
    if not results:
        print("no benchmark results found", file=sys.stderr)
        return 2
    table = build_table(results, errors)
    (print_markdown if args.format == "markdown" else print_text)(table)
    targeted = [r for r in table if r["verdict"] in ("PASS", "MISS", "MISSING")]
    passed = sum(r["verdict"] == "PASS" for r in targeted)
    skipped = sum(r["verdict"] == "SKIPPED" for r in table)
    print(f"\ntargets: {passed}/{len(targeted)} PASS" +
          (f" ({skipped} skipped: their benchmark reported why)" if skipped else ""))
    if args.strict and passed != len(targeted):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
