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


def streams_parameters(st) -> list[dict]:
    """The bus's stream definitions parameter (beside it: the authorization template's)."""
    return [r for r in resources(st.bus, "AWS::SSM::Parameter").values()
            if r["Properties"]["Name"] == naming.parameter(st.cfg.stage, "bus", "streams")]


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
            conf = infra.busconfig.nats_conf(st.cfg, node)
            assert "sync_interval: always" in conf.split("jetstream {")[1].split("}")[0]
            assert conf.count("nats-route://") == 3
        # the rendered config is what the nodes boot with
        user_data = json.dumps([i["Properties"]["UserData"] for i in instances.values()])
        assert user_data.count("sync_interval: always") == 3
        (param,) = streams_parameters(st)
        streams = json.loads(param["Properties"]["Value"])
        # every stream and bucket R3 (a mirror has its sourced event stream only)
        assert [d.get("num_replicas") or next(iter(d.values()))["replicas"] for d in streams] == \
            [3] * (1 if st.cfg.mirror_of and not st.cfg.failed_over else 5)
        # and the services create any other stream at R3 too
        services = json.dumps(resources(st.services, "AWS::ECS::TaskDefinition"))
        assert '{"Name": "SKYPURZA_REPLICAS", "Value": "3"}' in services


def test_dr_mirrors_prods_event_stream_with_jetstream_sources(dep):
    dr, prod = dep.stages["dr_use1"], dep.stages["prod"]
    (param,) = streams_parameters(dr)
    (stream,) = json.loads(param["Properties"]["Value"])
    assert stream["name"] == naming.events_stream("prod")
    assert stream["sources"] == [{"name": naming.events_stream("prod"), "external": {"api": "$JS.prod.API"}}]
    assert stream["subjects"] == []  # nothing but prod writes to the mirror
    (prod_param,) = streams_parameters(prod)
    prod_stream = json.loads(prod_param["Properties"]["Value"])[0]  # the event stream comes first
    assert "sources" not in prod_stream and prod_stream["subjects"] == [naming.all_events_subject("prod")]
    # the remote to every prod node, as the leaf user: in the filled (included) file, not nats.conf,
    # since each URL carries the password
    for inst in resources(dr.bus, "AWS::EC2::Instance").values():
        text = "".join(_strings(inst["Properties"]["UserData"]))
        conf = text.split("cat > /etc/nats/nats.conf <<'CONF'\n")[1].split("\nCONF\n")[0]
        assert "sync_interval: always" in conf and "nats-leaf://" not in conf and "leafnodes" not in conf
    dr_template, _ = _auth_parameter(dr)
    slot = load_infra().bus_auth.url_placeholder(naming.BUS_LEAF_USER)
    assert re.findall(r'"nats-leaf://[^"]*"', dr_template) == [
        f'"nats-leaf://{naming.BUS_LEAF_USER}:{slot}@{naming.bus_node_host("prod", n)}:7422"' for n in (1, 2, 3)]
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


# ---------------------------------------------------------------- the secured bus (issue 14)

def _strings(value):
    """Every string anywhere in a template (user data's Fn::Join parts included)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _statements(doc: dict) -> list[dict]:
    st = doc["Statement"]
    return st if isinstance(st, list) else [st]


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _secret_statements(tmpl: dict, role_logical: str) -> list[dict]:
    """The statements with a Secrets Manager action of the policies attached to one role (by its
    logical id) in a template, and of the role's own inline policies."""
    out = []
    for res in tmpl["Resources"].values():
        if res["Type"] == "AWS::IAM::Policy" and {"Ref": role_logical} in res["Properties"]["Roles"]:
            out += _statements(res["Properties"]["PolicyDocument"])
    for p in tmpl["Resources"][role_logical]["Properties"].get("Policies", []):
        out += _statements(p["PolicyDocument"])
    return [s for s in out if any(a.startswith("secretsmanager:") for a in _as_list(s["Action"]))]


