"""deploy/*.yaml: valid YAML, ports that line up, and autoscaling on metrics the runtime really exports."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from serve.metrics import ServeMetrics

DEPLOY_DIR = Path(__file__).resolve().parent.parent.parent / "deploy"


def _documents(name: str) -> dict[str, dict]:
    documents = [d for d in yaml.safe_load_all((DEPLOY_DIR / name).read_text()) if d]
    return {document["kind"]: document for document in documents}


def _exported_metric_names() -> set[str]:
    """Sample names /metrics serves (counters gain _total, histograms _bucket/_sum/_count)."""
    metrics = ServeMetrics()
    metrics.requests.labels(route="/v1/audio/speech", method="POST", status="200").inc()
    metrics.rejected.labels(reason="queue_full").inc()
    metrics.speaker_cache.labels(result="hit").inc()
    text = generate_latest(metrics.registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


@pytest.mark.parametrize("name", sorted(p.name for p in DEPLOY_DIR.glob("*.yaml")))
def test_every_file_parses_and_opens_with_a_header(name):
    text = (DEPLOY_DIR / name).read_text()
    assert text.startswith("# ") and "kubectl apply -f deploy/" + name in text
    documents = [d for d in yaml.safe_load_all(text) if d]
    assert documents and all({"apiVersion", "kind", "metadata"} <= set(d) for d in documents)


@pytest.mark.parametrize("name", ["tts-runtime.yaml", "triton.yaml"])
def test_service_ports_and_probes_name_container_ports(name):
    documents = _documents(name)
    pod = documents["Deployment"]["spec"]["template"]
    assert documents["Deployment"]["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert documents["Service"]["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    port_names = {port["name"] for port in container["ports"]}
    assert {port["targetPort"] for port in documents["Service"]["spec"]["ports"]} <= port_names
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in port_names


def test_runtime_listens_where_the_service_sends():
    container = _documents("tts-runtime.yaml")["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "serve"]
    args = dict(arg.split("=", 1) for arg in container["args"])
    assert args["serve.host"] == "0.0.0.0"  # the loopback default would be unreachable from the Service
    assert int(args["serve.port"]) == container["ports"][0]["containerPort"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    grace_s = _documents("tts-runtime.yaml")["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s > 30  # serve.shutdown_grace_s lets in-flight requests finish first


def test_autoscalers_use_metrics_the_runtime_exports():
    exported = _exported_metric_names()
    keda = _documents("keda-scaledobject.yaml")["ScaledObject"]
    queried = set()
    for trigger in keda["spec"]["triggers"]:
        queried |= set(re.findall(r"\b(tts_[a-z_]+)\b", trigger["metadata"]["query"]))
    hpa = _documents("hpa.yaml")["HorizontalPodAutoscaler"]
    queried |= {metric["pods"]["metric"]["name"] for metric in hpa["spec"]["metrics"]}
    assert queried and queried <= exported, sorted(queried - exported)
    assert keda["spec"]["scaleTargetRef"]["name"] == hpa["spec"]["scaleTargetRef"]["name"] == "tts-runtime"
