"""A team's Slurm account (issue 14): its workspace's `slurm: {account}` is what its allocations
are charged to (`sbatch --account`, over the cluster's own sbatch_options).

Against the real Slurm rig (tests/support/slurm_rig.py: slurmctld, slurmd, sshd) with the real
provisioner service on a real nats-server: two teams, one with an account; Slurm holds each
allocation under the right account, and `down` ends the team's. The rig keeps no associations, so
Slurm accepts any account: what an enforcing cluster answers to an unknown one is checked with
the classifier (non-retryable, clear). The edges refuse a bad name with the key named.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from nats_fixtures import connect_bus
from provisioner_fixtures import SETTINGS, running, subject, wait_for
from slurm_rig import CLUSTER, SlurmRig

from skypurza.events import naming, slurm_config
from skypurza.events.models import ClusterTerminated, DownRequested, PlacementChosen, TaskSubmitted
from skypurza.events.team_credentials import (
    NO_CREDENTIALS,
    SlurmCredentials,
    TeamCredentials,
    check_slurm_account,
    with_slurm_account,
)
from skypurza.events.types import Candidate
from skypurza.services.api import directory_io
from skypurza.services.provisioner import plan, slurm_errors, slurm_sbatch
from skypurza.services.provisioner.adapter import FailureKind, LaunchSpec
from skypurza.services.provisioner.service import ProvisionerService
from skypurza.services.provisioner.slurm import SlurmAdapter


def _account_of(rig: SlurmRig, cluster: str) -> str:
    out = subprocess.run(["squeue", "-h", "-n", naming.slurm_job_name("test", cluster), "-o", "%a"],
                         env=rig.env, capture_output=True, text=True, timeout=10).stdout
    return out.strip()


def test_a_teams_allocations_are_charged_to_its_account(slurm_rig: SlurmRig, nats_server, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "0.5")
    config = tmp_path / "slurm-config"
    config.write_text(slurm_rig.slurm_config())
    user = slurm_config.parse_user_config({"cluster_configs": {CLUSTER: {"sbatch_options": {"account": "shared"}}}})
    adapter = SlurmAdapter(nats_server.url, "test", tmp_path / "state", config_path=config, user_config=user,
                           pending_timeout_s=10)

    async def main() -> tuple[str, str, str]:
        bus = await connect_bus(nats_server)
        await directory_io.add_team(bus, "ml", [], {}, with_slurm_account(None, "ml-gpu"))
        await directory_io.add_team(bus, "plain", [], {})
        svc = ProvisionerService(SETTINGS, backends={"slurm": adapter})
        async with running(bus, svc):
            for team in ("ml", "plain"):
                await bus.publish(TaskSubmitted(task_id=f"t-{team}", cluster=f"s-{team}", num_nodes=1, user="alice",
                                                team=team, task={"name": "train", "run": "echo hi"},
                                                secrets_key=f"t-{team}"))
                cand = Candidate(infra="slurm", region=CLUSTER, zone="debug", instance_type="1cpu-500mb", num_nodes=1)
                await bus.publish(PlacementChosen(task_id=f"t-{team}", cluster=f"s-{team}", attempt=1,
                                                  candidate=cand, num_nodes=1))
            for team in ("ml", "plain"):
                await wait_for(bus, subject("cluster", f"s-{team}", "cluster_provisioned"), timeout=90)
            ml, plain = _account_of(slurm_rig, "s-ml"), _account_of(slurm_rig, "s-plain")
            await bus.publish(DownRequested(cluster="s-ml"))
            ended = await wait_for(bus, subject("cluster", "s-ml", "cluster_terminated"), timeout=60)
            assert isinstance(ended.event, ClusterTerminated)
            after = _account_of(slurm_rig, "s-ml")
            await bus.publish(DownRequested(cluster="s-plain"))
            await wait_for(bus, subject("cluster", "s-plain", "cluster_terminated"), timeout=60)
        await bus.close()
        return ml, plain, after

    ml, plain, after = asyncio.run(main())
    assert ml == "ml-gpu"  # the team's account wins over the cluster's sbatch_options
    assert plain == "shared"  # a team without one: the cluster's options, as before
    assert after == ""  # down ended the team's allocation


def test_the_teams_account_replaces_the_clusters_and_goes_on_the_script() -> None:
    spec = LaunchSpec(stage="test", cluster="c", launch_token="t", instance_type="1cpu-500mb", region=CLUSTER,
                      infra="slurm")
    ml = TeamCredentials(slurm=SlurmCredentials(account="ml-gpu"))
    assert plan.with_team_credentials(spec, ml).slurm_account == "ml-gpu"
    assert plan.with_team_credentials(spec, NO_CREDENTIALS) is spec
    aws_spec = LaunchSpec(stage="test", cluster="c", launch_token="t", instance_type="m5.large", region="us-east-1")
    assert plan.with_team_credentials(aws_spec, ml).slurm_account is None  # only Slurm's own
    given = slurm_sbatch.sbatch_options({"account": "shared", "qos": "high"})
    assert slurm_sbatch.with_account(given, "ml-gpu") == (("qos", "high"), ("account", "ml-gpu"))
    assert slurm_sbatch.with_account(given, None) == given
    body = slurm_sbatch.script(slurm_sbatch.SbatchRequest(job_name="j", output="o", nodes=1, cpus_per_task=1,
                                                          mem_mib=500, options=slurm_sbatch.with_account(given, "ml-gpu")))
    assert "#SBATCH --account=ml-gpu" in body and "--account=shared" not in body
    # An account from an event goes onto the script only if it is a sound name.
    with pytest.raises(ValueError, match="credentials.slurm.account"):
        slurm_sbatch.with_account(given, "ml\n#SBATCH --uid=0")


def test_an_unknown_account_on_an_enforcing_cluster_is_a_clear_non_retryable_failure() -> None:
    f = slurm_errors.classify("sbatch: error: Batch job submission failed: Invalid account or account/partition "
                              "combination specified")
    # Not transient (no retry of the same submission), and it says what is wrong.
    assert f.kind is FailureKind.AUTH and f.code == "SlurmInvalidAccount" and "account" in f.message.lower()


@pytest.mark.parametrize("bad", ["", "ML", "-x", "a b", "a/b", "a;b", "x" * 65, "ml\n", "ä"])
def test_bad_accounts_are_refused_with_the_key(bad: str) -> None:
    with pytest.raises(ValueError, match=r"credentials\.slurm\.account.*lower-case"):
        check_slurm_account(bad)
    assert check_slurm_account("_ml.gpu-1") == "_ml.gpu-1"
