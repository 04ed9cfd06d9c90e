"""Placement on Kubernetes contexts (pure): what the optimizer offers from each context's free
capacity, how it ranks against AWS, and how a failed context is left out of the next try."""

from __future__ import annotations

import pytest

from skypurza.events.k8s_capacity import ContextCapacity, NodeFree
from skypurza.events.taskspec.request import ResourceRequest as R
from skypurza.services.optimizer import decide
from skypurza.services.optimizer.catalog import load_catalog
from skypurza.services.optimizer.placement import block_for_error, place


@pytest.fixture(scope="module")
def cat():
    return load_catalog(use_cache=False)


def ctx(name: str, gpus: int = 8, gpu: str = "H100", cpus: float = 64, **kw) -> ContextCapacity:
    node = NodeFree(name=f"{name}-0", cpus=cpus, memory_gib=512, gpus=gpus, gpu=gpu if gpus else None,
                    gpu_label=("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3") if gpus else None)
    return ContextCapacity(name, (node,), **kw)


def test_a_context_with_room_ranks_first_at_zero_dollars(cat) -> None:
    plan = place([R(accelerator="H100", accelerator_count=8)], 1, cat, enabled_infras=("aws", "kubernetes"),
                 kubernetes=(ctx("a"),))
    first = plan.chosen
    assert (first.infra, first.region, first.instance_type) == ("kubernetes", "a", "2CPU--4GB--H100:8")
    assert first.hourly_price_micros == 0 and first.accelerators == {"H100": 8.0}
    assert any(c.infra == "aws" for c in plan.candidates)  # the cloud stays behind it to fail over to


def test_a_configured_price_ranks_it(cat) -> None:
    pricey = ctx("a", gpu_hourly_usd=1000.0)
    plan = place([R(accelerator="H100", accelerator_count=8)], 1, cat, enabled_infras=("aws", "kubernetes"),
                 kubernetes=(pricey,))
    assert plan.chosen.infra == "aws"
    k8s = next(c for c in plan.candidates if c.infra == "kubernetes")
    assert k8s.hourly_price_micros == 8000 * 1_000_000


def test_k8s_slash_context_restricts_and_too_little_room_says_why(cat) -> None:
    both = (ctx("a", gpus=2), ctx("b"))
    plan = place([R(cloud="kubernetes", region="b", accelerator="H100", accelerator_count=4)], 2, cat,
                 enabled_infras=("kubernetes",), kubernetes=both)
    assert [(c.region, c.num_nodes) for c in plan.candidates] == [("b", 2)]
    none = place([R(cloud="k8s", accelerator="H100", accelerator_count=4)], 3, cat, enabled_infras=("kubernetes",),
                 kubernetes=both)
    assert not none.feasible and "a: no room for 3 x 2CPU--4GB--H100:4" in none.reason
    unknown = place([R(cloud="k8s", region="zz")], 1, cat, enabled_infras=("kubernetes",), kubernetes=both)
    assert "context 'zz' is not enabled (enabled: a, b)" in unknown.reason
    nothing = place([R(cloud="k8s")], 1, cat, enabled_infras=("kubernetes",))
    assert "no context is enabled" in nothing.reason
    spot = place([R(cloud="k8s", use_spot=True)], 1, cat, enabled_infras=("kubernetes",), kubernetes=both)
    assert "no instance types, spot market" in spot.reason
    down = place([R(cloud="k8s")], 1, cat, enabled_infras=("kubernetes",),
                 kubernetes=(ContextCapacity("a", (), reachable=False, error="[Errno 111] Connection refused"),))
    assert "a: not reachable ([Errno 111] Connection refused)" in down.reason


def test_a_capacity_error_in_one_context_moves_to_the_next(cat) -> None:
    from skypurza.events.models import CapacityError, TaskSubmitted

    world = decide.World(cat, frozenset({"kubernetes"}), None, kubernetes=(ctx("a"), ctx("b")))
    sub = TaskSubmitted(task_id="t", cluster="c", num_nodes=1, user="u",
                        task={"run": "x", "resources": {"infra": "k8s", "accelerators": "H100:1"}})
    first = decide.first_placement(sub, world)
    assert first.candidate.region == "a"
    err = CapacityError(task_id="t", cluster="c", placement_id="p1", attempt=1, candidate=first.candidate,
                        error_class="capacity", code="FailedScheduling", message="Insufficient nvidia.com/gpu")
    second = decide.after_capacity_error(sub, [err], world)
    assert second.candidate.region == "b" and second.attempt == 2
    assert block_for_error(decide.from_event_candidate(first.candidate), "capacity").scope == "region"
    err2 = err.model_copy(update={"attempt": 2, "candidate": second.candidate, "placement_id": "p2"})
    assert decide.after_capacity_error(sub, [err, err2], world).EVENT_NAME == "placement_failed"