def expected_bus_users(stage_cfg):
    from skypurza.cli.busauth import deployment_contracts
    from skypurza.events.natsauth import deployment_users

    # What `spz api start --deploy` makes (cli/busauth.py), for the stage whose log the services act on.
    return deployment_users(stage_cfg.serves, deployment_contracts())


def _bus_secrets(st) -> dict[str, str]:
    """Logical id -> secret name of every Secrets Manager secret in a stage's bus stack."""
    return {k: r["Properties"]["Name"] for k, r in template(st.bus).to_json()["Resources"].items()
            if r["Type"] == "AWS::SecretsManager::Secret"}


def test_every_bus_user_has_a_secret_whose_password_secrets_manager_draws(dep):
    for stage, st in dep.stages.items():
        users = [u.name for u in expected_bus_users(st.cfg)]
        if stage == "prod":  # mirrored: its leaf node listener's user too (one, whatever the mirrors)
            users.append(naming.BUS_LEAF_USER)
        secrets = template(st.bus).find_resources("AWS::SecretsManager::Secret")
        by_name = {r["Properties"]["Name"]: r["Properties"] for r in secrets.values()}
        assert set(by_name) == {naming.bus_user_secret(stage, u) for u in users}, stage
        for u in users:
            props = by_name[naming.bus_user_secret(stage, u)]
            assert "SecretString" not in props  # drawn at deploy time, never written here
            gen = props["GenerateSecretString"]
            assert json.loads(gen["SecretStringTemplate"]) == {"user": u}
            assert gen["GenerateStringKey"] == "password" and gen["ExcludePunctuation"] is True
            assert gen["PasswordLength"] >= 48
            # the leaf user's alone is replicated: to the mirror's region, where its nodes read it
            assert props.get("ReplicaRegions") == ([{"Region": "us-east-1"}] if u == naming.BUS_LEAF_USER else None)


def test_every_service_container_gets_exactly_its_own_bus_users_secret(dep):
    from skypurza.events.natscreds import CREDS_ENV, PASSWORD_ENV, USER_ENV
    from skypurza.services.observability.alerts.settings import JSON_WEBHOOKS_ENV, SLACK_WEBHOOKS_ENV

    infra = load_infra()
    checked = 0
    for stage, st in dep.stages.items():
        bus = template(st.bus).to_json()
        secret_names = _bus_secrets(st)
        # what each export of the bus stack is (the services stack imports the secrets' ARNs)
        exports = {o["Export"]["Name"]: o["Value"] for o in bus.get("Outputs", {}).values() if "Export" in o}
        # the services stack's own secret: the alerts webhooks'
        local = {k: r["Properties"]["Name"] for k, r in resources(st.services, "AWS::SecretsManager::Secret").items()}
        webhooks = naming.alerts_webhooks_secret(stage)
        for task in resources(st.services, "AWS::ECS::TaskDefinition").values():
            family = task["Properties"]["Family"]
            (service,) = [s for s in (*infra.config.SERVICES, infra.config.API)
                          if family == naming.name(stage, s, "task")]
            (container,) = task["Properties"]["ContainerDefinitions"]
            env = {e["Name"] for e in container.get("Environment", [])}
            assert not env & {USER_ENV, PASSWORD_ENV, CREDS_ENV, SLACK_WEBHOOKS_ENV, JSON_WEBHOOKS_ENV}, \
                (stage, service)  # never a plain value
            got = {}
            for s in container.get("Secrets", []):
                join = s["ValueFrom"]["Fn::Join"][1]
                if "Ref" in join[0]:
                    got[s["Name"]] = (local[join[0]["Ref"]], join[1])
                    continue
                ref = exports[join[0]["Fn::ImportValue"]]
                got[s["Name"]] = (secret_names[ref["Ref"]], join[1])
            own = naming.bus_user_secret(stage, service)  # the API server's user is `api`, a service's its contract's
            expected = {USER_ENV: (own, ":user::"), PASSWORD_ENV: (own, ":password::")}
            if service == "alerts":  # its webhooks as well, each variable from its key
                expected |= {SLACK_WEBHOOKS_ENV: (webhooks, ":slack::"), JSON_WEBHOOKS_ENV: (webhooks, ":json::")}
            assert got == expected, (stage, service)
            checked += 1
    assert checked == len(dep.stages) * (len(infra_services()) + 1)


