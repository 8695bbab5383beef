"""deploy/: Kubernetes manifests, Dockerfile, Prometheus and Grafana files.

No cluster and no Docker engine run here, so the files are checked offline:
Kubernetes objects against the API's own schemas (kubernetes-validate,
strict), Prometheus Operator objects against a schema of the CRD fields we
use (kubernetes-validate has no CRD schemas), the Dockerfile with hadolint and
by its instructions, the Prometheus config with promtool, and every piece
that must agree with the gateway's config (ports, probes, drain budget).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.app.configure import parse_config
from gateway.config.model import GatewayConfig
from gateway.config.node import ConfigError
from gateway.config.reader import load_yaml
from gateway.observability.metrics import GatewayMetrics
from peers.prometheus import promtool
from support import REPO

DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
# Native sidecars are on by default from 1.29, the preStop sleep action from 1.30.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())
# Seconds for the supervisor and workers to exit after the drain timeout.
EXIT_MARGIN = 5

_LABEL_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    "matchExpressions": {"type": "array"}}}
_ENDPOINT_FIELDS = {
    "port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"},
    "scheme": {"enum": ["http", "https"]}, "interval": {"type": "string", "pattern": r"^\d+(ms|s|m|h)$"},
    "scrapeTimeout": {"type": "string", "pattern": r"^\d+(ms|s|m|h)$"}, "honorLabels": {"type": "boolean"},
    "relabelings": {"type": "array"}, "metricRelabelings": {"type": "array"}, "params": {"type": "object"},
}


def _monitor_schema(kind: str, endpoints_key: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The fields of the Prometheus Operator's monitoring.coreos.com/v1 CRD
    (as documented in its API reference) that these manifests may use."""
    endpoint = {"type": "object", "additionalProperties": False, "required": ["port"],
                "properties": {**_ENDPOINT_FIELDS, **extra}}
    return {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": kind},
            "metadata": {"type": "object", "required": ["name"]},
            "spec": {"type": "object", "required": ["selector", endpoints_key], "additionalProperties": False,
                     "properties": {
                         "selector": _LABEL_SELECTOR, "jobLabel": {"type": "string"},
                         "namespaceSelector": {"type": "object"}, "sampleLimit": {"type": "integer"},
                         "podTargetLabels": {"type": "array"}, "targetLabels": {"type": "array"},
                         endpoints_key: {"type": "array", "minItems": 1, "items": endpoint}}}}}


CRD_SCHEMAS = {
    "PodMonitor": _monitor_schema("PodMonitor", "podMetricsEndpoints", {"portNumber": {"type": "integer"}}),
}


