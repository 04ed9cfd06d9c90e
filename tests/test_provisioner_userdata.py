"""EC2 user-data (rendered script and its parser) and the provisioner's pure decisions."""

from __future__ import annotations

import base64
import shlex
import subprocess
from pathlib import Path

import pytest

from skypurza.events.agentspec import AgentSpec
from skypurza.events.models import PlacementChosen
from skypurza.events.taskspec.request import ResourceRequest
from skypurza.events.types import Candidate
from skypurza.services.provisioner import plan, userdata
from skypurza.services.provisioner.adapter import (
    Failure,
    FailureKind,
    FailureScope,
    NodeInfo,
    NodeState,
    provision_error,
)
from skypurza.services.provisioner.aws import USER_DATA_LIMIT
from skypurza.services.provisioner.reconcile import expected_nodes, old_enough

SPEC = AgentSpec(nats_url="nats://10.0.0.5:4222", stage="test", cluster="my cluster's", rank=0, num_nodes=4,
                 infra="aws", region="us-east-1", zone="us-east-1b", extra={"start_seq": "42"})


def test_user_data_round_trip() -> None:
    script = userdata.render(SPEC, install="skypurza==0.1.0")
    assert len(script.encode()) < USER_DATA_LIMIT // 2
    spec = userdata.agent_spec(script, rank=3, instance_id="i-0abc", zone="us-east-1c", home="/home/ubuntu")
    assert spec == AgentSpec(nats_url="nats://10.0.0.5:4222", stage="test", cluster="my cluster's", rank=3,
                             num_nodes=4, infra="aws", region="us-east-1", zone="us-east-1c",
                             instance_id="i-0abc", home="/home/ubuntu", extra={"start_seq": "42"})
    # Base64 (as DescribeInstanceAttribute returns it) parses the same; `python` is swapped.
    encoded = base64.b64encode(script.encode()).decode()
    argv = userdata.agent_argv(encoded, rank=1, instance_id="i-1", python="/usr/bin/python3")
    assert argv[:3] == ["/usr/bin/python3", "-m", "skypurza.services.agent"]
    assert argv[argv.index("--rank") + 1] == "1"
    with pytest.raises(ValueError):
        userdata.agent_argv("#!/bin/bash\necho nothing\n", rank=0, instance_id="i")


def test_user_data_is_valid_bash_and_the_launcher_runs_what_the_parser_says(tmp_path: Path) -> None:
    script = userdata.render(SPEC, install="skypurza @ https://example.com/dist/spz.whl")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "systemctl enable --now" in script and userdata.unit_name("test") in script
    assert "'skypurza @ https://example.com/dist/spz.whl'" in script
    # Run the script's own argv and launcher lines with the metadata answers set, writing the
    # launcher into tmp_path: bash's quoting must give what the parser gives.
    launcher = tmp_path / "agent.sh"
    lines = [ln for ln in script.splitlines() if ln.startswith(("SPZ_ARGV=(", "{ echo '#!/bin/bash'"))]
    assert len(lines) == 2
    prelude = "SPZ_RANK=2\nSPZ_INSTANCE_ID=i-0def\nSPZ_ZONE='us-east-1d'\nSPZ_HOME=/home/ubuntu\n"
    body = prelude + "\n".join(lines).replace(userdata.LAUNCHER, str(launcher)) + "\n"
    subprocess.run(["bash", "-c", body], check=True)
    text = launcher.read_text().splitlines()
    assert text[0] == "#!/bin/bash" and text[1].startswith("exec ")
    ran = shlex.split(text[1])[1:]
    assert ran == userdata.agent_argv(script, rank=2, instance_id="i-0def", zone="us-east-1d", home="/home/ubuntu")
    assert ran[0] == userdata.PYTHON


def _placement(**kw) -> PlacementChosen:
    cand = Candidate(infra="aws", region="us-east-1", zone="us-east-1a", instance_type="p4d.24xlarge",
                     use_spot=False, vcpus=96, memory_gib=1152, accelerators={"A100": 8}, num_nodes=2,
                     hourly_price_micros=32_770_000, **kw)
    return PlacementChosen(task_id="t", cluster="c", attempt=3, candidate=cand, num_nodes=2)