def test_the_alerts_webhooks_secret_starts_with_empty_keys_that_the_settings_read_as_no_webhook(dep):
    from skypurza.services.observability.alerts.settings import (
        JSON_WEBHOOKS_ENV, SLACK_WEBHOOKS_ENV, WEBHOOKS_SECRET_KEYS, AlertSettings,
    )

    assert WEBHOOKS_SECRET_KEYS == {"slack": SLACK_WEBHOOKS_ENV, "json": JSON_WEBHOOKS_ENV}
    for stage, st in dep.stages.items():
        (props,) = [r["Properties"] for r in resources(st.services, "AWS::SecretsManager::Secret").values()]
        assert props["Name"] == naming.alerts_webhooks_secret(stage) and "SecretString" not in props
        gen = props["GenerateSecretString"]
        assert json.loads(gen["SecretStringTemplate"]) == {"slack": "", "json": ""}, stage
        assert gen["GenerateStringKey"] not in WEBHOOKS_SECRET_KEYS  # the drawn key is none the container reads
    # What ECS sets from the keys as made (empty): no webhook; once filled, each URL a webhook.
    assert AlertSettings.load(env={SLACK_WEBHOOKS_ENV: "", JSON_WEBHOOKS_ENV: ""}, config={}).webhooks == ()
    filled = AlertSettings.load(env={SLACK_WEBHOOKS_ENV: "https://hooks.slack.example/T1/B2/x",
                                     JSON_WEBHOOKS_ENV: "https://a.example/hook,https://b.example/hook"}, config={})
    assert [h.form for h in filled.webhooks] == ["slack", "json", "json"]


def test_execution_roles_read_their_own_secret_and_no_other_role_reads_any(dep):
    infra = load_infra()
    for stage, st in dep.stages.items():
        tmpl = template(st.iam).to_json()
        roles = {r["Properties"]["RoleName"]: k for k, r in tmpl["Resources"].items()
                 if r["Type"] == "AWS::IAM::Role"}
        for service in (*infra.config.SERVICES, infra.config.API):
            statements = _secret_statements(tmpl, roles[naming.role_name(stage, service, "exec")])
            arns = [r for s in statements for r in _as_list(s["Resource"])]
            secret_arn = f"arn:aws:secretsmanager:{st.cfg.region}:{st.cfg.account}:secret:{{}}-??????"
            assert arns == [secret_arn.format(naming.bus_user_secret(stage, service))] + (
                [secret_arn.format(naming.alerts_webhooks_secret(stage))] if service == "alerts" else []), \
                (stage, service)
            assert [a for s in statements for a in _as_list(s["Action"])] == ["secretsmanager:GetSecretValue"]
            assert _secret_statements(tmpl, roles[naming.role_name(stage, service, "task")]) == []
    # nowhere else: no other stack's role, and no resource policy opening a secret to anyone
    for stage, component, stack in all_stacks(dep):
        tmpl = template(stack).to_json()
        assert not [r for r in tmpl["Resources"].values() if r["Type"] == "AWS::SecretsManager::ResourcePolicy"]
        if component in ("iam", "bus"):
            continue
        for logical, res in tmpl["Resources"].items():
            if res["Type"] == "AWS::IAM::Role":
                assert _secret_statements(tmpl, logical) == [], (stack.stack_name, logical)


