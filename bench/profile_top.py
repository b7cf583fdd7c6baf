"""Top functions of py-spy profiles (collapsed stacks, `--format raw`), as JSON.

bench/produce.py `--profile DIR` writes one file per slice and process
(`<flush>-<security>-<load>-r<round>-<process>.txt`); this sums the files
that match a glob and prints, per function (name and file, line numbers
dropped so that one function's call sites add up), its share of all samples
as self time and as inclusive time (counted once per stack even when
recursive). py-spy leaves idle threads out by default, so a share of samples
is a share of the process's CPU time.

    python bench/profile_top.py 'DIR/async-open-nomerge_w1-r*-leader.txt' [--top 25]
"""

from __future__ import annotations

import argparse
import glob
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

_LINE = re.compile(r":\d+\)$")


def frame_name(frame: str) -> str:
    """'handle (dledger/runtime/node.py:512)' -> 'handle (dledger/runtime/node.py)',
    the path shortened to what follows site-packages or the repository."""
    name = _LINE.sub(")", frame.strip())
    for marker in ("site-packages/", "/wt-perf/", "/main/"):
        at = name.find(marker)
        if at >= 0:
            head = name[: name.index("(") + 1]
            name = head + name[at + len(marker):]
            break
    return name


def summarize(paths: list[str], top: int) -> dict[str, Any]:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for path in paths:
        for line in Path(path).read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [frame_name(f) for f in stack.split(";") if f]
            if not frames:
                continue
            total += n
            own[frames[-1]] += n
            for name in set(frames):
                inclusive[name] += n

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(100 * n / total, 1)) for name, n in counter.most_common(top)]

    return {"files": len(paths), "samples": total, "self_pct": share(own),
            "inclusive_pct": share(inclusive)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pattern", help="glob of collapsed-stack files")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(json.dumps(summarize(sorted(glob.glob(args.pattern)), args.top), indent=1))