def test_kubernetes_is_enabled_by_a_kubeconfig_and_keeps_local_out() -> None:
    assert decide.enabled_infras(None, False, kubernetes_configured=True) == frozenset({"kubernetes"})
    assert decide.enabled_infras(None, True, kubernetes_configured=True) == frozenset({"aws", "kubernetes"})
    assert decide.enabled_infras(None, False) == frozenset({"local"})


# ---------------------------------------------------------------------- kubernetes.placement


def test_placement_before_or_after_the_cloud_wins_over_price(cat) -> None:
    pricey = ctx("a", gpu_hourly_usd=1000.0, placement="before_cloud")  # dearer than any AWS H100
    plan = place([R(accelerator="H100", accelerator_count=8)], 1, cat, enabled_infras=("aws", "kubernetes"),
                 kubernetes=(pricey,))
    assert plan.chosen.infra == "kubernetes" and all(c.infra == "aws" for c in plan.candidates[1:])
    free_but_last = ctx("a", placement="after_cloud")  # $0, cheaper than everything
    plan = place([R(accelerator="H100", accelerator_count=8)], 1, cat, enabled_infras=("aws", "kubernetes"),
                 kubernetes=(free_but_last,))
    infras = [c.infra for c in plan.candidates]
    assert infras[-1] == "kubernetes" and set(infras[:-1]) == {"aws"} and len(infras) > 1
    by_price = place([R(accelerator="H100", accelerator_count=8)], 1, cat, enabled_infras=("aws", "kubernetes"),
                     kubernetes=(ctx("a", placement="by_price"),))
    assert by_price.chosen.infra == "kubernetes"  # today's behaviour: $0 ranks first


def test_an_ordered_list_still_wins_over_the_placement_setting(cat) -> None:
    reqs = [R(cloud="aws", accelerator="H100", accelerator_count=8, order=0),
            R(cloud="kubernetes", accelerator="H100", accelerator_count=8, order=1)]
    plan = place(reqs, 1, cat, enabled_infras=("aws", "kubernetes"), kubernetes=(ctx("a", placement="before_cloud"),))
    assert plan.chosen.infra == "aws" and plan.candidates[-1].infra == "kubernetes"


def test_after_cloud_fails_over_to_kubernetes_once_the_cloud_is_blocked(cat) -> None:
    from skypurza.events.models import CapacityError, TaskSubmitted

    world = decide.World(cat, frozenset({"aws", "kubernetes"}), None, max_attempts=3,
                         kubernetes=(ctx("a", placement="after_cloud"),))
    sub = TaskSubmitted(task_id="t", cluster="c", num_nodes=1, user="u",
                        task={"run": "x", "resources": {"accelerators": "H100:8"}})
    first = decide.first_placement(sub, world)
    assert first.candidate.infra == "aws"
    # AWS refuses the whole infra (a quota, say): the next try is the context behind the cloud.
    err = CapacityError(task_id="t", cluster="c", placement_id="p1", attempt=1, candidate=first.candidate,
                        error_class="auth", code="AuthFailure", message="not authorized")
    second = decide.after_capacity_error(sub, [err], world)
    assert (second.candidate.infra, second.candidate.region) == ("kubernetes", "a")


def test_the_placement_setting_is_read_and_checked_at_the_edge(tmp_path, monkeypatch) -> None:
    from skypurza.events.k8s_config import KubernetesSettings, read_all_capacity
    from skypurza.events.settings import SettingsError

    assert KubernetesSettings.load(env={}, config={}).placement == "by_price"
    assert KubernetesSettings.load(env={"SKYPURZA_K8S_PLACEMENT": "After_Cloud"}, config={}).placement == "after_cloud"
    with pytest.raises(SettingsError, match=r"^SKYPURZA_K8S_PLACEMENT='first': expected one of by_price, "
                                            r"before_cloud, after_cloud$"):
        KubernetesSettings.load(env={"SKYPURZA_K8S_PLACEMENT": "first"}, config={})
    # From the file: the error points at the value's line and column, to fix it in an editor.
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("stage: dev\nkubernetes:\n  namespace: ml\n  placement: [before_cloud]\n")
    monkeypatch.setenv("SKYPURZA_HOME", str(home))
    with pytest.raises(SettingsError) as info:
        KubernetesSettings.load(env={})
    assert str(info.value) == (f"{home / 'config.yaml'}:4:14: kubernetes.placement=['before_cloud']: "
                               "expected one of by_price, before_cloud, after_cloud")
    # Every context read carries it to the optimizer (an unreachable one as well).
    (home / "config.yaml").write_text("kubernetes:\n  placement: before_cloud\n")
    (tmp_path / "kubeconfig").write_text("contexts: [{name: x, context: {cluster: x, user: u}}]\ncurrent-context: x\n"
                                         "clusters: [{name: x, cluster: {server: 'http://127.0.0.1:9'}}]\n"
                                         "users: [{name: u, user: {token: t}}]\n")
    settings = KubernetesSettings.load(env={"SKYPURZA_KUBECONFIG": str(tmp_path / "kubeconfig")})
    (cap,) = read_all_capacity(settings)
    assert settings.placement == "before_cloud" and cap.placement == "before_cloud" and not cap.reachable