def test_no_password_or_secret_value_is_in_any_template(dep):
    slot = re.compile(r"@@bus-password:[a-z0-9_.]+@@")
    url_slot = re.compile(r"@@bus-url-password:[a-z0-9_.]+@@")
    for stage, _component, stack in all_stacks(dep):
        tmpl = template(stack).to_json()
        strings = list(_strings(tmpl))
        if _component == "bus":
            strings += [_auth_parameter(dep.stages[stage])[0]]
        for s in strings:
            assert "{{resolve:secretsmanager" not in s and "{{resolve:ssm-secure" not in s
            for value in re.findall(r"password\"?\s*:\s*\"([^\"]*)\"", s):
                assert slot.fullmatch(value), (stack.stack_name, value)
            # a leaf remote's password: up to the URL's last `@` (a slot holds `@`s itself)
            for value in re.findall(r"nats-leaf://[^:/@\"]*:([^\"\s]*)@[^@\"\s]*", s):
                assert url_slot.fullmatch(value), (stack.stack_name, value)
        for res in tmpl["Resources"].values():
            assert "SecretString" not in res.get("Properties", {})


def _auth_parameter(st) -> tuple[str, dict[str, str]]:
    """The bus's authorization template and each user's secret name, decoded as a node does
    (base64, gzip, JSON), read from the synthesized parameter."""
    import base64
    import gzip

    params = [r["Properties"] for r in resources(st.bus, "AWS::SSM::Parameter").values()
              if r["Properties"]["Name"] == naming.parameter(st.cfg.stage, "bus", "auth")]
    assert len(params) == 1, st.cfg.stage
    assert len(params[0]["Value"]) <= 4096  # a standard parameter
    data = json.loads(gzip.decompress(base64.b64decode(params[0]["Value"])))
    return data["template"], data["secrets"]


def test_bus_nodes_fill_the_deployments_authorization_block_from_the_users_secrets(dep):
    infra = load_infra()
    from skypurza.events.natsauth import authorization_block

    for stage, st in dep.stages.items():
        users = expected_bus_users(st.cfg)
        block, secrets = _auth_parameter(st)
        auth = authorization_block(users, {u.name: infra.bus_auth.placeholder(u.name) for u in users})
        assert block == auth + infra.busconfig.leafnodes_block(st.cfg, leaf_listen=stage == "prod")
        assert ("leafnodes" in block) == (stage in ("prod", "dr_use1"))
        assert "no_auth_user" not in block  # nobody is anonymous
        leaf = {"prod": {naming.BUS_LEAF_USER: naming.bus_user_secret("prod", naming.BUS_LEAF_USER)},
                "dr_use1": {naming.BUS_LEAF_USER: naming.bus_user_secret("prod", naming.BUS_LEAF_USER)}}
        assert secrets == {**{u.name: naming.bus_user_secret(stage, u.name) for u in users}, **leaf.get(stage, {})}
        # every node includes the block beside its config and fills it before nats-server starts
        instances = resources(st.bus, "AWS::EC2::Instance")
        for inst in instances.values():
            text = "".join(s for s in _strings(inst["Properties"]["UserData"]))
            assert f'include "{naming.BUS_AUTH_FILE_NAME}"' in text and "no_auth_user" not in text
            unit = text.split("cat > /etc/systemd/system/nats.service")[1].split("\nUNIT\n")[0]
            assert unit.index("ExecStartPre=/usr/bin/python3 /usr/local/bin/bus-auth.py") < unit.index("ExecStart=")
            # the streams are made as `control`: no service user may
            streams_unit = text.split("cat > /etc/systemd/system/bus-streams.service")[1]
            assert f"/etc/nats/{naming.BUS_CONTROL_USER}.json" in streams_unit.split("ExecStart=")[1].split("\n")[0]
        # the nodes' role reads the bus users' secrets and nothing else of Secrets Manager
        tmpl = template(st.bus).to_json()
        (role,) = [k for k, r in tmpl["Resources"].items() if r["Type"] == "AWS::IAM::Role"
                   and r["Properties"]["RoleName"] == naming.role_name(stage, "bus", "node")]
        read = [r for s in _secret_statements(tmpl, role) for r in _as_list(s["Resource"])]
        assert sorted(r["Ref"] for r in read if isinstance(r, dict)) == sorted(_bus_secrets(st))
        # by name (another region's stack): DR reads the replica of prod's leaf secret in its region only
        assert [r for r in read if isinstance(r, str)] == (
            [f"arn:aws:secretsmanager:us-east-1:{st.cfg.account}:secret:"
             f"{naming.bus_user_secret('prod', naming.BUS_LEAF_USER)}-??????"] if stage == "dr_use1" else [])
        assert set(_bus_secrets(st).values()) | ({secrets[naming.BUS_LEAF_USER]} if stage == "dr_use1" else set()) \
            == set(secrets.values())