OVERLAYS = ("standalone", "sidecar")
# Files in a kustomization directory that are not resources: the gateway config
# (fed to configMapGenerator) and kustomize's own configuration.
NOT_RESOURCES = {"kustomization.yaml", "kustomizeconfig.yaml", "gateway.yaml"}


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` renders for a kustomization directory."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) is needed to render deploy/kubernetes"
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


_RENDERED: dict[str, list[dict[str, Any]]] = {}


def rendered(overlay: str) -> list[dict[str, Any]]:
    if overlay not in _RENDERED:
        _RENDERED[overlay] = kustomize(KUBERNETES / "overlays" / overlay)
    return copy.deepcopy(_RENDERED[overlay])


def objects(directory: str, kind: str) -> list[dict[str, Any]]:
    return [doc for doc in rendered(directory) if doc["kind"] == kind]


def pod_spec(directory: str) -> dict[str, Any]:
    (deployment,) = objects(directory, "Deployment")
    return deployment["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def gateway_container(directory: str) -> dict[str, Any]:
    spec = pod_spec(directory)
    containers = spec.get("initContainers", []) + spec["containers"]
    return next(c for c in containers if c["name"] == "gateway")


def config_text(documents: list[dict[str, Any]]) -> str:
    """The gateway.yaml a rendered overlay's ConfigMap carries."""
    (config_map,) = [doc for doc in documents if doc["kind"] == "ConfigMap"]
    return config_map["data"]["gateway.yaml"]  # type: ignore[no-any-return]


def parse_overlay_config(documents: list[dict[str, Any]], overlay: str) -> GatewayConfig:
    """What the pods load, read by the gateway's own YAML loader and config
    parser: any problem (an unknown protocol, a misspelt key) is an error."""
    return parse_config(load_yaml(config_text(documents)), f"overlays/{overlay}/gateway.yaml",
                        KUBERNETES / "overlays" / overlay)


def gateway_config(overlay: str) -> GatewayConfig:
    return parse_overlay_config(rendered(overlay), overlay)


def kustomize_edited(overlay: str, tmp_path: Path, old: str, new: str) -> list[dict[str, Any]]:
    """The overlay rendered from a copy whose gateway.yaml has ``old`` replaced by ``new``."""
    copy_of = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, copy_of)
    config = copy_of / "overlays" / overlay / "gateway.yaml"
    assert old in config.read_text()
    config.write_text(config.read_text().replace(old, new))
    return kustomize(copy_of / "overlays" / overlay)


# --- Kubernetes ---------------------------------------------------------------


def test_every_kustomization_lists_its_files() -> None:
    for path in sorted(KUBERNETES.rglob("kustomization.yaml")):
        document = yaml.safe_load(path.read_text())
        files = {p for p in document["resources"] if not p.startswith("..")}
        assert files == {p.name for p in path.parent.glob("*.yaml")} - NOT_RESOURCES, path


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_is_valid(overlay: str) -> None:
    checked = set()
    for document in rendered(overlay):
        kind = document["kind"]
        if kind in CRD_SCHEMAS:
            jsonschema.validate(document, CRD_SCHEMAS[kind])
        else:
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(document, version, strict=True)
        checked.add(kind)
    assert checked >= {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "PodMonitor"}
    if overlay == "standalone":
        assert "HorizontalPodAutoscaler" in checked


def test_validation_catches_mistakes() -> None:
    """The checks above can fail: a misspelt field and a wrong CRD field."""
    deployment = objects("sidecar", "Deployment")[0]
    deployment["spec"]["template"]["spec"]["initContainers"][0]["restartPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
    monitor = objects("standalone", "PodMonitor")[0]
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, CRD_SCHEMAS["PodMonitor"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_config_change_rolls_the_pods(overlay: str, tmp_path: Path) -> None:
    """configMapGenerator names the ConfigMap after a hash of gateway.yaml and
    the Deployment mounts that name: a changed config is a new pod template."""
    def mounted(objects: list[dict[str, Any]]) -> str:
        (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        names = {v["configMap"]["name"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "configMap" in v}
        assert names == {config_map["metadata"]["name"]}
        return config_map["metadata"]["name"]  # type: ignore[no-any-return]

    before = mounted(rendered(overlay))
    after = mounted(kustomize_edited(overlay, tmp_path, "timeout: 25s", "timeout: 20s"))
    assert before != after and before.rsplit("-", 1)[0] == after.rsplit("-", 1)[0]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize(("old", "new", "problem"), [
    ("protocol: v2-grpc", "protocol: v2-grcp", "unknown backend protocol 'v2-grcp'"),
    ("protocol: v2-rest", "protocol: v2-rset", "unknown frontend protocol 'v2-rset'"),
    ("timeout: 25s", "timeuot: 25s", "drain.timeuot: unknown key"),
])
def test_a_mistake_in_an_overlay_config_fails(overlay: str, old: str, new: str, problem: str,
                                              tmp_path: Path) -> None:
    """The rendered config is parsed strictly: a typo fails every test that reads it."""
    with pytest.raises(ConfigError) as info:
        parse_overlay_config(kustomize_edited(overlay, tmp_path, old, new), overlay)
    assert any(problem in line for line in info.value.problems), info.value.problems


def test_sidecar_is_a_native_sidecar_fronting_the_model_server() -> None:
    spec = pod_spec("sidecar")
    (gateway,) = spec["initContainers"]
    assert gateway["restartPolicy"] == "Always"
    config = gateway_config("sidecar")
    model_ports = {p["containerPort"] for c in spec["containers"] for p in c["ports"]}
    assert config.upstreams
    for upstream in config.upstreams:
        assert upstream.endpoints
        for endpoint in upstream.endpoints:  # same pod, over loopback
            assert endpoint.host == "127.0.0.1" and endpoint.port in model_ports
    (service,) = objects("sidecar", "Service")
    gateway_port_names = {p["name"] for p in gateway["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= gateway_port_names
    assert config.admin.address is not None


@pytest.mark.parametrize("directory", ["standalone", "sidecar"])
def test_ports_probes_and_drain_budget_agree_with_the_config(directory: str) -> None:
    config = gateway_config(directory)
    container = gateway_container(directory)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert config.listeners
    for listener in config.listeners:
        assert listener.address.port in ports.values(), listener
    assert config.admin.address is not None and config.admin.address.host == "0.0.0.0"
    admin_port = config.admin.address.port

    def port_of(probe: dict[str, Any]) -> int:
        action = probe.get("httpGet") or probe.get("grpc")
        assert action is not None
        port = action["port"]
        return ports[port] if isinstance(port, str) else int(port)

    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert port_of(container["livenessProbe"]) == port_of(container["readinessProbe"]) == admin_port
    startup = container["startupProbe"]
    if "grpc" in startup:  # the gRPC health service lives on a v2-grpc listener
        grpc_ports = [x.address.port for x in config.listeners if x.protocol == "v2-grpc"]
        assert port_of(startup) in grpc_ports
    pod = pod_spec(directory)
    annotations = objects(directory, "Deployment")[0]["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == admin_port and annotations["prometheus.io/path"] == "/metrics"
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert config.drain.delay > 0  # load balancers lag behind readiness: keep serving meanwhile
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + config.drain.delay + config.drain.timeout + EXIT_MARGIN
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"] and pod["securityContext"]["runAsNonRoot"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts  # writable: the --workers metrics directory lives there


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_admin_port_is_scraped_but_not_exposed(overlay: str) -> None:
    """Prometheus scrapes each pod's admin port (PodMonitor); no Service
    exposes it; the NetworkPolicy admits it from the monitoring namespace
    only and the listener ports from anywhere."""
    config = gateway_config(overlay)
    admin = config.admin.address
    assert admin is not None
    container_ports = {p["name"]: p["containerPort"] for p in gateway_container(overlay)["ports"]}
    (admin_name,) = [name for name, port in container_ports.items() if port == admin.port]
    labels = objects(overlay, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    (monitor,) = objects(overlay, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] == admin_name and endpoint["path"] == "/metrics"
    for service in objects(overlay, "Service"):
        assert service["spec"]["selector"].items() <= labels.items()
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in container_ports and port["targetPort"] != admin_name, service
    (budget,) = objects(overlay, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()

    (policy,) = objects(overlay, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    from_anywhere, restricted = set(), set()
    for rule in policy["spec"]["ingress"]:
        names = {p["port"] for p in rule["ports"]}
        if "from" in rule:
            assert rule["from"] == monitoring
            restricted |= names
        else:
            from_anywhere |= names
    assert restricted == {admin_name} and admin_name not in from_anywhere
    listener_ports = {x.address.port for x in config.listeners}
    assert {container_ports[name] for name in from_anywhere if name in container_ports} == listener_ports


# --- Dockerfile -----------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([hadolint, "--failure-threshold", "info", str(DEPLOY / "Dockerfile")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_is_slim_non_root_exec_form_and_health_checked() -> None:
    instructions = dockerfile_instructions()
    stages = [i for i, (op, _) in enumerate(instructions) if op == "FROM"]
    final = instructions[stages[-1]:]
    ops = [op for op, _ in final]
    args = {op: arg for op, arg in final}
    assert "slim" in dict(instructions)["ARG"]  # the base image
    user = args["USER"].split(":")[0]
    assert user not in ("0", "root") and ops.index("USER") < ops.index("ENTRYPOINT")
    assert json.loads(args["ENTRYPOINT"]) == ["gateway"]  # exec form: PID 1 gets SIGTERM
    assert json.loads(args["CMD"])[0] == "serve"
    health = re.match(r"(--\S+\s+)*CMD\s+(\[.*\])$", args["HEALTHCHECK"])
    assert health and "/healthz" in health.group(2) and json.loads(health.group(2))[0] == "python"
    assert {"8000", "8002"} <= set(args["EXPOSE"].split())
    lines = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert lines[lines.index("*") - 1].startswith("#") or lines[0] == "*"  # everything is ignored first...
    included = [line[1:].rstrip("/") for line in lines if line.startswith("!")]  # ...then these come back
    for op, arg in instructions:  # every file copied from the context exists and is not ignored
        if op == "COPY" and not arg.startswith("--from"):
            for source in arg.split()[:-1]:
                source = source.rstrip("/")
                assert (REPO / source).exists() and not (REPO / source).is_symlink(), source
                assert any(source == p or source.startswith(p + "/") for p in included), source


def test_image_entrypoint_command_is_the_real_cli(tmp_path: Path) -> None:
    """What the image runs (`gateway serve --config <the image's config>`) is
    accepted by the CLI: `gateway check` on the same file."""
    args = dict(dockerfile_instructions())
    config_in_image = json.loads(args["CMD"])[json.loads(args["CMD"]).index("--config") + 1]
    copied = next(a.split() for op, a in dockerfile_instructions() if op == "COPY" and a.endswith(config_in_image))
    result = subprocess.run([sys.executable, "-m", "gateway", "check", "--config", str(REPO / copied[0])],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr


# --- Prometheus and Grafana ------------------------------------------------------


def test_plain_prometheus_scrape_config(tmp_path: Path) -> None:
    """promtool checks the config. Debian's prometheus is built without
    Kubernetes service discovery, so promtool is given the same config with
    each kubernetes_sd_configs swapped for a static target (relabel rules,
    regexes and everything else still checked), and the Kubernetes SD blocks
    are checked here for the fields they use."""
    config = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    sd = jobs["inference-gateway"]["kubernetes_sd_configs"]
    assert sd == [{"role": "pod"}]
    for job in config["scrape_configs"]:
        if "kubernetes_sd_configs" in job:
            del job["kubernetes_sd_configs"]
            job["static_configs"] = [{"targets": ["127.0.0.1:8002"]}]
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(config))
    assert config["rule_files"] == ["alerts.yaml"]  # checked by promtool too, next to the config
    shutil.copy(DEPLOY / "prometheus/alerts.yaml", tmp_path / "alerts.yaml")
    result = promtool("check", "config", str(checked))
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    kept = jobs["inference-gateway"]["relabel_configs"][0]
    assert kept["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
    assert kept["action"] == "keep"


ALERTS = DEPLOY / "prometheus/alerts.yaml"


def test_alert_rules_pass_promtool_check_and_unit_tests() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    result = promtool("test", "rules", str(DEPLOY / "prometheus/alerts.test.yaml"))
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_alert_unit_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    """The unit tests would notice an alert that no longer fires."""
    (tmp_path / "alerts.yaml").write_text(ALERTS.read_text().replace("> 0.05", "> 0.5"))
    shutil.copy(DEPLOY / "prometheus/alerts.test.yaml", tmp_path / "alerts.test.yaml")
    result = promtool("test", "rules", str(tmp_path / "alerts.test.yaml"))
    assert result.returncode != 0 and b"GatewayHighErrorRatio" in result.stdout + result.stderr


def test_alerts_cover_the_failure_modes_with_exported_metrics() -> None:
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    assert len({rule["alert"] for rule in rules}) == len(rules)
    used = {name for rule in rules for name in re.findall(r"\bgateway_[a-z_]+", rule["expr"])}
    assert used <= exported_metric_names(), used - exported_metric_names()
    assert used >= {"gateway_requests_total", "gateway_request_duration_seconds_bucket",
                    "gateway_outlier_ejections_total", "gateway_circuit_breaker_rejections_total",
                    "gateway_inflight_budget_refusals_total", "gateway_config_last_reload_successful",
                    "gateway_event_loop_lag_seconds_bucket"}
    assert any('outcome="overloaded"' in rule["expr"] for rule in rules)
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"]


def test_prometheus_rule_carries_the_same_rules() -> None:
    """The Operator's PrometheusRule and the plain rules file agree."""
    rule = yaml.safe_load((DEPLOY / "prometheus/prometheusrule.yaml").read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"] and set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())


def exported_metric_names() -> set[str]:
    """Every series name the gateway's metrics can expose."""
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",)}
    return {family.name + suffix for family in GatewayMetrics(CollectorRegistry()).registry.collect()
            for suffix in suffixes.get(family.type, ("",))}


def test_grafana_dashboard_uses_only_exported_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana/inference-gateway-dashboard.json").read_text())
    assert dashboard["uid"] and dashboard["title"]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels) >= 10
    exported = exported_metric_names()
    used = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(re.findall(r"\bgateway_[a-z_]+", target["expr"]))
            assert names, target["expr"]
            unknown = names - exported
            assert not unknown, (panel["title"], unknown)
            used |= names
    # the main metrics all have a panel
    for name in ("gateway_requests_total", "gateway_request_duration_seconds_bucket",
                 "gateway_upstream_request_duration_seconds_bucket", "gateway_translation_duration_seconds_bucket",
                 "gateway_requests_in_flight", "gateway_upstream_retries_total", "gateway_endpoint_healthy",
                 "gateway_config_reloads_total"):
        assert name in used, name
