"""Benchmark: inventory + topology + every generated file for N Kubernetes nodes, 3 topology levels.

Usage: python bench/render_scale.py [--nodes 10000] [--repeat 5] [--json OUT]
Prints the best and median wall time of the whole pure pipeline (node parsing included) and the
process's peak RSS; --json also writes those figures to OUT (bench/all.py reads it).
Target (issue #2): <= 1 s for 10,000 nodes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from factories import aws_fleet  # noqa: E402

from provisioner.config import load_spec  # noqa: E402
from provisioner.generate import generate  # noqa: E402
from provisioner.inventory import nodes_from_api  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the figures printed to OUT")
    args = parser.parse_args()
    spines, leaves = 10, 25
    per_leaf = max(1, args.nodes // (spines * leaves))
    raw = aws_fleet(spines, leaves, per_leaf)  # 10 spines x 25 leaves x 40 nodes = 10,000
    raw = json.loads(json.dumps(raw))  # as if read from `kubectl get nodes -o json`
    spec = load_spec(ROOT / "examples" / "aws-gpu.yaml")
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = generate(spec, nodes_from_api(raw))
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    generate(spec, nodes_from_api(raw))
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sizes = {name: len(text) for name, text in result.files.items()}
    print(f"python {platform.python_version()} on {platform.machine()}, {len(raw)} Kubernetes nodes, "
          f"{len(result.inventory.nodes)} Slurm nodes, {len(result.topology.switches)} switches (3 levels + root)")
    print(f"pipeline time: best {min(times):.3f} s, median {statistics.median(times):.3f} s over {args.repeat} runs "
          f"(target <= 1 s)")
    print(f"peak memory: {traced_peak / 2**20:.1f} MiB allocated by the pipeline (tracemalloc), "
          f"process peak RSS {rss_mib:.0f} MiB (input objects included)")
    print("file sizes: " + ", ".join(f"{k} {v / 1024:.0f} KiB" for k, v in sorted(sizes.items())))
    if args.json:
        args.json.write_text(json.dumps({
            "python": platform.python_version(), "machine": platform.machine(), "k8s_nodes": len(raw),
            "slurm_nodes": len(result.inventory.nodes), "switches": len(result.topology.switches),
            "repeat": args.repeat, "times": [round(t, 6) for t in times], "best": round(min(times), 6),
            "median": round(statistics.median(times), 6),
            "traced_peak_mib": round(traced_peak / 2**20, 3), "peak_rss_mib": round(rss_mib, 3),
            "file_sizes": dict(sorted(sizes.items())),
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
