"""deploy/: alert rules (promtool check + unit tests), Prometheus config, the generated Grafana
dashboard, docker-compose wiring and Kubernetes manifests (schema-validated offline)."""

import copy
import json
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT

DEPLOY = ROOT / "deploy"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing (apt-get install prometheus)")


@needs_promtool
def test_alert_rules_check_and_unit_tests():
    d = DEPLOY / "prometheus"
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        out = subprocess.run([PROMTOOL, *args], cwd=d, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
    alerts = {r["alert"] for g in yaml.safe_load((d / "alerts.yml").read_text())["groups"] for r in g["rules"]}
    assert alerts == {"ReplayerDown", "ReplayerFallingBehind", "ReplayerHighErrorRatio", "ReplayerUsageMismatch"}


@needs_promtool
def test_prometheus_config_is_valid(tmp_path):
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    cfg["rule_files"] = [str(DEPLOY / "prometheus" / "alerts.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    out = subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_json_is_generated_and_complete():
    out = subprocess.run([sys.executable, str(DEPLOY / "grafana" / "dashboard.py"), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "replayer.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    for needle in ("replayer_requests_due_total", "replayer_requests_sent_total", "replayer_dispatch_lag_seconds_bucket",
                   "replayer_ttft_seconds_bucket", "replayer_itl_seconds_bucket", "replayer_tpot_seconds_bucket",
                   "replayer_e2e_latency_seconds_bucket", "replayer_requests_in_flight", "error_kind",
                   "replayer_server_completion_tokens_total", "replayer_usage_mismatches_total", "replayer_trace_rows_done",
                   "replayer_loop", "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                   "vllm:prefix_cache_hits_total", "replayer_expected_prefix_cache_hit_tokens_total",
                   "histogram_quantile(0.9,", "histogram_quantile(0.99,"):
        assert needle in exprs, needle
    assert "$__" not in exprs  # fixed windows only: every query runs as-is against the API
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_compose_mounts_exist_and_point_at_each_other():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    svc = compose["services"]
    assert {"replayer", "target", "prometheus", "grafana"} <= set(svc)
    for s in svc.values():
        for v in s.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), src
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for j in prom["scrape_configs"] for c in j["static_configs"] for t in c["targets"]}
    assert targets == {"replayer:9400", "target:8000"}
    assert "--admin-host" in svc["replayer"]["command"]
    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["uid"] == "prometheus"


def _k8s_docs():
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend((path.name, d) for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def test_k8s_manifests_validate_against_schemas():
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extra)")
    import jsonschema

    crd_schema = json.loads((DEPLOY / "k8s" / "schemas" / "monitoring.coreos.com-v1.json").read_text())
    kinds = set()
    for name, doc in _k8s_docs():
        kinds.add(doc["kind"])
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            jsonschema.validate(doc, crd_schema)
        else:
            kv.validate(doc, kv.utils.latest_version(), strict=True)
    assert {"Deployment", "ConfigMap", "Service", "PodMonitor", "ServiceMonitor"} <= kinds
    kust = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    assert all((DEPLOY / "k8s" / r).exists() for r in kust["resources"])


def test_k8s_schema_check_catches_mistakes():
    kv = pytest.importorskip("kubernetes_validate")
    import jsonschema

    docs = dict((d["kind"], d) for _, d in _k8s_docs())
    bad = copy.deepcopy(docs["Deployment"])
    bad["spec"]["template"]["spec"]["containers"][0]["port"] = 9400  # typo for ports
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.utils.latest_version(), strict=True)
    crd_schema = json.loads((DEPLOY / "k8s" / "schemas" / "monitoring.coreos.com-v1.json").read_text())
    bad = copy.deepcopy(docs["ServiceMonitor"])
    bad["spec"]["endpoints"][0]["interval"] = "five seconds"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, crd_schema)
    bad = copy.deepcopy(docs["PodMonitor"])
    bad["spec"]["podMetricEndpoints"] = bad["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, crd_schema)


def test_k8s_ports_and_probes_line_up():
    docs = dict((d["kind"], d) for _, d in _k8s_docs())
    c = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert c["ports"][0]["name"] == "metrics"
    assert docs["Service"]["spec"]["ports"][0]["targetPort"] == "metrics"
    assert docs["ServiceMonitor"]["spec"]["endpoints"][0]["port"] == "metrics"
    assert docs["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for sel in (docs["Service"]["spec"]["selector"], docs["ServiceMonitor"]["spec"]["selector"]["matchLabels"],
                docs["PodMonitor"]["spec"]["selector"]["matchLabels"]):
        assert sel.items() <= labels.items()
    assert "0.0.0.0" in c["args"]
    assert docs["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 30
