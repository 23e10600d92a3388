"""Reads a folder of titan profiler traces with Holistic Trace Analysis (HTA), as a torchtitan
user would, and checks that HTA sees one rank per file with the right distributedInfo and at
least one ProfilerStep iteration per rank.

    PYTHONPATH=.deps/hta .deps/venv/bin/python scripts/hta_check.py TRACE_DIR WORLD_SIZE

scripts/setup.sh installs HTA and the libraries its TraceAnalysis imports into .deps/hta.
Exit 0 and one line per rank on success; exit 1 naming what differs otherwise.
"""
import sys

from hta.trace_analysis import TraceAnalysis


def main() -> int:
    trace_dir, world_size = sys.argv[1], int(sys.argv[2])
    analysis = TraceAnalysis(trace_dir=trace_dir)
    ranks = sorted(int(r) for r in analysis.t.traces.keys())
    problems = []
    if ranks != list(range(world_size)):
        problems.append(f"HTA found ranks {ranks}, expected 0..{world_size - 1}")
    for rank in ranks:
        info = analysis.t.meta_data[rank].get("distributedInfo", {})
        iterations = [int(i) for i in analysis.t.get_iterations(rank)]
        events = len(analysis.t.get_trace(rank))
        print(f"hta: rank {rank}: {events} events, iterations {iterations}, distributedInfo {info}")
        if info.get("rank") != rank or info.get("world_size") != world_size:
            problems.append(f"rank {rank}: distributedInfo {info}")
        if not iterations:
            problems.append(f"rank {rank}: no ProfilerStep#N iteration")
    for p in problems:
        print("hta_check: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
