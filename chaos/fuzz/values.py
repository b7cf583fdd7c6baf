"""Seeded random values for the fuzzers: extreme integers, odd strings, nesting.

Everything takes a `random.Random`, so a case built from the same seed is the
same bytes. Names that the run's oracle depends on (its topic, the broker
group) are never produced: `Names.pick` draws from fuzz-owned names and random
text and re-draws on a collision, so the fuzzer may create, delete and
re-register anything except what the final check reads.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Any

# Integers at the edges of every width the servers store or the codecs
# check: u8/u16/u32/i32/i64/u64, msgpack's own boundaries and JSON's 2**53.
EXTREME_INTS: tuple[int, ...] = (
    0, 1, -1, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -(2**31), 2**32 - 1, 2**32,
    2**53, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), 2**64 - 1,
)
EXTREME_FLOATS: tuple[float, ...] = (0.0, -0.0, 1e308, -1e308, float("inf"), float("-inf"),
                                     float("nan"), 5e-324)
# Sizes of the long strings and binaries; 1 MiB crosses the 64 KiB compression
# threshold and aiohttp's default body limit without filling the disk.
HUGE_SIZES: tuple[int, ...] = (4096, 65535, 65536, 70_000, 1 << 20)
_ODD_TEXT = ("", " ", "\x00", "\x01\x02", "*", "..", "../../etc/passwd", "%00", "%2e%2e/",
             "\u202e", "\ud7ff", "é", "日本", "a" * 128, "a" * 256, "😀", "null", "-1",
             "DefaultCluster", "leader", "\r\n", "%s%n", "{}", "[]")


@dataclass
class Names:
    """Topic, group and node names a case may use; `protected` are never produced."""

    protected: frozenset[str]
    topics: tuple[str, ...] = ("fz-t0", "fz-t1", "fuzz-scratch")
    groups: tuple[str, ...] = ("fz-g0", "fz-g1")
    extra: list[str] = field(default_factory=list)

    def pick(self, rng: random.Random, pool: tuple[str, ...]) -> str:
        for _ in range(8):
            roll = rng.random()
            if roll < 0.6:
                name = rng.choice(pool)
            elif roll < 0.8:
                name = "fz-" + "".join(rng.choices(string.ascii_letters + string.digits + "_-|%",
                                                   k=rng.randint(1, 40)))
            else:
                name = odd_text(rng)
            if name not in self.protected:
                return name
        return "fz-fallback"

    def topic(self, rng: random.Random) -> str:
        return self.pick(rng, self.topics)

    def group(self, rng: random.Random) -> str:
        return self.pick(rng, self.groups)


def odd_text(rng: random.Random) -> str:
    """A short string from the odd list, random printable text or random code points."""
    roll = rng.random()
    if roll < 0.5:
        return rng.choice(_ODD_TEXT)
    if roll < 0.8:
        return "".join(rng.choices(string.printable, k=rng.randint(0, 64)))
    # Random code points, surrogates excluded (msgpack cannot encode them as str).
    return "".join(chr(rng.choice((rng.randint(0, 0xD7FF), rng.randint(0xE000, 0x10FFFF))))
                   for _ in range(rng.randint(1, 16)))


def extreme_int(rng: random.Random) -> int:
    if rng.random() < 0.8:
        return rng.choice(EXTREME_INTS)
    return rng.randint(-(2**63), 2**64 - 1)


def huge_text(rng: random.Random) -> str:
    return rng.choice("xé") * rng.choice(HUGE_SIZES)


def random_value(rng: random.Random, depth: int = 3) -> Any:
    """Any msgpack-encodable value: scalars of every type, containers up to `depth`."""
    kinds = ["nil", "bool", "int", "float", "str", "bin"]
    if depth > 0:
        kinds += ["list", "map"]
    kind = rng.choice(kinds)
    if kind == "nil":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return extreme_int(rng) if rng.random() < 0.7 else rng.randint(-1000, 1000)
    if kind == "float":
        return rng.choice(EXTREME_FLOATS) if rng.random() < 0.7 else rng.uniform(-1e6, 1e6)
    if kind == "str":
        return huge_text(rng) if rng.random() < 0.05 else odd_text(rng)
    if kind == "bin":
        return rng.randbytes(rng.choice((0, 1, 16, 68, 200)))
    if kind == "list":
        return [random_value(rng, depth - 1) for _ in range(rng.randint(0, 5))]
    out: dict[Any, Any] = {}
    for _ in range(rng.randint(0, 5)):
        key = rng.choice((odd_text(rng), extreme_int(rng)))
        out[key] = random_value(rng, depth - 1)
    return out


def deep_nesting(rng: random.Random, depth: int | None = None) -> Any:
    """Lists or maps nested `depth` levels (default: 100 to 20 000)."""
    depth = depth or rng.choice((100, 1000, 5000, 20_000))
    value: Any = rng.choice((None, 0, "x"))
    as_map = rng.random() < 0.5
    for _ in range(depth):
        value = {"a": value} if as_map else [value]
    return value
