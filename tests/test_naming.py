"""events/naming.py: the shapes of the infrastructure names (infra/, docs/deploy.md)."""

from __future__ import annotations

import pytest

from skypurza.events import naming


def test_stack_names_are_skypurza_stage_component():
    assert naming.stack_name("bake_usw2", "network") == "SkypurzaBakeUsw2Network"
    assert naming.stack_name("dr_use1", "bus") == "SkypurzaDrUse1Bus"
    assert naming.stack_name(naming.DELIVERY_STAGE, "pipeline") == "SkypurzaCiPipeline"
    with pytest.raises(ValueError):
        naming.stack_name("prod", "mystery")


def test_physical_names_roles_log_groups_and_parameters():
    assert naming.role_name("prod", "provisioner", "task") == "skypurza-prod-provisioner-task"
    long = naming.role_name("bake_usw2", "pipeline", "x" * 80)
    assert len(long) == 64 and long.startswith("skypurza-bake_usw2-pipeline-")
    assert long != naming.role_name("bake_usw2", "pipeline", "x" * 81)  # the digest keeps them apart
    assert naming.log_group("prod", "optimizer") == "/skypurza/prod/optimizer"
    assert naming.parameter("prod", "bus", "streams") == "/skypurza/prod/bus/streams"
    assert naming.bus_node_host("dr_use1", 2) == "n2.dr-use1.bus.skypurza.internal"
    assert naming.bus_user_secret("dr_use1", "api") == "/skypurza/dr_use1/bus/users/api"
    assert naming.alerts_webhooks_secret("dr_use1") == "/skypurza/dr_use1/alerts/webhooks"
    # DR's nodes read prod's leaf secret (its replica in their region) by this name
    assert naming.bus_user_secret("prod", naming.BUS_LEAF_USER) == "/skypurza/prod/bus/users/leaf"
    with pytest.raises(ValueError):
        naming.bus_user_secret("prod", naming.cluster_agent_user("gpu-1"))  # made by the provisioner, not here


def test_bucket_and_load_balancer_names_follow_their_services_rules():
    b = naming.infra_bucket("bake_usw2", "checkpoints", "111111111111")
    assert b == "skypurza-bake-usw2-state-checkpoints-111111111111" and len(b) <= 63
    with pytest.raises(ValueError):
        naming.infra_bucket("prod", "exports", "12")
    lb = naming.load_balancer("bake_usw2", "apitg")
    assert lb == "skypurza-bake-usw2-lb-apitg" and len(lb) <= 32


def test_name_patterns_accept_the_functions_and_refuse_other_stages():
    pats = naming.infra_name_patterns("prod")
    good = [naming.name("prod", "net", "bus"), naming.role_name("prod", "api", "exec"),
            naming.infra_bucket("prod", "exports", "111111111111"), naming.load_balancer("prod", "api"),
            naming.log_group("prod", "bus"), naming.bus_dns_zone("prod"), naming.bus_node_host("prod", 3),
            naming.bus_user_secret("prod", "api"), naming.bus_user_secret("prod", naming.BUS_CONTROL_USER),
            naming.alerts_webhooks_secret("prod")]
    assert all(any(p.fullmatch(g) for p in pats) for g in good)
    for bad in (naming.name("beta", "net", "bus"), "my-handmade-bucket", "/aws/codebuild/x",
                naming.bus_user_secret("beta", "api"), naming.alerts_webhooks_secret("beta")):
        assert not any(p.fullmatch(bad) for p in pats)


def test_kubernetes_names_are_dns_labels_and_long_ones_stay_unique():
    import re

    dns = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    assert naming.k8s_pod("dev", "train", 0) == "skypurza-dev-node-train-0"
    assert naming.k8s_service("my_stage", "run-1") == "skypurza-my-stage-svc-run-1"
    assert naming.k8s_secret("my_stage", "run-1") == "skypurza-my-stage-creds-run-1"
    assert naming.k8s_secret("dev", "a.b") != naming.k8s_secret("dev", "a-b")
    lossy = {naming.k8s_pod("dev", c, 0) for c in ("a.b", "a_b", "a-b", "A-b")}
    assert len(lossy) == 4 and naming.k8s_pod("dev", "a-b", 0) == "skypurza-dev-node-a-b-0"
    long_a, long_b = "a" * 60 + "x", "a" * 60 + "y"
    pods = {naming.k8s_pod("dev", c, 12) for c in (long_a, long_b)}
    svcs = {naming.k8s_service("dev", c) for c in (long_a, long_b)}
    assert len(pods) == 2 and len(svcs) == 2
    for n in pods | svcs:
        assert len(n) <= 63 and dns.match(n), n
    assert all(n.endswith("-12") for n in pods)
    assert naming.k8s_labels("dev", "train") == {naming.K8S_LABEL_STAGE: "dev", naming.K8S_LABEL_CLUSTER: "train"}


def test_dashboard_uids() -> None:
    assert naming.dashboard_uid("spend") == "skypurza-spend"
    with pytest.raises(ValueError):
        naming.dashboard_uid("Spend Now")


def test_slurm_names() -> None:
    assert naming.slurm_job_name("dev", "My.Cluster") == "skypurza-dev-slurm-my.cluster"
    # relative to the login user's home, and never inside the control plane's `.skypurza/<stage>`
    assert naming.slurm_dir("dev", "My.Cluster") == ".skypurza-slurm/dev/my.cluster"
    with pytest.raises(ValueError):
        naming.slurm_dir("Bad Stage", "c")