def test_a_node_filled_block_refuses_anonymous_clients_and_admits_each_service_as_itself(tmp_path):
    """What a node does at boot, without AWS: the synthesized parameter's template, filled with
    passwords as Secrets Manager draws them (letters and digits), included by nats-server's config
    as the node's nats.conf includes it; services connect with the environment ECS gives them."""
    import asyncio
    import secrets as pysecrets
    import string

    import nats
    from nats_fixtures import kill_processes_using

    from skypurza.cli import busauth
    from skypurza.events.bus import Bus, BusRefused
    from skypurza.events.natscreds import PASSWORD_ENV, USER_ENV, BusCredentials, credentials_from_env
    from skypurza.events.natsserver import NatsServer, free_port

    infra = load_infra()
    cfg = infra.config.load().stage("beta")
    template_text, secret_names = infra.bus_auth.decode(infra.busconfig.auth_parameter_value(cfg, leaf_listen=False))
    alphabet = string.ascii_letters + string.digits
    passwords = {u: "".join(pysecrets.choice(alphabet) for _ in range(48)) for u in secret_names}
    (include,) = [ln for ln in infra.busconfig.nats_conf(cfg, 1).splitlines()
                  if ln.startswith("include ")]
    store = tmp_path / "node"
    store.mkdir()
    (store / naming.BUS_AUTH_FILE_NAME).write_text(infra.bus_auth.render(template_text, passwords))
    server = NatsServer(store_dir=store, port=free_port(), log_file=tmp_path / "nats.log",
                        extra_blocks=(include + "\n",)).start()
    stage = cfg.serves

    async def check() -> None:
        with pytest.raises(Exception, match="(?i)authorization"):
            await nats.connect(server.url, connect_timeout=2, max_reconnect_attempts=0, allow_reconnect=False)
        with pytest.raises(BusRefused):
            await Bus.connect(server.url, stage, source="/tests", max_reconnect_attempts=0,
                              credentials=BusCredentials("optimizer", "wrong"))
        await busauth.set_up(server.url, stage, BusCredentials(naming.BUS_CONTROL_USER, passwords["control"]))
        for service in ("optimizer", "api"):
            creds = credentials_from_env({USER_ENV: service, PASSWORD_ENV: passwords[service]})
            bus = await Bus.connect(server.url, stage, source=f"/tests/{service}", credentials=creds,
                                    max_reconnect_attempts=0)
            assert bus.user == service
            await bus.close()

    try:
        asyncio.run(check())
    finally:
        server.stop()
        kill_processes_using(server.url)


def test_the_nodes_fill_refuses_a_block_it_cannot_fill_whole():
    infra = load_infra()
    cfg = infra.config.load().stage("beta")
    template_text, secret_names = infra.bus_auth.decode(infra.busconfig.auth_parameter_value(cfg, leaf_listen=False))
    full = {u: "p" + u for u in secret_names}
    filled = infra.bus_auth.render(template_text, full)
    assert "@@bus-password:" not in filled and '"poptimizer"' in filled
    missing = dict(full)
    del missing["api"]
    with pytest.raises(ValueError, match="no password for \\['api'\\]"):
        infra.bus_auth.render(template_text, missing)
    with pytest.raises(ValueError, match="empty password"):
        infra.bus_auth.render(template_text, {**full, "api": ""})
    with pytest.raises(ValueError, match="no slot for \\['intruder'\\]"):
        infra.bus_auth.render(template_text, {**full, "intruder": "x"})


