"""What a task means: resource expansion, env substitution, pipelines, overrides, secrets."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from skypurza.events.taskspec import (
    CliOverrides,
    ResourceRequest,
    Task,
    TaskSpecError,
    apply_overrides,
    is_yaml_entrypoint,
    load_tasks,
    task_from_command,
)
from skypurza.events.taskspec.overrides import parse_var_flags
from skypurza.events.taskspec.values import Autostop

CORPUS = Path(__file__).parent / "taskspec_corpus"


def one(text: str, **kw: object) -> Task:
    loaded = load_tasks(textwrap.dedent(text), **kw)  # type: ignore[arg-type]
    assert len(loaded.tasks) == 1
    return loaded.tasks[0]


def requests(text: str) -> list[ResourceRequest]:
    return one(text).resource_requests()


def problems(text: str, **kw: object) -> list[tuple[str, str]]:
    with pytest.raises(TaskSpecError) as info:
        load_tasks(textwrap.dedent(text), **kw)  # type: ignore[arg-type]
    return [(p.path, p.message) for p in info.value.problems]


# ------------------------------------------------------------------------------ expansion

def test_no_resources_is_one_open_request() -> None:
    assert requests("run: echo\n") == [ResourceRequest()]


@pytest.mark.parametrize(("written", "name", "count"), [
    ("A100:8", "A100", 8),
    ("A100", "A100", 1),
    ("a100-80gb:2", "A100-80GB", 2),
    ("T4:0.5", "T4", 0.5),
    ("{H100: 8}", "H100", 8),
    ("{h100: null}", "H100", 1),
    ("[l40s:4]", "L40S", 4),
    ("Wombat9000:2", "Wombat9000", 2),  # unknown accelerators are valid and kept as written
    ("tpu-v4-8", "tpu-v4-8", 1),
])
def test_one_accelerator_in_every_form(written: str, name: str, count: float) -> None:
    (req,) = requests(f"resources:\n  accelerators: {written}\n")
    assert (req.accelerator, req.accelerator_count, req.order) == (name, count, None)


def test_accelerator_set_is_an_unordered_choice() -> None:
    reqs = requests("resources:\n  accelerators: {A100:8, h100:8, L40S:8}\n")
    assert [(r.accelerator, r.accelerator_count, r.order) for r in reqs] == [
        ("A100", 8, None), ("H100", 8, None), ("L40S", 8, None)]


def test_accelerator_mapping_with_several_keys_is_an_unordered_choice() -> None:
    reqs = requests("resources:\n  accelerators: {A100: 8, V100: 4}\n")
    assert [(r.accelerator, r.accelerator_count, r.order) for r in reqs] == [("A100", 8, None), ("V100", 4, None)]


def test_accelerator_list_is_an_order_of_preference() -> None:
    reqs = requests("resources:\n  accelerators: [H100:8, A100-80GB:8, A100:8]\n")
    assert [(r.accelerator, r.order) for r in reqs] == [("H100", 0), ("A100-80GB", 1), ("A100", 2)]


def test_gpus_is_an_alias_of_accelerators() -> None:
    assert requests("resources:\n  gpus: L4:1\n") == requests("resources:\n  accelerators: L4:1\n")


def test_any_of_merges_entries_over_the_base_and_ranks_by_price() -> None:
    reqs = one((CORPUS / "valid" / "39_any_of.yaml").read_text()).resource_requests()
    assert [(r.cloud, r.region, r.use_spot, r.accelerator, r.order, r.labels) for r in reqs] == [
        ("aws", "us-east-1", False, "A100", None, {"team": "ml"}),
        ("aws", "us-west-2", True, "A100", None, {"team": "ml", "tier": "spot"}),
    ]


def test_any_of_over_an_accelerator_set_gives_every_combination() -> None:
    reqs = one((CORPUS / "valid" / "41_any_of_with_accelerator_set.yaml").read_text()).resource_requests()
    assert sorted((r.accelerator, r.use_spot, r.order) for r in reqs) == [
        ("A100", False, None), ("A100", True, None), ("H100", False, None), ("H100", True, None)]


def test_ordered_entries_keep_their_index() -> None:
    reqs = one((CORPUS / "valid" / "40_ordered.yaml").read_text()).resource_requests()
    assert [(r.cloud, r.accelerator, r.accelerator_count, r.use_spot, r.order) for r in reqs] == [
        ("aws", "H100", 8, False, 0), ("aws", "A100-80GB", 8, False, 1), ("aws", "A100", 8, True, 2)]


def test_an_entrys_gpus_replaces_the_base_accelerators() -> None:
    reqs = requests("""
        resources:
          accelerators: A100:8
          any_of:
            - gpus: H100:8
            - infra: aws
    """)
    assert sorted((r.accelerator, r.cloud or "") for r in reqs) == [("A100", "aws"), ("H100", "")]


@pytest.mark.parametrize(("infra", "where"), [
    ("aws", ("aws", None, None)),
    ("AWS/us-east-1", ("aws", "us-east-1", None)),
    ("aws/us-east-1/us-east-1a", ("aws", "us-east-1", "us-east-1a")),
    ("aws/*/use1-az4", ("aws", None, "use1-az4")),
    ("'*'", (None, None, None)),
    ("'*/us-west-2'", (None, "us-west-2", None)),
    ("'*/*/use1-az4'", (None, None, "use1-az4")),
    ("k8s", ("kubernetes", None, None)),
    ("kubernetes", ("kubernetes", None, None)),
    ("k8s/my-context", ("kubernetes", "my-context", None)),
    ("k8s/arn:aws:eks:us-east-1:1:cluster/c", ("kubernetes", "arn:aws:eks:us-east-1:1:cluster/c", None)),
    ("ssh/my-pool", ("ssh", "my-pool", None)),
    ("gcp/us-central1", ("gcp", "us-central1", None)),
    ("slurm/cluster/partition", ("slurm", "cluster", "partition")),
    ("local", ("local", None, None)),
])
def test_infra_in_every_form(infra: str, where: tuple[str | None, str | None, str | None]) -> None:
    """The infra forms listed in the task-YAML issue, and a few more."""
    (req,) = requests(f"resources:\n  infra: {infra}\n")
    assert (req.cloud, req.region, req.zone) == where


def test_legacy_cloud_region_zone_mean_the_same_as_infra_and_warn() -> None:
    loaded = load_tasks("resources:\n  cloud: AWS\n  region: us-west-2\n  zone: us-west-2b\n")
    (req,) = loaded.tasks[0].resource_requests()
    assert (req.cloud, req.region, req.zone) == ("aws", "us-west-2", "us-west-2b")
    (warning,) = loaded.warnings
    assert (warning.line, warning.path) == (2, "resources.cloud")
    assert "infra: aws/us-west-2/us-west-2b" in warning.message


@pytest.mark.parametrize(("cpus", "value", "plus"), [("4", 4, False), ("4+", 4, True), ("0.5", 0.5, False), ("'8+'", 8, True)])
def test_cpus(cpus: str, value: float, plus: bool) -> None:
    (req,) = requests(f"resources:\n  cpus: {cpus}\n")
    assert (req.cpus, req.cpus_plus) == (value, plus)


@pytest.mark.parametrize(("memory", "gib", "plus", "ratio"), [
    ("16", 16, False, None), ("16+", 16, True, None), ("16GB", 16, False, None), ("32GB+", 32, True, None),
    ("1TB", 1024, False, None), ("512MB", 0.5, False, None), ("64Gi+", 64, True, None), ("4x", None, False, 4),
    ("2x+", None, True, 2),
])
def test_memory(memory: str, gib: float | None, plus: bool, ratio: float | None) -> None:
    (req,) = requests(f"resources:\n  memory: {memory}\n")
    assert (req.memory_gib, req.memory_plus, req.memory_ratio) == (gib, plus, ratio)


@pytest.mark.parametrize(("size", "gb"), [("256", 256), ("1TB", 1024), ("512Gi", 512), ("100gb", 100), ("2048MB", 2)])
def test_disk_size_units(size: str, gb: int) -> None:
    (req,) = requests(f"resources:\n  disk_size: {size}\n")
    assert req.disk_size_gb == gb


def test_every_interpreted_resource_key() -> None:
    (req,) = one((CORPUS / "valid" / "62_every_resource_key.yaml").read_text()).resource_requests()
    assert req == ResourceRequest(
        cloud="aws", region="us-east-1", accelerator="H100", accelerator_count=8, cpus=96, cpus_plus=True,
        memory_gib=1024, memory_plus=True, instance_type="p5.48xlarge", use_spot=False, disk_size_gb=2048,
        disk_tier="best", network_tier="best", image_id="skypilot:gpu-ubuntu-2204", max_hourly_cost=120.0,
        ports=("8000-8100",), labels={"owner": "alice"}, order=None, extra=req.extra)
    assert req.extra == {
        "job_recovery": "none", "local_disk": "ssd:500", "priority": -5, "priority_class": "high",
        "autostop": {"idle_minutes": 0, "down": False, "wait_for": "none", "hook_timeout": 60}}


def test_ports_image_ids_and_recovery_are_carried() -> None:
    (req,) = requests("""
        resources:
          ports: [8080, "9000-9010"]
          image_id: {us-east-1: ami-1, us-west-2: ami-2}
          job_recovery: {strategy: FAILOVER, max_restarts_on_errors: 2}
    """)
    assert req.ports == ("8080", "9000-9010")
    assert req.image_id == {"us-east-1": "ami-1", "us-west-2": "ami-2"}
    assert req.extra["job_recovery"] == {"strategy": "FAILOVER", "max_restarts_on_errors": 2}


@pytest.mark.parametrize(("written", "normalised"), [
    ("true", Autostop(True, 5)), ("false", Autostop(False, 5)), ("10", Autostop(True, 10)),
    ("2h", Autostop(True, 120)), ("1d", Autostop(True, 1440)), ("30M", Autostop(True, 30)),
    ("{idle_minutes: 7, down: true, wait_for: JOBS}", Autostop(True, 7, True, "jobs")),
])
def test_autostop_forms(written: str, normalised: Autostop) -> None:
    assert one(f"resources:\n  autostop: {written}\n").autostop() == normalised


# ----------------------------------------------------------------------- envs and secrets

def test_env_values_are_strings_as_skypilot_makes_them() -> None:
    task = one((CORPUS / "valid" / "45_envs_secrets.yaml").read_text())
    assert task.envs == {"MODEL": "llama-3-8b", "EPOCHS": "3", "DEBUG": "True", "LR": "0.00015", "EMPTY": ""}


def test_variables_are_filled_in_file_mounts_service_workdir_volumes_but_not_run() -> None:
    task = one("""
        envs: {BUCKET: data, SIZE: 8, MODEL: llama}
        secrets: {TOKEN: s3cr3t-value}
        workdir: ~/src/${MODEL}
        file_mounts:
          /ckpt/${SIZE}b: s3://${BUCKET}/weights-$SIZE
          /store:
            name: ${BUCKET}-out
            source: ~/out-${TOKEN}
          /home: $HOME/unknown-stays
        service:
          readiness_probe:
            path: /v1
            post_data:
              model: $MODEL
        volumes:
          /mnt/vol: vol-${MODEL}
        setup: echo $MODEL ${SIZE}
        run: echo $MODEL ${SIZE}
    """)
    assert task.workdir == "~/src/llama"
    assert task.file_mounts is not None
    assert task.file_mounts["/ckpt/8b"] == "s3://data/weights-8"
    store = task.file_mounts["/store"]
    assert not isinstance(store, str) and (store.name, store.source) == ("data-out", "~/out-s3cr3t-value")
    assert task.file_mounts["/home"] == "$HOME/unknown-stays"
    assert task.service is not None and not isinstance(task.service.readiness_probe, str)
    assert task.service.readiness_probe is not None and task.service.readiness_probe.post_data == {"model": "llama"}
    assert task.volumes == {"/mnt/vol": "vol-llama"}
    assert task.setup == task.run == "echo $MODEL ${SIZE}"
    # The dump keeps what was written.
    assert task.to_yaml_dict()["file_mounts"]["/ckpt/${SIZE}b"] == "s3://${BUCKET}/weights-$SIZE"


def test_null_env_must_come_from_the_command_line() -> None:
    text = (CORPUS / "invalid" / "i04_null_env.yaml").read_text()
    assert problems(text)[0][0] == "envs.HF_TOKEN"
    task = one(text, env_overrides={"HF_TOKEN": "abc"})
    assert task.envs == {"HF_TOKEN": "abc", "MODEL": "llama"}


def test_env_overrides_replace_and_add_and_feed_substitution() -> None:
    text = "envs: {BUCKET: a}\nfile_mounts:\n  /d: s3://${BUCKET}\n"
    task = one(text, env_overrides={"BUCKET": "b", "NEW": "1"})
    assert task.envs == {"BUCKET": "b", "NEW": "1"}
    assert task.file_mounts == {"/d": "s3://b"}


def test_secret_overrides_turn_a_name_list_into_values() -> None:
    task = one("secrets: [HF_TOKEN]\nrun: echo\n", secret_overrides={"HF_TOKEN": "hf_x"})
    assert task.secret_values() == {"HF_TOKEN": "hf_x"}


def test_public_dict_holds_no_secret_value_and_round_trips() -> None:
    secret = "hf_super_secret_value_123"
    task = one(f"""
        envs: {{BUCKET: data}}
        secrets: {{HF_TOKEN: {secret}, OTHER: null}}
        file_mounts:
          /d: s3://${{BUCKET}}/${{HF_TOKEN}}
        run: "curl -H 'Authorization: {secret}' example.invalid"
    """)
    assert task.secret_values() == {"HF_TOKEN": secret}
    public = task.public_dict()
    assert secret not in json.dumps(public)
    assert public["secrets"] == {"HF_TOKEN": None, "OTHER": None}
    assert public["file_mounts"] == {"/d": "s3://${BUCKET}/${HF_TOKEN}"}
    assert public["run"] == "curl -H 'Authorization: ${HF_TOKEN}' example.invalid"
    back = Task.from_public_dict(public, task.secret_values())
    assert back.file_mounts == task.file_mounts and back.secret_values() == task.secret_values()
    assert back.secrets == task.secrets


def test_public_dict_plus_secrets_validates_back_to_the_same_task() -> None:
    task = one((CORPUS / "valid" / "47_file_mounts.yaml").read_text(), secret_overrides={"API_KEY": "k-123456"})
    public = task.public_dict()
    assert "k-123456" not in json.dumps(public)
    assert Task.model_validate({**public, "secrets": task.secret_values()}) == task


# ------------------------------------------------------------------ pipelines, job groups

def test_pipeline_with_header() -> None:
    loaded = load_tasks(CORPUS / "valid" / "53_pipeline_with_header.yaml")
    assert loaded.name == "train-eval" and loaded.is_pipeline and not loaded.is_job_group
    assert [t.name for t in loaded.tasks] == ["train", "eval"]


def test_pipeline_without_header_has_no_name() -> None:
    loaded = load_tasks(CORPUS / "valid" / "54_pipeline_without_header.yaml")
    assert loaded.name is None and [t.name for t in loaded.tasks] == ["prepare", "train"]


def test_job_group() -> None:
    loaded = load_tasks(CORPUS / "valid" / "55_job_group.yaml")
    assert loaded.is_job_group and loaded.name == "rl-group"
    assert loaded.header["primary_tasks"] == ["trainer"]
    assert [t.name for t in loaded.tasks] == ["trainer", "rollout"]


def test_header_only_and_empty_files_are_one_task() -> None:
    assert [t.name for t in load_tasks("name: solo\n").tasks] == ["solo"]
    assert load_tasks("").tasks == [Task()]
    assert [t.run for t in load_tasks("---\n---\nrun: echo\n---\n").tasks] == ["echo"]


def test_problems_in_a_pipeline_name_their_document() -> None:
    with pytest.raises(TaskSpecError) as info:
        load_tasks("name: p\n---\nrun: echo\n---\nrun: [x]\nnum_nodes: 0\n")
    assert [(p.document, p.line, p.path) for p in info.value.problems] == [(2, 5, "run"), (2, 6, "num_nodes")]


def test_job_group_primary_task_must_exist() -> None:
    msgs = problems("name: g\nexecution: parallel\nprimary_tasks: [nope]\n---\nname: a\nrun: echo\n")
    assert msgs == [("primary_tasks.0", "primary task 'nope' is not the name of a job in this group")]


# -------------------------------------------------------------------- validation behaviour

def test_unknown_gpu_and_cloud_are_valid_with_a_hint() -> None:
    loaded = load_tasks("resources:\n  infra: azure\n  accelerators: A10O:8\n")
    (warning,) = loaded.warnings
    assert warning.path == "resources.accelerators" and "Did you mean 'A10'" in warning.message


def test_a_path_string_is_read_as_a_file(tmp_path: Path) -> None:
    path = tmp_path / "task.txt"
    path.write_text("run: echo from-file\n")
    assert load_tasks(str(path)).tasks[0].run == "echo from-file"
    assert load_tasks("run: echo inline").tasks[0].run == "echo inline"


def test_file_errors_are_problems_not_tracebacks(tmp_path: Path) -> None:
    with pytest.raises(TaskSpecError) as info:
        load_tasks(tmp_path / "missing.yaml")
    assert info.value.problems[0].message == "file not found"
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00run")
    with pytest.raises(TaskSpecError):
        load_tasks(binary)


def test_recursive_alias_is_refused() -> None:
    assert problems("resources: &r\n  labels: *r\n") == [("", "recursive YAML alias: a node may not contain itself")]


def test_yaml_tags_and_dates_are_reported_in_words() -> None:
    assert problems("name: 2024-01-01\n") == [
        ("name", "expected a string, found a date (2024-01-01); quote it to make it a string")]
    assert problems("run: !!binary aGk=\n") == [("run", "expected a string, found binary data")]


# ------------------------------------------------------------------------------ overrides

def test_resource_overrides_apply_to_every_alternative() -> None:
    task = one((CORPUS / "valid" / "39_any_of.yaml").read_text())
    new = apply_overrides(task, CliOverrides(infra="aws/eu-west-1", gpus="H100:8", use_spot=True, cpus="8+",
                                             memory="64+", disk_size=500, instance_type="p5.48xlarge"))
    reqs = new.resource_requests()
    assert {(r.cloud, r.region, r.accelerator, r.use_spot, r.cpus, r.memory_gib, r.disk_size_gb, r.instance_type)
            for r in reqs} == {("aws", "eu-west-1", "H100", True, 8, 64, 500, "p5.48xlarge")}
    assert task.resource_requests()[0].accelerator == "A100"  # the original is untouched


def test_infra_override_replaces_legacy_location_keys() -> None:
    task = one("resources:\n  cloud: gcp\n  region: us-central1\n")
    (req,) = apply_overrides(task, CliOverrides(infra="aws")).resource_requests()
    assert (req.cloud, req.region) == ("aws", None)


def test_none_resets_gpus_instance_type_and_image() -> None:
    task = one("resources:\n  accelerators: [A100:8, H100:8]\n  instance_type: p4d.24xlarge\n  image_id: ami-1\n")
    new = apply_overrides(task, CliOverrides(gpus="none", instance_type="NONE", image_id="none"))
    assert new.resources is not None and new.resources.model_dump(exclude_unset=True) == {}
    assert new.resource_requests() == [ResourceRequest()]


def test_top_level_and_variable_overrides() -> None:
    task = one("name: a\nnum_nodes: 1\nenvs: {B: x}\nfile_mounts:\n  /d: s3://${B}\nrun: echo\n")
    new = apply_overrides(task, CliOverrides(name="b", num_nodes=3, workdir=".", envs={"B": "y"}, secrets={"S": "v"}))
    assert (new.name, new.num_nodes, new.workdir, new.envs, new.secret_values()) == ("b", 3, ".", {"B": "y"}, {"S": "v"})
    assert new.file_mounts == {"/d": "s3://y"}


def test_bad_override_values_name_the_flag() -> None:
    task = one("run: echo\n")
    with pytest.raises(TaskSpecError) as info:
        apply_overrides(task, CliOverrides(gpus="A100:x", infra="nowhere", num_nodes=0))
    assert [(p.file, p.path) for p in info.value.problems] == [
        ("<command line>", "--num-nodes"), ("<command line>", "--infra"), ("<command line>", "--gpus")]


def test_inline_command() -> None:
    task = task_from_command("echo hi", CliOverrides(gpus="T4"))
    assert (task.name, task.run) == ("spz-cmd", "echo hi")
    assert task.resource_requests()[0].accelerator == "T4"
    assert is_yaml_entrypoint("task.yaml") and is_yaml_entrypoint("dir/TASK.YML")
    assert not is_yaml_entrypoint("echo hi") and not is_yaml_entrypoint("python x.py")


def test_var_flags_as_sky_launch_reads_them() -> None:
    assert parse_var_flags(["A=1", "B=x=y", "HOME"], {"HOME": "/root"}) == {"A": "1", "B": "x=y", "HOME": "/root"}
    with pytest.raises(TaskSpecError) as info:
        parse_var_flags(["MISSING", "=v"], {})
    assert [p.path for p in info.value.problems] == ["--env", "--env"]
