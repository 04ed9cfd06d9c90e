"""How fast the bounded YAML loader refuses what it must refuse (goal: 100 ms, issue 11 §3).

Prints, per case, the time `load_tasks` takes to refuse it (best of 5) and the problem given:
billion-laughs files of depth 7 to 12 (10 aliases per level: 10^7 to 10^12 nodes expanded),
a 100,000-digit integer, an impossible date, and a 4 MiB file at the size limit (accepted).

    python bench/yaml_bounds.py
"""

from __future__ import annotations

import time

from skypurza.events.limits import MAX_YAML_FILE_BYTES
from skypurza.events.taskspec.errors import TaskSpecError
from skypurza.events.taskspec.loader import load_tasks

GOAL_MS = 100.0


def billion_laughs(depth: int, width: int = 10) -> str:
    lines = ["run: echo hi", "_metadata:", "  l0: &l0 [lol]"]
    for d in range(1, depth + 1):
        lines.append(f"  l{d}: &l{d} [" + ", ".join([f"*l{d - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def timed(text: str) -> tuple[float, str]:
    best, outcome = float("inf"), ""
    for _ in range(5):
        start = time.perf_counter()
        try:
            load_tasks(text, filename="bench.yaml")
            outcome = "accepted"
        except TaskSpecError as exc:
            outcome = str(exc.problems[0])
        best = min(best, time.perf_counter() - start)
    return best * 1000, outcome


def main() -> None:
    cases = [(f"billion laughs, depth {d}", billion_laughs(d)) for d in range(7, 13)]
    cases += [("100,000-digit integer", "num_nodes: " + "9" * 100_000 + "\n"),
              ("impossible date", "setup: 2026-13-45\n")]
    worst = 0.0
    for name, text in cases:
        ms, outcome = timed(text)
        worst = max(worst, ms)
        print(f"{name:<28} {ms:7.2f} ms  {outcome[:110]}")
    print(f"worst refusal {worst:.2f} ms (goal {GOAL_MS:.0f} ms): {'met' if worst < GOAL_MS else 'MISSED'}")
    head = "run: echo hi\n"
    big = head + "#" + "x" * (MAX_YAML_FILE_BYTES - len(head) - 2) + "\n"
    start = time.perf_counter()
    load_tasks(big, filename="big.yaml")
    print(f"a file at the size limit ({MAX_YAML_FILE_BYTES // 2**20} MiB) is read in "
          f"{(time.perf_counter() - start) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