def _load_bus_streams():
    """infra/bus_streams.py as the node runs it: a script of its own (stdlib and nats-py)."""
    import importlib.util

    infra = load_infra()
    spec = importlib.util.spec_from_file_location("bus_streams_under_test", infra.busconfig.STREAMS_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_nodes_set_up_makes_everything_spz_api_start_deploy_makes(dep, tmp_path, monkeypatch):
    """A fresh deployment: bus_streams.py applies the synthesized definitions as `control` on one
    secured server; `busauth.set_up` (what compose and `spz api start --deploy` run as `control`)
    runs on another. Both end with the same streams, alike in what matters, and a service's user
    then connects to the node's bus (it only checks its streams: it may create none)."""
    import asyncio
    import secrets as pysecrets
    import string
    import time

    import nats
    from nats_fixtures import kill_processes_using

    from skypurza.cli import busauth
    from skypurza.events.bus import Bus
    from skypurza.events.natscreds import BusCredentials
    from skypurza.events.natsserver import NatsServer, free_port

    monkeypatch.delenv("SKYPURZA_REPLICAS", raising=False)  # one server each: R1
    infra = load_infra()
    st = dep.stages["beta"]
    (param,) = streams_parameters(st)
    assert len(param["Properties"]["Value"]) <= infra.busconfig.SSM_STANDARD_MAX_CHARS  # a standard parameter
    defs = json.loads(param["Properties"]["Value"])
    for d in defs:  # the deployment's R3 on one server (replicas are not compared below)
        if "key_value" in d or "object_store" in d:
            next(iter(d.values()))["replicas"] = 1
        else:
            d["num_replicas"] = 1
    template_text, secret_names = _auth_parameter(st)
    alphabet = string.ascii_letters + string.digits
    passwords = {u: "".join(pysecrets.choice(alphabet) for _ in range(48)) for u in secret_names}
    (include,) = [ln for ln in infra.busconfig.nats_conf(st.cfg, 1).splitlines()
                  if ln.startswith("include ")]
    servers = []
    for name in ("node", "compose"):
        store = tmp_path / name
        store.mkdir()
        (store / naming.BUS_AUTH_FILE_NAME).write_text(infra.bus_auth.render(template_text, passwords))
        servers.append(NatsServer(store_dir=store, port=free_port(), log_file=tmp_path / f"{name}.log",
                                  extra_blocks=(include + "\n",)).start())
    node, compose = servers
    stage = st.cfg.serves
    control = naming.BUS_CONTROL_USER
    keys = ("subjects", "retention", "max_age", "max_bytes", "deny_delete", "deny_purge", "allow_direct",
            "duplicate_window")

    async def streams(url: str) -> dict[str, dict]:
        nc = await nats.connect(url, user=control, password=passwords[control], allow_reconnect=False,
                                inbox_prefix=naming.inbox_prefix(control))
        try:
            return {i.config.name: {k: getattr(i.config, k) for k in keys}
                    for i in await nc.jetstream().streams_info()}
        finally:
            await nc.close()

    async def check() -> None:
        bus_streams = _load_bus_streams()
        await bus_streams.apply(defs, {"user": control, "password": passwords[control]},
                                time.monotonic() + 30, node.url)
        await bus_streams.apply(defs, {"user": control, "password": passwords[control]},
                                time.monotonic() + 30, node.url)  # every boot applies them again: idempotent
        await busauth.set_up(compose.url, stage, BusCredentials(control, passwords[control]))
        made, expected = await streams(node.url), await streams(compose.url)
        assert sorted(made) == sorted(expected)
        assert {naming.events_stream(stage), naming.logs_stream(stage), naming.dead_letter_stream(stage),
                f"KV_{naming.secrets_bucket(stage)}", f"OBJ_{naming.objects_bucket(stage)}"} <= set(made)
        assert made == expected
        # what failed before: a service connects to the node's bus (its streams only checked)
        bus = await Bus.connect(node.url, stage, source="/tests/optimizer", max_reconnect_attempts=0,
                                credentials=BusCredentials("optimizer", passwords["optimizer"]))
        await bus.close()

    try:
        asyncio.run(check())
    finally:
        for server in servers:
            server.stop()
            kill_processes_using(server.url)


# ---------------------------------------------------------------- DR's authenticated leaf node connection

def test_a_bus_user_named_as_the_leaf_user_is_refused():
    infra = load_infra()
    users = infra.busconfig.bus_users(infra.config.load().stage("beta"))
    import dataclasses

    clash = [*users, dataclasses.replace(users[0], name=naming.BUS_LEAF_USER)]
    with pytest.raises(ValueError, match="may not be named 'leaf'"):
        infra.busconfig.refuse_leaf_user(clash)
    assert infra.busconfig.refuse_leaf_user(users) == users


def test_prod_admits_its_mirrors_leaf_user_only_and_dr_fills_its_remote_from_prods_replica(dep):
    infra = load_infra()
    prod, dr = dep.stages["prod"], dep.stages["dr_use1"]
    leaf = naming.BUS_LEAF_USER
    prod_template, prod_secrets = _auth_parameter(prod)
    listener = prod_template.split("leafnodes {")[1]
    assert "  listen: 0.0.0.0:7422\n" in listener
    assert f'  authorization {{\n    user: "{leaf}"\n    password: "{infra.bus_auth.placeholder(leaf)}"\n  }}' in listener
    assert "permissions" not in listener and "remotes" not in listener  # nats-server takes none there
    assert prod_secrets[leaf] == naming.bus_user_secret("prod", leaf)
    dr_template, dr_secrets = _auth_parameter(dr)
    assert "listen" not in dr_template.split("leafnodes {")[1]  # nothing leafs into the mirror
    assert infra.bus_auth.url_slots(dr_template) == [leaf] * 3 and leaf not in infra.bus_auth.slots(dr_template)
    assert dr_secrets[leaf] == naming.bus_user_secret("prod", leaf)  # read in us-east-1: the replica
    assert f"bus-auth.py {dr.cfg.region} " in "".join(
        _strings(next(iter(resources(dr.bus, "AWS::EC2::Instance").values()))["Properties"]["UserData"]))
    # a DR node that cannot read the leaf password writes no block (its remote would be refused)
    passwords = {u: "p" + u for u in dr_secrets}
    filled = infra.bus_auth.render(dr_template, passwords)
    assert f'"nats-leaf://{leaf}:p{leaf}@{naming.bus_node_host("prod", 1)}:7422"' in filled
    del passwords[leaf]
    with pytest.raises(ValueError, match="no password for \\['leaf'\\]"):
        infra.bus_auth.render(dr_template, passwords)
    # a password that is not a URL's letters and digits is quoted in it
    odd = infra.bus_auth.render(dr_template, {**passwords, leaf: "a/b@c:d%"})
    assert f"nats-leaf://{leaf}:a%2Fb%40c%3Ad%25@" in odd
    # stages that neither mirror nor are mirrored have neither the block nor the secret
    beta_template, beta_secrets = _auth_parameter(dep.stages["beta"])
    assert "leafnodes" not in beta_template and leaf not in beta_secrets


def test_the_mirror_connects_to_its_source_as_the_leaf_user_and_a_wrong_password_is_refused(tmp_path):
    """Both sides as their nodes fill them (the synthesized templates, passwords as Secrets
    Manager draws them), on loopback ports: prod's listener admits DR's remote with the leaf
    user's password, refuses it with another, and the leaf user is no client of prod's bus."""
    import asyncio
    import secrets as pysecrets
    import string
    import time
    import urllib.request

    import nats
    from nats_fixtures import kill_processes_using

    from skypurza.events.natsserver import NatsServer, free_port, port_open

    infra = load_infra()
    cfgs = infra.config.load()
    leaf = naming.BUS_LEAF_USER
    alphabet = string.ascii_letters + string.digits

    def draw() -> str:
        return "".join(pysecrets.choice(alphabet) for _ in range(48))

    leaf_port, hub_http = free_port(), free_port()
    prod_template, prod_secrets = infra.bus_auth.decode(
        infra.busconfig.auth_parameter_value(cfgs.stage("prod"), leaf_listen=True))
    dr_template, dr_secrets = infra.bus_auth.decode(
        infra.busconfig.auth_parameter_value(cfgs.stage("dr_use1"), leaf_listen=False))
    prod_passwords = {u: draw() for u in prod_secrets}
    prod_block = infra.bus_auth.render(prod_template, prod_passwords)
    assert prod_block.count(f"0.0.0.0:{infra.busconfig.LEAF_PORT}") == 1
    prod_block = prod_block.replace(f"0.0.0.0:{infra.busconfig.LEAF_PORT}", f"127.0.0.1:{leaf_port}")

    def dr_block(leaf_password: str) -> str:
        text = infra.bus_auth.render(dr_template, {**{u: draw() for u in dr_secrets}, leaf: leaf_password})
        for n in (1, 2, 3):  # node 1 is the hub; 2 and 3 are down (nothing listens on 127.0.0.2, .3)
            host = f"@{naming.bus_node_host('prod', n)}:{infra.busconfig.LEAF_PORT}"
            assert text.count(host) == 1
            text = text.replace(host, f"@127.0.0.{n}:{leaf_port}")
        return text

    (include,) = [ln for ln in infra.busconfig.nats_conf(cfgs.stage("prod"), 1).splitlines()
                  if ln.startswith("include ")]

    def start(name: str, block: str, **kw) -> NatsServer:
        store = tmp_path / name
        store.mkdir()
        (store / naming.BUS_AUTH_FILE_NAME).write_text(block)
        return NatsServer(store_dir=store, port=free_port(), log_file=tmp_path / f"{name}.log",
                          extra_blocks=(include + "\n",), **kw).start()

    def leafs() -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{hub_http}/leafz", timeout=2) as r:
            return int(json.loads(r.read())["leafnodes"])

    def wait_for(check, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if check():
                return True
            time.sleep(0.2)
        return False

    servers: list[NatsServer] = []
    try:
        hub = start("prod", prod_block, http_port=hub_http)
        servers.append(hub)
        assert wait_for(lambda: port_open(leaf_port), 10)  # its leaf listener, on the rewritten port
        # a wrong password: refused (the hub says why), and no leaf shows within the remote's retries
        wrong = start("dr-wrong", dr_block(draw()))
        servers.append(wrong)
        hub_log = tmp_path / "prod.log"
        assert wait_for(lambda: re.search(r"(?i)authoriz|authentic", hub_log.read_text()), 15), hub_log.read_text()
        assert leafs() == 0
        wrong.stop()
        # the leaf user's password: connected
        right = start("dr", dr_block(prod_passwords[leaf]))
        servers.append(right)
        assert wait_for(lambda: leafs() == 1, 15), hub_log.read_text()[-2000:]

        async def leaf_is_no_client() -> None:
            with pytest.raises(Exception, match="(?i)authorization"):
                await nats.connect(hub.url, user=leaf, password=prod_passwords[leaf], connect_timeout=2,
                                   max_reconnect_attempts=0, allow_reconnect=False)

        asyncio.run(leaf_is_no_client())
        for log in tmp_path.glob("*.log"):  # nats-server redacts the URLs' passwords: none in the journal
            assert prod_passwords[leaf] not in log.read_text(), log.name
    finally:
        for server in servers:
            server.stop()
            kill_processes_using(server.url)
