"""infra/ (the control plane on AWS, Python CDK), synthesized offline once for the whole module,
then read with aws_cdk.assertions.Template and by walking every template of the assembly."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

from skypurza.events import naming

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


def load_infra():
    if "infra" in sys.modules:
        return sys.modules["infra"]
    spec = importlib.util.spec_from_file_location("infra", INFRA / "__init__.py",
                                                  submodule_search_locations=[str(INFRA)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["infra"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    infra = load_infra()
    return infra.synth(tmp_path_factory.mktemp("cdk") / "out")  # the users' own cdk.json config


def template(stack):
    from aws_cdk.assertions import Template

    return Template.from_stack(stack)


def resources(stack, type_: str) -> dict:
    return template(stack).find_resources(type_)


def all_stacks(dep):
    yield naming.DELIVERY_STAGE, "pipeline", dep.pipeline
    for stage, st in dep.stages.items():
        for component, stack in st.stacks().items():
            yield stage, component, stack


def test_every_stage_and_its_stacks_are_synthesized(dep):
    assert set(dep.stages) == {"beta", "bake_usw2", "prod", "dr_use1"}
    names = {s.stack_name for _, _, s in all_stacks(dep)}
    assert {"SkypurzaBetaNetwork", "SkypurzaBakeUsw2Bus", "SkypurzaProdServices", "SkypurzaDrUse1State",
            "SkypurzaProdIam", "SkypurzaProdLogs", "SkypurzaProdDns", "SkypurzaCiPipeline"} <= names
    assert "SkypurzaBetaDns" not in names  # no domain configured: no DNS/TLS stack
    assert dep.stages["dr_use1"].cfg.region == "us-east-1" and dep.stages["bake_usw2"].cfg.region == "us-west-2"


def infra_services() -> tuple[str, ...]:
    return load_infra().config.SERVICES


def test_every_stage_runs_every_service_spz_api_serve_knows(dep):
    """A service added to cli/serve.py or to the `skypurza.services` entry points cannot be left
    out of a deployment: what it alone emits would never come (dispatch's TaskAdmitted: the
    optimizer waits for it once a dispatch policy is applied)."""
    from served_services import every_service

    every = every_service()
    assert sorted(infra_services()) == sorted(every)
    for stage, st in dep.stages.items():
        tasks = {json.dumps(d["Properties"]["ContainerDefinitions"][0].get("Command"))
                 for d in resources(st.services, "AWS::ECS::TaskDefinition").values()}
        assert {json.dumps(["spz", "api", "serve", "--services", s]) for s in every} <= tasks, stage
        if not st.cfg.mirror_of:  # a mirror runs none until it fails over (below)
            assert all(st.cfg.running(s) >= 1 for s in every), stage
    # the one-writer services never run two tasks, not even during a deploy
    for svc in resources(dep.stages["prod"].services, "AWS::ECS::Service").values():
        name = svc["Properties"]["ServiceName"]
        single = any(name == naming.name("prod", s, "service") for s in load_infra().config.SINGLE_WRITERS)
        assert (svc["Properties"]["DeploymentConfiguration"]["MaximumPercent"] == 100) is single, name


def test_state_buckets_are_encrypted_versioned_and_never_public(dep):
    for stage, st in dep.stages.items():
        buckets = resources(st.state, "AWS::S3::Bucket")
        assert len(buckets) == 2
        for b in buckets.values():
            p = b["Properties"]
            assert p["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"][
                "SSEAlgorithm"] == "AES256"
            assert p["VersioningConfiguration"] == {"Status": "Enabled"}
            assert p["PublicAccessBlockConfiguration"] == {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                                           "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
            assert b["DeletionPolicy"] == "Retain"
        assert {b["Properties"]["BucketName"] for b in buckets.values()} == {
            naming.infra_bucket(stage, p, st.cfg.account) for p in ("checkpoints", "exports")}
        policies = json.dumps(resources(st.state, "AWS::S3::BucketPolicy"))
        assert '"aws:SecureTransport": "false"' in policies  # TLS only


def test_log_groups_have_the_stages_retention(dep):
    for stage, st in dep.stages.items():
        groups = resources(st.logs, "AWS::Logs::LogGroup")
        assert {g["Properties"]["LogGroupName"] for g in groups.values()} == {
            naming.log_group(stage, c) for c in ("optimizer", "provisioner", "recovery", "status", "mirror", "ledger",
                                                 "dispatch", "observability", "gpuhealth", "alerts", "api", "bus")}
        assert {g["Properties"]["RetentionInDays"] for g in groups.values()} == {st.cfg.log_retention_days}


def test_bus_is_three_nodes_on_their_own_volumes_with_fsync_always_and_r3_streams(dep):
    infra = load_infra()
    for stage, st in dep.stages.items():
        t = template(st.bus)
        instances = t.find_resources("AWS::EC2::Instance")
        volumes = t.find_resources("AWS::EC2::Volume")
        assert len(instances) == 3 and len(volumes) == 3
        assert len(t.find_resources("AWS::EC2::VolumeAttachment")) == 3
        assert {v["Properties"]["AvailabilityZone"] for v in volumes.values()} == set(st.cfg.azs)
        assert all(v["Properties"]["Encrypted"] and v["DeletionPolicy"] == "Retain" for v in volumes.values())
        for node in range(1, 4):
            conf = infra.busconfig.nats_conf(st.cfg, node, leaf_listen=stage == "prod",
                                             source=dep.stages["prod"].cfg if stage == "dr_use1" else None)
            assert "sync_interval: always" in conf.split("jetstream {")[1].split("}")[0]
            assert conf.count("nats-route://") == 3
        # the rendered config is what the nodes boot with
        user_data = json.dumps([i["Properties"]["UserData"] for i in instances.values()])
        assert user_data.count("sync_interval: always") == 3
        (param,) = t.find_resources("AWS::SSM::Parameter").values()
        streams = json.loads(param["Properties"]["Value"])
        assert [s["num_replicas"] for s in streams] == [3]
        # and the services create any other stream at R3 too
        services = json.dumps(resources(st.services, "AWS::ECS::TaskDefinition"))
        assert '{"Name": "SKYPURZA_REPLICAS", "Value": "3"}' in services


def test_dr_mirrors_prods_event_stream_with_jetstream_sources(dep):
    dr, prod = dep.stages["dr_use1"], dep.stages["prod"]
    (param,) = resources(dr.bus, "AWS::SSM::Parameter").values()
    (stream,) = json.loads(param["Properties"]["Value"])
    assert stream["name"] == naming.events_stream("prod")
    assert stream["sources"] == [{"name": naming.events_stream("prod"), "external": {"api": "$JS.prod.API"}}]
    assert stream["subjects"] == []  # nothing but prod writes to the mirror
    (prod_param,) = resources(prod.bus, "AWS::SSM::Parameter").values()
    (prod_stream,) = json.loads(prod_param["Properties"]["Value"])
    assert "sources" not in prod_stream and prod_stream["subjects"] == [naming.all_events_subject("prod")]
    user_data = json.dumps([i["Properties"]["UserData"] for i in resources(dr.bus, "AWS::EC2::Instance").values()])
    assert user_data.count(f"nats-leaf://{naming.bus_node_host('prod', 1)}:7422") == 3
    # prod's bus lets the mirror's network in on the leaf node port; nobody else
    (bus_sg,) = [g for g in resources(prod.network, "AWS::EC2::SecurityGroup").values()
                 if g["Properties"]["GroupName"] == naming.name("prod", "net", "bus")]
    ingress = [r for r in bus_sg["Properties"].get("SecurityGroupIngress", []) if r.get("FromPort") == 7422]
    assert [r["CidrIp"] for r in ingress] == [dr.cfg.cidr]
    # a mirror runs no service until it fails over (it would act on prod's events a second time)
    counts = {s["Properties"]["ServiceName"]: s["Properties"]["DesiredCount"]
              for s in resources(dr.services, "AWS::ECS::Service").values()}
    assert len(counts) == len(infra_services()) + 1 and set(counts.values()) == {0}  # and the API server
    prod_counts = [s["Properties"]["DesiredCount"] for s in resources(prod.services, "AWS::ECS::Service").values()]
    assert min(prod_counts) >= 1


def test_provisioner_ec2_rights_are_conditioned_on_its_stage_tag(dep):
    for stage, st in dep.stages.items():
        roles = resources(st.iam, "AWS::IAM::Role")
        by_name = {r["Properties"]["RoleName"]: r for r in roles.values()}
        prov = by_name[naming.role_name(stage, "provisioner", "task")]
        statements = prov["Properties"]["Policies"][0]["PolicyDocument"]["Statement"] if "Policies" in \
            prov["Properties"] else None
        if statements is None:
            policies = resources(st.iam, "AWS::IAM::Policy")
            statements = next(p["Properties"]["PolicyDocument"]["Statement"] for p in policies.values()
                              if json.dumps(p["Properties"]["Roles"]).count("ProvisionerTask"))
        mutating = [s for s in statements if any(a in ("ec2:RunInstances", "ec2:TerminateInstances")
                                                 for a in ([s["Action"]] if isinstance(s["Action"], str)
                                                           else s["Action"]))]
        served = st.cfg.serves
        conditioned = [s for s in mutating if "Condition" in s]
        assert any(s["Condition"]["StringEquals"].get("aws:ResourceTag/Stage") == served
                   and "ec2:TerminateInstances" in s["Action"] for s in conditioned)
        assert any(s["Condition"]["StringEquals"].get("aws:RequestTag/Stage") == served
                   and "ec2:RunInstances" in s["Action"] and any(":instance/" in r for r in s["Resource"])
                   for s in conditioned)
        # the only unconditioned RunInstances is on launch inputs (images, subnets...), never instances
        for s in mutating:
            if "Condition" not in s:
                assert "ec2:TerminateInstances" not in s["Action"]
                assert not any(":instance/" in r or ":volume/" in r for r in s["Resource"])
        # services that call no AWS API get no policy at all
        for quiet in ("optimizer", "status", "api", "mirror", "dispatch", "observability", "gpuhealth", "alerts"):
            assert "Policies" not in by_name[naming.role_name(stage, quiet, "task")]["Properties"]
        assert not any(quiet.capitalize() + "Task" in json.dumps(p["Properties"]["Roles"])
                       for p in resources(st.iam, "AWS::IAM::Policy").values()
                       for quiet in ("Optimizer", "Status", "Api"))


def test_pipeline_promotes_beta_then_the_bake_canary_then_prod(dep):
    infra = load_infra()
    (pipe,) = resources(dep.pipeline, "AWS::CodePipeline::Pipeline").values()
    assert pipe["Properties"]["Name"] == naming.name(naming.DELIVERY_STAGE, "pipeline", "main")
    stages = [s["Name"] for s in pipe["Properties"]["Stages"]]
    assert stages.index("SkypurzaBeta") < stages.index("SkypurzaBakeUsw2") < stages.index("SkypurzaProd")
    bake = next(s for s in pipe["Properties"]["Stages"] if s["Name"] == "SkypurzaBakeUsw2")
    actions = [a["Name"] for a in sorted(bake["Actions"], key=lambda a: a["RunOrder"])]
    assert actions[-1] == "CanaryBakeUsw2"  # after every stack of the stage is deployed
    prod = next(s for s in pipe["Properties"]["Stages"] if s["Name"] == "SkypurzaProd")
    ordered = sorted(prod["Actions"], key=lambda a: a["RunOrder"])
    assert ordered[0]["Name"] == "ApproveProd" and ordered[-1]["Name"] == "DeployDrUse1"
    canary = " ".join(infra.pipeline.canary_commands(dep.stages["bake_usw2"].cfg))
    assert "https://bake.api.example.com/api/v1/health" in canary and "'bake_usw2'" in canary
    projects = json.dumps(resources(dep.pipeline, "AWS::CodeBuild::Project"))
    assert "bake.api.example.com/api/v1/health" in projects  # the canary step really runs that


def test_api_server_is_https_only_where_a_domain_is_configured(dep):
    prod, beta = dep.stages["prod"], dep.stages["beta"]
    listeners = [l["Properties"] for l in resources(prod.services, "AWS::ElasticLoadBalancingV2::Listener").values()]
    assert [(l["Port"], l["Protocol"]) for l in listeners] == [(443, "HTTPS")]
    assert len(resources(prod.dns, "AWS::CertificateManager::Certificate")) == 1
    (lb,) = resources(beta.services, "AWS::ElasticLoadBalancingV2::LoadBalancer").values()
    assert lb["Properties"]["Scheme"] == "internal"  # no certificate: never plain HTTP on the internet


NAME_KEYS = re.compile(r".*Name$|^Family$")


def _names(props: dict) -> list[tuple[str, str]]:
    out = [(k, v) for k, v in props.items() if NAME_KEYS.match(k) and isinstance(v, str)]
    tags = props.get("Tags")
    if isinstance(tags, list):
        out += [("Tag:Name", t["Value"]) for t in tags if isinstance(t, dict) and t.get("Key") == "Name"
                and isinstance(t.get("Value"), str)]
    return out


def test_every_name_in_every_template_comes_from_the_naming_module(dep):
    stages = [naming.DELIVERY_STAGE, *dep.stages]
    stack_names = {naming.stack_name(s, c) for s in stages for c in naming.INFRA_COMPONENTS}
    bad = []
    seen = 0
    for stage, _component, stack in all_stacks(dep):
        if stack.stack_name not in stack_names:
            bad.append(f"stack {stack.stack_name}")
        patterns = naming.infra_name_patterns(stage)
        for logical, res in template(stack).to_json()["Resources"].items():
            for key, value in _names(res.get("Properties", {})):
                seen += 1
                if res["Type"] == "AWS::Route53::RecordSet" or key in ("DomainName",) or \
                        (res["Type"] == "AWS::IAM::Policy" and key == "PolicyName"):  # an inline document's label
                    continue  # a configured public DNS name (cdk.json's domain), not a resource name
                if not any(p.fullmatch(value) for p in patterns):
                    bad.append(f"{stack.stack_name}/{logical} {res['Type']} {key}={value!r}")
        # every role is the stage's, CDK's own ones too
        for logical, res in template(stack).find_resources("AWS::IAM::Role").items():
            name_ = res["Properties"].get("RoleName")
            if not (isinstance(name_, str) and name_.startswith(f"{naming.PROJECT}-{stage}-")):
                bad.append(f"{stack.stack_name}/{logical} role {name_!r}")
    assert seen > 100 and bad == [], "\n".join(bad)


def test_every_taggable_resource_carries_project_and_stage(dep):
    from aws_cdk import CfnResource, TagManager

    missing = []
    checked = 0
    for stage, _component, stack in all_stacks(dep):
        res = template(stack).to_json()["Resources"]
        for node in stack.node.find_all():
            if not isinstance(node, CfnResource) or not TagManager.is_taggable(node):
                continue
            if node.stack is not stack:
                continue  # a nested stage's stack is checked as its own
            logical = stack.resolve(node.logical_id)
            props = res[logical].get("Properties", {})
            tags = props.get("Tags") or props.get("HostedZoneTags") or {}
            if isinstance(tags, list):
                tags = {t.get("Key"): t.get("Value") for t in tags}
            checked += 1
            if tags.get("Project") != naming.PROJECT or tags.get("Stage") != stage:
                missing.append(f"{stack.stack_name}/{logical} {res[logical]['Type']}: {tags}")
    assert checked > 100 and missing == [], "\n".join(missing)


def test_infra_code_writes_no_resource_name_of_its_own():
    offenders = [f"{p.name}:{n}: {line.strip()}" for p in sorted(INFRA.glob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if re.search(rf"{naming.PROJECT}-[a-z0-9]|['\"]/{naming.PROJECT}/|['\"]Skypurza", line)]
    assert offenders == []


def test_monthly_cost_counts_what_the_stacks_create(dep):
    infra = load_infra()
    from skypurza.services.optimizer.catalog.loader import shipped_catalog

    lines = infra.costs.monthly_costs(dep.infra, infra.costs.catalog_price(shipped_catalog()))
    for stage, st in dep.stages.items():
        bus, hosts = [ln for ln in lines if ln.stage == stage]
        assert bus.count == len(resources(st.bus, "AWS::EC2::Instance"))
        (asg,) = resources(st.services, "AWS::AutoScaling::AutoScalingGroup").values()
        assert hosts.count == int(asg["Properties"]["MaxSize"])
    prod = [ln for ln in lines if ln.stage == "prod"]
    # m6i.large at $0.096/h in us-west-2 (the shipped catalog), 6 instances, 730 h
    assert sum(ln.monthly_micros for ln in prod) == 6 * 96_000 * 730
    table = infra.costs.render(lines)
    assert "| **prod** | | **compute total** | | | | **420.48** |" in table
    assert table in (ROOT / "docs" / "deploy.md").read_text()  # the doc shows what the code computes


def test_a_bad_config_is_refused_with_the_field_named():
    infra = load_infra()
    ctx = json.loads((INFRA / "cdk.json").read_text())["context"]["skypurza"]
    bad = json.loads(json.dumps(ctx))
    bad["stages"][1]["domain"] = None  # the canary needs a domain
    with pytest.raises(ValueError, match="canary stage 'bake_usw2' needs a domain"):
        infra.config.parse(bad)
    bad = json.loads(json.dumps(ctx))
    bad["stages"][3]["region"] = "us-west-2"
    with pytest.raises(ValueError, match="same region"):
        infra.config.parse(bad)
    bad = json.loads(json.dumps(ctx))
    bad["stages"][0]["services"]["provisioner"] = 2
    with pytest.raises(ValueError, match="at most one task"):
        infra.config.parse(bad)
    bad = json.loads(json.dumps(ctx))
    bad["stages"][0]["services"]["dispatch"] = 2  # two folds, each of half the events, would admit twice
    with pytest.raises(ValueError, match="at most one task"):
        infra.config.parse(bad)
