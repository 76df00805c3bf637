"""deploy/: alert rules (promtool check + unit tests), Prometheus config, the generated Grafana
dashboard, docker-compose wiring and Kubernetes manifests (schema-validated offline)."""

import copy
import json
import os
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
    assert alerts == {
        "ReplayerDown",
        "ReplayerFallingBehind",
        "ReplayerHighErrorRatio",
        "ReplayerUsageMismatch",
        "ReplayerSLOAttainmentLow",
        "ReplayerNotFaithful",  # (issue 45: the fidelity and drift verdicts)
        "ReplayerTargetDrifting",
    }


@needs_promtool
def test_prometheus_config_is_valid(tmp_path):
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    cfg["rule_files"] = [str(DEPLOY / "prometheus" / "alerts.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    out = subprocess.run(
        [PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_json_is_generated_and_complete():
    out = subprocess.run(
        [sys.executable, str(DEPLOY / "grafana" / "dashboard.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "replayer.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    for needle in (
        "replayer_requests_due_total",
        "replayer_requests_sent_total",
        "replayer_dispatch_lag_seconds_bucket",
        "replayer_ttft_seconds_bucket",
        "replayer_itl_seconds_bucket",
        "replayer_tpot_seconds_bucket",
        "replayer_e2e_latency_seconds_bucket",
        "replayer_requests_in_flight",
        "error_kind",
        "replayer_server_completion_tokens_total",
        "replayer_usage_mismatches_total",
        "replayer_trace_rows_done",
        "replayer_loop",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "replayer_expected_prefix_cache_hit_tokens_total",
        "histogram_quantile(0.9,",
        "histogram_quantile(0.99,",
        "replayer_slo_requests_total",
        "replayer_ttft_from_due_seconds_bucket",
        "replayer_e2e_latency_from_due_seconds_bucket",
        "replayer_client_overhead_seconds_bucket",
    ):
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
    for _name, doc in _k8s_docs():
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
    for sel in (
        docs["Service"]["spec"]["selector"],
        docs["ServiceMonitor"]["spec"]["selector"]["matchLabels"],
        docs["PodMonitor"]["spec"]["selector"]["matchLabels"],
    ):
        assert sel.items() <= labels.items()
    assert "0.0.0.0" in c["args"]
    assert docs["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 30


def test_soak_setups_are_soaks_that_continue_after_a_restart(tmp_path):
    """docker-compose's replayer and the k8s Deployment: valid `replayer run` commands that loop
    forever and, restarted into their results folder, resume it (a plain run would be refused)."""
    from replayer.cli import build_parser
    from replayer.config import RunConfig, load_config

    trace = str(ROOT / "traces" / "mooncake_conversation_10min.parquet")
    docs = dict((d["kind"], d) for _, d in _k8s_docs())
    cm = {**docs["ConfigMap"]["data"], "TRACE": trace}
    k8s = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]["replayer"]["command"]
    for argv in ([_k8s_expand(a, cm) for a in k8s], [trace if a.startswith("traces/") else a for a in compose]):
        results = argv[argv.index("--results") + 1]
        argv[argv.index("--results") + 1] = str(tmp_path / results.strip("/"))
        values = lambda: {  # noqa: E731
            k: v
            for k, v in vars(build_parser().parse_args(argv)).items()  # noqa: E731, B023
            if k in RunConfig.model_fields
        }
        cfg = load_config(values())
        assert cfg.loops is None and cfg.resume_existing and cfg.resume is None and cfg.roll_interval_s
        (tmp_path / results.strip("/")).mkdir(parents=True)
        (tmp_path / results.strip("/") / "checkpoint.json").write_text("{}")  # a restart
        assert load_config(values()).resume == str(tmp_path / results.strip("/"))


# -- sharded replay across pods: deploy/k8s/sharded (coordinator + Indexed Job) ------------------

SHARDED = DEPLOY / "k8s" / "sharded"


def _sharded_docs():
    docs = []
    for path in sorted(SHARDED.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs.extend((path.name, d) for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def _sharded_jobs():
    jobs = {d["metadata"]["name"]: d for _, d in _sharded_docs() if d["kind"] == "Job"}
    return jobs["replayer-shards"], jobs["replayer-coordinator"]


def _env(container) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_k8s_sharded_manifests_validate_against_schemas():
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extra)")
    import jsonschema

    crd_schema = json.loads((DEPLOY / "k8s" / "schemas" / "monitoring.coreos.com-v1.json").read_text())
    kinds = []
    for _name, doc in _sharded_docs():
        kinds.append(doc["kind"])
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            jsonschema.validate(doc, crd_schema)
        else:
            kv.validate(doc, kv.utils.latest_version(), strict=True)
    assert sorted(kinds) == ["ConfigMap", "Job", "Job", "PersistentVolumeClaim", "Service", "Service", "ServiceMonitor"]
    kust = yaml.safe_load((SHARDED / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in SHARDED.glob("*.yaml") if p.name != "kustomization.yaml")
    bad = copy.deepcopy(_sharded_jobs()[0])
    bad["spec"]["completionMode"] = "indexed"  # the enum is case-sensitive
    bad["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.utils.latest_version(), strict=True)
    kubectl = shutil.which("kubectl")
    if kubectl:  # kustomize build, offline
        out = subprocess.run([kubectl, "kustomize", str(SHARDED)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert sorted(d["kind"] for d in yaml.safe_load_all(out.stdout)) == sorted(kinds)


def test_k8s_indexed_job_lines_up():
    job, merge = _sharded_jobs()  # (the coordinator merges the shards' folders at the end)
    spec = job["spec"]
    pod = spec["template"]["spec"]
    c = pod["containers"][0]
    n = int(_env(c)["SHARDS"])
    assert spec["completionMode"] == "Indexed"
    assert (
        spec["completions"]
        == spec["parallelism"]
        == n
        == int(_env(merge["spec"]["template"]["spec"]["containers"][0])["SHARDS"])
    )
    assert pod["restartPolicy"] == "Never"  # required by backoffLimitPerIndex
    assert pod["terminationGracePeriodSeconds"] > 30  # > --drain-timeout
    # no start time to guess: the shards reach the coordinator through its headless Service
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in _sharded_docs()}
    co_svc = docs[("Service", "replayer-coordinator")]
    co = merge["spec"]["template"]["spec"]["containers"][0]
    assert "START_AT" not in _env(c) and "START_AT" not in _env(co)
    assert co_svc["spec"]["clusterIP"] == "None"
    assert co_svc["spec"]["selector"].items() <= merge["spec"]["template"]["metadata"]["labels"].items()
    assert co["ports"] == [{"name": "fleet", "containerPort": 9500, "protocol": "TCP"}]
    assert co_svc["spec"]["ports"][0]["targetPort"] == "fleet" and "--port 9500" in co["args"][0]
    assert _env(c)["COORDINATOR"] == f"http://{co_svc['metadata']['name']}:{co_svc['spec']['ports'][0]['port']}"
    # metrics: a port named metrics on 9400, scraped by the PodMonitor and the shard ServiceMonitor
    script = c["args"][0]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert "--admin-port 9400" in script and "--admin-host 0.0.0.0" in script
    labels = spec["template"]["metadata"]["labels"]
    podmon = yaml.safe_load((DEPLOY / "k8s" / "podmonitor.yaml").read_text())
    assert podmon["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert podmon["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    svc = docs[("Service", "replayer-shards")]
    sm = docs[("ServiceMonitor", "replayer-shards")]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics" and sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # the merge pod is not a scrape target of the shard Service
    assert not svc["spec"]["selector"].items() <= merge["spec"]["template"]["metadata"]["labels"].items()
    # one ReadWriteMany volume, the same per-run folder in both Jobs
    pvc = docs[("PersistentVolumeClaim", "replayer-results")]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for j in (job, merge):
        t = j["spec"]["template"]["spec"]
        assert t["volumes"] == [{"name": "results", "persistentVolumeClaim": {"claimName": "replayer-results"}}]
        assert t["containers"][0]["volumeMounts"] == [
            {"name": "results", "mountPath": "/results", "subPathExpr": "$(RUN)"}
        ]
    assert (
        "envFrom" in c
        and c["envFrom"][0]["configMapRef"]["name"] == docs[("ConfigMap", "replayer-shards")]["metadata"]["name"]
    )


def _k8s_expand(text: str, env: dict) -> str:
    """Kubernetes' $(VAR) expansion of command/args: defined names are replaced, $$ is a $,
    anything else stays as written."""
    import re

    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def _run_script(c, env: dict, results, tmp_path, timeout=30):
    """Run a container's `sh -c` script locally with /results -> `results` and a `replayer`
    stub that prints its arguments as JSON; returns (argv lists, stderr)."""
    import textwrap

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "replayer"
    stub.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        print(json.dumps(sys.argv[1:]))
        """)
    )
    stub.chmod(0o755)
    py = bin_dir / "python"
    if not py.exists():
        py.symlink_to(sys.executable)
    assert c["command"] == ["/bin/sh", "-c"]
    full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **env}
    script = _k8s_expand(c["args"][0], full_env).replace("/results", str(results))
    out = subprocess.run(["/bin/sh", "-c", script], env=full_env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()], out.stderr


def test_k8s_indexed_job_wrapper_runs_one_shard(tmp_path):
    """The shard pod's shell wrapper, run locally as Kubernetes would (JOB_COMPLETION_INDEX set),
    builds a valid `replayer run` for shard i/N joining the coordinator; a retried pod resumes."""
    from replayer.cli import build_parser
    from replayer.config import RunConfig, load_config

    job, _ = _sharded_jobs()
    c = job["spec"]["template"]["spec"]["containers"][0]
    cm = next(d for _, d in _sharded_docs() if d["kind"] == "ConfigMap")["data"]
    trace = ROOT / "traces" / "mooncake_conversation_10min.parquet"
    env = {**cm, "TRACE": str(trace), "SHARDS": _env(c)["SHARDS"], "JOB_COMPLETION_INDEX": "2"}
    env["COORDINATOR"] = _env(c)["COORDINATOR"]
    results = tmp_path / "results"
    (argv,), err = _run_script(c, env, results, tmp_path)
    args = build_parser().parse_args(argv)
    cfg = load_config({k: v for k, v in vars(args).items() if k in RunConfig.model_fields})
    assert cfg.shard == f"2/{env['SHARDS']}" and cfg.start_at is None
    assert cfg.coordinator == "http://replayer-coordinator:9500" and cfg.ready_timeout_s == 900
    assert cfg.results == f"{results}/shard-2" and cfg.admin_port == 9400 and cfg.admin_host == "0.0.0.0"
    assert cfg.target == [cm["TARGET"]] and cfg.trace == str(trace) and cfg.resume is None
    assert cfg.resume_existing and "warning" not in err
    # a retry of the same index (its folder has a checkpoint) resumes it
    (results / "shard-2").mkdir(parents=True)
    (results / "shard-2" / "checkpoint.json").write_text("{}")
    (argv,), err = _run_script(c, env, results, tmp_path)
    args = build_parser().parse_args(argv)
    cfg = load_config({k: v for k, v in vars(args).items() if k in RunConfig.model_fields})
    assert cfg.resume == f"{results}/shard-2"


def test_k8s_coordinator_job_runs_the_fleet(tmp_path):
    """The coordinator pod's wrapper builds a valid `replayer coordinate` for N shards, its outputs
    on the run's folder (tests/test_fleet.py runs the fleet itself)."""
    from replayer.cli import build_parser

    _, co = _sharded_jobs()
    c = co["spec"]["template"]["spec"]["containers"][0]
    n = int(_env(c)["SHARDS"])
    results = tmp_path / "results"
    (argv,), _ = _run_script(c, {"SHARDS": str(n)}, results, tmp_path)
    args = build_parser().parse_args(argv)
    assert args.command == "coordinate" and args.shards == n and args.port == 9500 and args.host == "0.0.0.0"
    assert args.output == f"{results}/fleet" and args.ready_timeout == 600


# -- capture sidecar: deploy/k8s/capture (vLLM + `replayer record` in one pod) ------------------

CAPTURE = DEPLOY / "k8s" / "capture"


def _capture_docs():
    return [
        d
        for p in sorted(CAPTURE.glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]


def test_k8s_capture_sidecar_validates_and_lines_up():
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extra)")
    import shlex

    from replayer.cli import build_parser

    docs = _capture_docs()
    for doc in docs:
        kv.validate(doc, kv.utils.latest_version(), strict=True)
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Deployment", "PersistentVolumeClaim", "Service"}
    kust = yaml.safe_load((CAPTURE / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in CAPTURE.glob("*.yaml") if p.name != "kustomization.yaml")
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    vllm, cap = (next(c for c in pod["containers"] if c["name"] == n) for n in ("vllm", "capture"))
    # the proxy's command parses as `replayer record` and points at the vLLM container
    line = cap["args"][0].replace("$(POD_NAME)", "pod-0").replace("$(date -u +%Y%m%d-%H%M%S)", "20260101-000000")
    argv = shlex.split(line)
    assert argv[:3] == ["exec", "replayer", "record"]
    args = build_parser().parse_args(argv[2:])
    assert args.upstream == f"http://127.0.0.1:{vllm['args'][vllm['args'].index('--port') + 1]}"
    ports = {p["name"]: p["containerPort"] for p in cap["ports"]}
    assert args.listen == f"0.0.0.0:{ports['api']}" and args.admin_port == ports["capture-metrics"]
    assert args.admin_host == "0.0.0.0" and args.out.startswith("/captures/")
    assert {m["mountPath"] for m in cap["volumeMounts"]} >= {"/captures", os.path.dirname(args.hash_key_file)}
    assert pod["terminationGracePeriodSeconds"] > args.drain_timeout
    svc = kinds["Service"]["spec"]
    assert {p["targetPort"] for p in svc["ports"]} == set(ports)
    assert svc["selector"].items() <= kinds["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    claim = next(v for v in pod["volumes"] if v["name"] == "captures")["persistentVolumeClaim"]["claimName"]
    assert claim == kinds["PersistentVolumeClaim"]["metadata"]["name"]


def test_otel_collector_config_receives_otlp_and_writes_the_file_report_reads():
    """deploy/otel: OTLP/HTTP in on 4318 (replayer, vLLM), the file exporter's JSON lines out (what
    ``replayer report --spans`` reads); forward.yaml adds a backend to the same pipeline."""
    base = yaml.safe_load((DEPLOY / "otel" / "collector.yaml").read_text())
    assert base["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    assert base["exporters"]["file"]["format"] == "json"
    pipe = base["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        assert set(pipe[kind]) <= set(base[kind]), kind  # every component named is defined
    fwd = yaml.safe_load((DEPLOY / "otel" / "forward.yaml").read_text())
    merged_exporters = {**base["exporters"], **fwd["exporters"]}
    assert set(fwd["service"]["pipelines"]["traces"]["exporters"]) == {"file", "otlp/backend"} <= set(merged_exporters)
    assert "${env:OTLP_BACKEND_ENDPOINT}" in fwd["exporters"]["otlp/backend"]["endpoint"]


def test_k8s_manifests_take_the_otlp_endpoint_from_the_environment(monkeypatch):
    """The soak Deployment and the sharded Job read OTEL_EXPORTER_OTLP_ENDPOINT from their
    ConfigMap (empty: tracing off), the variable replayer honours as OpenTelemetry SDKs do."""
    from replayer.config import load_config

    for folder, cm_name, workload in (
        (DEPLOY / "k8s", "configmap.yaml", "deployment.yaml"),
        (DEPLOY / "k8s" / "sharded", "configmap.yaml", "indexed-job.yaml"),
    ):
        cm = yaml.safe_load((folder / cm_name).read_text())
        assert cm["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == ""
        job = yaml.safe_load((folder / workload).read_text())
        refs = [e["configMapRef"]["name"] for c in job["spec"]["template"]["spec"]["containers"] for e in c["envFrom"]]
        assert cm["metadata"]["name"] in refs
    cfg = load_config({"trace": __file__})
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    assert cfg.otlp_traces_url() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    assert cfg.otlp_traces_url() == "http://collector:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c2:4318/custom")
    assert cfg.otlp_traces_url() == "http://c2:4318/custom"
    flag = load_config({"trace": __file__, "otlp_endpoint": "http://flag:4318"})
    assert flag.otlp_traces_url() == "http://flag:4318/v1/traces"  # the flag wins


def test_dashboard_variables_filter_every_query_and_events_are_annotations():
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "replayer.json").read_text())
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["job", "instance", "model", "run_id", "target", "tenant"]
    for v in dash["templating"]["list"]:
        assert v["multi"] and v["includeAll"] and v["datasource"]["uid"] == "prometheus"
    for p in dash["panels"]:
        for t in p.get("targets", []):
            e = t["expr"]
            if "vllm:" in e:
                assert 'instance=~"$target"' in e and 'model_name=~"$model"' in e, e
            if "replayer_" in e or "process_" in e:
                assert e.count('run_id=~"$run_id"') >= e.count("replayer_") + e.count("process_"), e
            if "replayer_tenant_" in e:
                assert 'tenant=~"$tenant"' in e, e
    (ann,) = dash["annotations"]["list"]
    assert "replayer_run_event_timestamp_seconds" in ann["expr"] and ann["useValueForTime"] is True
    assert ann["titleFormat"] == "{{event}}"