@pytest.mark.parametrize(("kind", "event", "cls"), [
    (FailureKind.CAPACITY, "capacity_error", "capacity"),
    (FailureKind.SPOT_CAPACITY, "capacity_error", "spot_capacity"),
    (FailureKind.QUOTA, "capacity_error", "quota"),
    (FailureKind.UNSUPPORTED, "capacity_error", "unsupported"),
    (FailureKind.TRANSIENT, "capacity_error", "transient"),
    (FailureKind.AUTH, "provision_failed", "auth"),
    (FailureKind.INVALID, "provision_failed", "other"),
    (FailureKind.UNKNOWN, "provision_failed", "other"),
])
def test_failure_kinds_map_to_events(kind: FailureKind, event: str, cls: str) -> None:
    err = provision_error(Failure(kind, FailureScope.ZONE, "Code", "what AWS said", "do this"))
    ev = plan.failure_event(err, _placement(), "pid")
    assert (ev.EVENT_NAME, ev.error_class, ev.code, ev.placement_id) == (event, cls, "Code", "pid")
    assert ev.message == "what AWS said (do this)" and ev.candidate.instance_type == "p4d.24xlarge"
    if event == "capacity_error":
        assert ev.attempt == 3


def test_launch_spec_takes_what_the_candidate_lacks_from_the_matching_request() -> None:
    requests = [
        ResourceRequest(cloud="aws", accelerator="H100", accelerator_count=8, ports=("22",)),
        ResourceRequest(cloud="aws", accelerator="A100", accelerator_count=8, network_tier="best",
                        disk_tier="high", disk_size_gb=512, ports=("8080", "9000-9010"), labels={"team": "ml"},
                        image_id={"us-east-1": "ami-0123456789abcdef0"}),
        ResourceRequest(cloud="aws", accelerator="A100", use_spot=True),
    ]
    pc = _placement()
    req = plan.matching_request(requests, pc.candidate)
    assert req is requests[1]
    spec = plan.launch_spec(stage="test", placement=pc, placement_id="pid", submitted=None, request=req,
                            job_id=4, user_data="#!/bin/bash\n", labels={"start_seq": "9"})
    assert (spec.launch_token, spec.cluster, spec.num_nodes, spec.zone, spec.job_id) == ("pid", "c", 2, "us-east-1a", "4")
    assert spec.image_id == {"us-east-1": "ami-0123456789abcdef0"} and spec.disk_size_gb == 512
    assert spec.placement_group and spec.network_tier == "best" and spec.disk_tier == "high"
    assert spec.ports == ("8080", "9000-9010") and spec.labels == {"team": "ml", "start_seq": "9"}
    assert plan.tres_of(pc.candidate) == {"node": 1, "cpu": 96, "mem": 1152 * 1024, "gres/gpu:a100": 8, "gres/gpu": 8}
    one = plan.launch_spec(stage="test", placement=_placement(image_id="ami-0aaaaaaaaaaaaaaaa"),
                           placement_id="p", submitted=None, request=None, job_id=None)
    assert one.image_id == "ami-0aaaaaaaaaaaaaaaa" and not one.placement_group and one.job_id is None


def test_reconcile_pure_parts() -> None:
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)
    nodes = [NodeInfo("i-old", 0, NodeState.RUNNING, launched_at=now - timedelta(minutes=11)),
             NodeInfo("i-new", 0, NodeState.RUNNING, launched_at=now - timedelta(minutes=2)),
             NodeInfo("i-when", 0, NodeState.RUNNING)]
    assert [n.instance_id for n in old_enough(nodes, now, 600)] == ["i-old", "i-when"]
    from skypurza.events.models import ClusterProvisioned
    from skypurza.events.types import NodeInfo as EventNode

    def prov(cluster: str, infra: str) -> ClusterProvisioned:
        return ClusterProvisioned(cluster=cluster, task_id="t", placement_id="p",
                                  candidate=Candidate(infra=infra), nodes=[EventNode(rank=0, instance_id=f"i-{cluster}")],
                                  hourly_price_micros=0, launched_at=now)

    live = {"a": prov("a", "aws"), "b": prov("b", "local")}
    assert expected_nodes(live, "aws", launching={"c"}) == {"a": ["i-a"], "c": []}
