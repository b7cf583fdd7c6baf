"""Real-node simulator throughput: seeds per second, one JSON line per configuration.

    python bench/nodesim.py [--seeds 50] [--start 1]
"""

from __future__ import annotations

import argparse
import json
import time

from dledger.testing.nodesim import NodeSimOptions, run_seed
from ledgermq.broker.nodesim_apply import BrokerApplier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--start", type=int, default=1)
    args = parser.parse_args()
    for nodes in (3, 5):
        for flush in ("sync", "async"):
            options = NodeSimOptions(nodes=nodes, flush=flush, applier=BrokerApplier)
            began = time.perf_counter()
            steps = violations = 0
            virtual = 0.0
            for seed in range(args.start, args.start + args.seeds):
                result = run_seed(seed, options)
                steps += result.steps
                virtual += result.virtual_s
                violations += not result.ok
            elapsed = time.perf_counter() - began
            print(json.dumps({
                "bench": "nodesim", "nodes": nodes, "flush": flush, "seeds": args.seeds,
                "violations": violations, "seconds": round(elapsed, 2),
                "seeds_per_second": round(args.seeds / elapsed, 2),
                "steps_per_second": round(steps / elapsed),
                "virtual_seconds_per_seed": round(virtual / args.seeds, 2),
            }), flush=True)


if __name__ == "__main__":
    main()
