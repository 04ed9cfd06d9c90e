"""The Slurm backend's SSH round trips against a real Slurm (the tests' rig, started here):

- submit -> RUNNING: `SlurmAdapter`'s allocation path (sbatch over SSH, squeue until RUNNING), p50;
- cancel -> gone: `scancel` over SSH until squeue no longer lists the allocation, p50;
- submissions per second over one reused connection (asyncssh), against a new connection per
  submission (what a CLI calling `ssh` each time pays).

Needs root and Debian's slurm-wlm, munge and openssh-server (as the tests do).

    python bench/slurm.py [--rounds 10] [-o json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from slurm_rig import CLUSTER, PARTITION, SlurmRig, available  # noqa: E402

from skypurza.events.slurm_config import parse_ssh_config, lookup  # noqa: E402
from skypurza.services.provisioner.adapter import LaunchSpec  # noqa: E402
from skypurza.services.provisioner.slurm import SlurmAdapter  # noqa: E402
from skypurza.services.provisioner.slurm_ssh import SlurmSsh  # noqa: E402

HOLD = "#!/bin/bash\n#SBATCH --job-name=bench\n#SBATCH --output=/dev/null\n#SBATCH --mem=100M\nexec sleep 600\n"


async def _submit_to_running(adapter: SlurmAdapter, rounds: int) -> tuple[list[float], list[float]]:
    up, gone = [], []
    for i in range(rounds):
        spec = LaunchSpec(stage="bench", cluster=f"b{i}", launch_token=f"t{i}", instance_type="1cpu-100mb",
                          region=CLUSTER, zone=PARTITION, infra="slurm")
        t0 = time.perf_counter()
        alloc = await adapter._allocate(spec)
        up.append(time.perf_counter() - t0)
        ssh = adapter.ssh(CLUSTER)
        t0 = time.perf_counter()
        await ssh.run(f"scancel {alloc['job_id']}")
        while (await ssh.run(f"squeue -h -j {alloc['job_id']} -o %i")).stdout.strip():
            await asyncio.sleep(0.05)
        gone.append(time.perf_counter() - t0)
    return up, gone


async def _rate(ssh_of, n: int) -> tuple[float, list[str]]:
    ids = []
    t0 = time.perf_counter()
    for _ in range(n):
        ssh = ssh_of()
        res = await ssh.run("sbatch --parsable --hold", input=HOLD)
        ids.append(res.stdout.strip())
    rate = n / (time.perf_counter() - t0)
    return rate, ids


async def main(rounds: int) -> dict:
    why = available()
    if why:
        raise SystemExit(f"bench/slurm.py: {why}")
    root = Path(tempfile.mkdtemp(prefix="spz-slurm-bench-"))
    root.chmod(0o755)
    rig = SlurmRig(root).start()
    try:
        config = root / "slurm-config"
        config.write_text(rig.slurm_config())
        adapter = SlurmAdapter("nats://unused:4222", "bench", root / "state", config_path=config)
        up, gone = await _submit_to_running(adapter, rounds)
        reused = adapter.ssh(CLUSTER)
        reuse_rate, ids = await _rate(lambda: reused, rounds * 2)
        target = lookup(parse_ssh_config(config.read_text()), CLUSTER)
        fresh: list[SlurmSsh] = []

        def new() -> SlurmSsh:
            fresh.append(SlurmSsh(target))
            return fresh[-1]

        fresh_rate, more = await _rate(new, rounds * 2)
        await reused.run("scancel " + " ".join(ids + more))
        for s in fresh:
            await s.close()
        await adapter.close()
        return {"rounds": rounds, "submit_to_running_p50_s": round(statistics.median(up), 3),
                "cancel_to_gone_p50_s": round(statistics.median(gone), 3),
                "submissions_per_s_reused_connection": round(reuse_rate, 1),
                "submissions_per_s_new_connection_each": round(fresh_rate, 1),
                "connections_made_by_the_reused_client": reused.connects}
    finally:
        rig.stop()
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    a = p.parse_args()
    result = asyncio.run(main(a.rounds))
    if a.output == "json":
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k:45} {v}")
