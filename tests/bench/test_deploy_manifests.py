"""The shipped deployment (deploy/, issue 15) parses and hangs together: the Kubernetes manifests'
names, labels, ports and flags agree with each other, the HAProxy config in the ConfigMap is
deploy/haproxy/haproxy.cfg but for how it finds its servers, and HAProxy accepts both configs.
(tests/bench/test_scaleout.py runs deploy/haproxy/haproxy.cfg against real replicas.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.scaleout.cluster import Replica, render_haproxy_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"


def _docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _get(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(c)


def _port(container: dict[str, Any], name: str) -> int:
    (p,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(p)


def _args(container: dict[str, Any]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in container["args"] if a.startswith("--"))


def _selects(service: dict[str, Any], deployment: dict[str, Any]) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    sel = service["spec"]["selector"]
    return bool(sel.items() <= labels.items()) and sel.items() <= deployment["spec"]["selector"]["matchLabels"].items()


def _fqdn(service: dict[str, Any]) -> str:
    return f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"


def test_every_manifest_parses_and_is_listed_in_the_kustomization() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in _docs())
    assert kinds == sorted(
        [
            ("Namespace", "seqserve"),
            ("Deployment", "redis"), ("Service", "redis"),
            ("Deployment", "seqserve"), ("Service", "seqserve-replicas"), ("PodDisruptionBudget", "seqserve"),
            ("ConfigMap", "haproxy-config"), ("Deployment", "haproxy"), ("Service", "seqserve"),
        ]
    )  # fmt: skip
    assert {d["metadata"].get("namespace", "seqserve") for d in _docs()} == {"seqserve"}
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def test_replicas_share_the_redis_store_and_drain_within_the_grace_period() -> None:
    dep = _get("Deployment", "seqserve")
    assert dep["spec"]["replicas"] == 3
    c = _container(dep)
    args = _args(c)
    redis_svc = _get("Service", "redis")
    assert _selects(redis_svc, _get("Deployment", "redis"))
    (redis_port,) = [p["port"] for p in redis_svc["spec"]["ports"]]
    assert args["state-store"] == f"redis://{_fqdn(redis_svc)}:{redis_port}/0"
    assert _port(_container(_get("Deployment", "redis")), "redis") == redis_port
    assert args["replica-id"] == "$(POD_NAME)"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    # the ports the flags give are the ones the container declares
    assert int(args["http-port"]) == _port(c, "http")
    assert int(args["grpc-port"]) == _port(c, "grpc")
    assert int(args["metrics-port"]) == _port(c, "metrics")
    # readiness is what a drain turns off at once; probed often enough to matter
    probe = c["readinessProbe"]
    assert probe["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert probe["periodSeconds"] * probe["failureThreshold"] <= 5
    # the kubelet's SIGKILL must not cut a handoff short
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= float(args["exit-timeout-secs"]) + 10
    assert "lifecycle" not in c  # no preStop: the handoff begins at SIGTERM
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_the_headless_service_lists_the_replicas() -> None:
    svc = _get("Service", "seqserve-replicas")
    dep = _get("Deployment", "seqserve")
    assert svc["spec"]["clusterIP"] == "None"
    assert _selects(svc, dep)
    pdb = _get("PodDisruptionBudget", "seqserve")
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    c = _container(dep)
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {
        "http": _port(c, "http"), "grpc": _port(c, "grpc"), "metrics": _port(c, "metrics")
    }  # fmt: skip


def _configmap_cfg() -> str:
    return str(_get("ConfigMap", "haproxy-config")["data"]["haproxy.cfg"])


def _directives(cfg: str) -> list[str]:
    """The config's lines without comments, blanks, servers and the resolvers section."""
    out, skip = [], False
    for line in cfg.splitlines():
        line = line.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not line[0].isspace():
            skip = line.startswith("resolvers")
        words = line.split()
        if skip or words[0] in ("server", "server-template"):
            continue
        out.append(" ".join(words))
    return out


def test_the_configmap_is_the_shipped_haproxy_config_with_dns_discovery() -> None:
    cfg = _configmap_cfg()
    assert _directives(cfg) == _directives(HAPROXY_CFG.read_text())
    replicas = _fqdn(_get("Service", "seqserve-replicas"))
    dep = _container(_get("Deployment", "seqserve"))
    templates = [ln.split() for ln in cfg.splitlines() if ln.split()[:1] == ["server-template"]]
    assert len(templates) == 2
    http, grpc = templates
    assert http[3] == f"{replicas}:{_port(dep, 'http')}"
    assert grpc[3] == f"{replicas}:{_port(dep, 'grpc')}"
    assert "proto h2" in " ".join(grpc) and f"port {_port(dep, 'http')}" in " ".join(grpc)
    for t in templates:
        assert {"check", "resolvers", "k8s"} <= set(t)
    assert re.search(r"^resolvers k8s$", cfg, re.M)


def test_the_balancer_deployment_and_its_service() -> None:
    dep = _get("Deployment", "haproxy")
    c = _container(dep)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "haproxy-config"
    assert c["args"][-1] == mounts["config"] + "/haproxy.cfg"
    cfg = _configmap_cfg()
    socket_dir = re.search(r"stats socket (\S+)/[^/\s]+ ", cfg)
    assert socket_dir is not None and mounts["run"] == socket_dir.group(1)  # writable: an emptyDir
    binds = [int(m) for m in re.findall(r"^\s*bind :(\d+)", cfg, re.M)]
    assert binds == [_port(c, "http"), _port(c, "grpc")]
    svc = _get("Service", "seqserve")
    assert _selects(svc, dep)
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == {"http", "grpc"}


def test_the_shipped_config_says_what_the_recipe_needs() -> None:
    d = _directives(HAPROXY_CFG.read_text())
    assert d.count("balance hdr(Inference-Session-Id)") == 1
    assert d.count("balance hdr(inference-session-id)") == 1
    assert d.count("hash-type consistent") == 2
    assert d.count("http-check send meth GET uri /v2/health/ready") == 2
    assert "retry-on 503 conn-failure empty-response" in d
    assert "option redispatch 1" in d
    assert "bind :8001 proto h2" in d


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy not on PATH")
@pytest.mark.parametrize("which", ["shipped", "configmap", "loopback"])
def test_haproxy_accepts_the_config(which: str, tmp_path: Path) -> None:
    text = HAPROXY_CFG.read_text() if which != "configmap" else _configmap_cfg()
    if which == "loopback":  # what the integration test and the bench run
        replicas = [Replica(f"replica-{i}", 9000 + i, 9100 + i, 9200 + i, tmp_path, ()) for i in range(2)]
        text = render_haproxy_config(
            text, http_port=9300, grpc_port=9301, replicas=replicas, admin_socket=tmp_path / "a.sock"
        )
        servers = [ln.split()[1:3] for ln in text.splitlines() if ln.split()[:1] == ["server"]]
        assert servers == [["replica-0", "127.0.0.1:9000"], ["replica-1", "127.0.0.1:9001"],
                           ["replica-0", "127.0.0.1:9100"], ["replica-1", "127.0.0.1:9101"]]  # fmt: skip
        assert "port 9000 check-proto h1" in text and "port 9001 check-proto h1" in text
    # the admin socket's directory does not exist here: -c checks the config, not the paths
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text.replace("/var/run/haproxy/admin.sock", str(tmp_path / "admin.sock")))
    out = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "warning" not in (out.stdout + out.stderr).lower(), out.stdout + out.stderr
