"""`spz down -a -y` of many local clusters: seconds for N clusters beside one cluster's (the
baseline, measured in the same run), so a teardown that runs clusters one after another shows
as N times the baseline.

Everything real: the `spz` CLI as a user runs it, the embedded control plane, node agents each
running a job that ignores nothing (`sleep`), on a fresh SKYPURZA_HOME.

    python bench/teardown.py [--clusters 12] [-o json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGE = "teardown"


def _spz(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise SystemExit(f"spz {' '.join(args)} failed ({out.returncode}): {out.stderr[-500:]}")
    return out


def _launch(env: dict[str, str], names: list[str]) -> None:
    procs = [subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "launch", "-y", "-d", "-c", n,
                               "--infra", "local", "sleep 600"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL) for n in names]
    for n, p in zip(names, procs):
        if p.wait(300) != 0:
            raise SystemExit(f"launch {n} failed: {p.stderr.read().decode()[-500:] if p.stderr else ''}")


def _down_seconds(env: dict[str, str], names: list[str]) -> float:
    _launch(env, names)
    t0 = time.monotonic()
    _spz(env, "down", "-a", "-y")
    return time.monotonic() - t0


def run(clusters: int) -> dict[str, float | int]:
    with tempfile.TemporaryDirectory(prefix="spz-teardown-") as home:
        env = {**os.environ, "SKYPURZA_HOME": home, "SKYPURZA_STAGE": STAGE, "SKYPURZA_AGENT_KILL_GRACE_S": "2"}
        for k in ("SKYPURZA_NATS_URL", "SKYPURZA_NATS_PORT"):
            env.pop(k, None)
        try:
            _spz(env, "api", "start")
            one = _down_seconds(env, ["one"])
            many = _down_seconds(env, [f"c{i}" for i in range(clusters)])
        finally:
            subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "stop"], env=env, capture_output=True,
                           timeout=120)
    return {"clusters": clusters, "one_cluster_s": round(one, 2), "all_clusters_s": round(many, 2),
            "serial_estimate_s": round(one * clusters, 2), "speedup_vs_serial": round(one * clusters / many, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", type=int, default=12)
    p.add_argument("-o", "--output", default="table", choices=["table", "json"])
    a = p.parse_args(argv)
    if not 2 <= a.clusters <= 64:
        p.error("--clusters: 2 to 64")
    r = run(a.clusters)
    if a.output == "json":
        print(json.dumps(r, indent=2))
    else:
        print(f"down -a of {r['clusters']} local clusters: {r['all_clusters_s']} s "
              f"(one cluster: {r['one_cluster_s']} s; one after another would be ~{r['serial_estimate_s']} s; "
              f"{r['speedup_vs_serial']}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
