"""deploy/: the Dockerfile passes hadolint and the Kubernetes manifests validate against the
API schemas (kubernetes-validate, strict), and they agree with each other and with the CLI.

The images cannot be built here; these checks are what keeps them correct by
construction. The validators come with the dev extra; a test is skipped where
its validator is not installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))


def _tool(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).with_name(name))
    if not Path(found).exists():
        pytest.skip(f"{name} is not installed (pip install '.[dev]')")
    return found


def _docs() -> list[dict[str, Any]]:
    return [d for f in MANIFESTS for d in yaml.safe_load_all(f.read_text()) if d]


def test_the_dockerfile_passes_hadolint() -> None:
    done = subprocess.run(
        [
            _tool("hadolint"),
            "--no-color",
            "--failure-threshold",
            "info",
            str(DEPLOY / "Dockerfile"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_manifests_validate_strictly() -> None:
    assert MANIFESTS, "no manifests under deploy/k8s"
    done = subprocess.run(
        [_tool("kubernetes-validate"), "--strict", *map(str, MANIFESTS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ERROR" not in done.stdout + done.stderr


def test_nodes_advertise_their_stable_names_and_probe_readyz() -> None:
    docs = _docs()
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    headless = next(
        d
        for d in docs
        if d["kind"] == "Service"
        and d["spec"].get("clusterIP") == "None"
        and d["metadata"]["name"] == sts["spec"]["serviceName"]
    )
    assert headless["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    pod = sts["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    env = {e["name"]: e for e in node["env"]}
    url = env["TABLECAST_SERVE_ADVERTISED_URL"]["value"]
    assert url.startswith(f"http://$(POD_NAME).{sts['spec']['serviceName']}.$(NAMESPACE).svc")
    for name in ("TABLECAST_CLUSTER_SECRET", "TABLECAST_BOOTSTRAP_SERVERS", "TABLECAST_SERVE_APP"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "tablecast", name
    assert node["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert node["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert node["resources"]["requests"] and node["resources"]["limits"]
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["name"]: m["mountPath"] for m in node["volumeMounts"]}
    assert env["TABLECAST_SERVE_DATA_DIR"]["value"] == mounts["data"] and "data" in claims
    secret = next(d for d in docs if d["kind"] == "Secret")
    needed = {"app-id", "bootstrap-servers", "cluster-secret", "kafka.properties"}
    assert needed <= set(secret["stringData"])


def test_every_tablecast_option_the_manifests_set_exists() -> None:
    """A TABLECAST_ variable is read only if `serve` or `run` has an option it names."""
    from tablecast.cli.main import build_parser

    parser = build_parser()
    options = {
        v
        for cmd in ("serve", "run")
        for o in parser.commands[cmd].options
        for v in parser.commands[cmd].variables(o)
    }
    # read by the library itself rather than by an option
    options |= {"TABLECAST_STATE_DIR", "TABLECAST_KAFKA_CONFIG"}
    for d in _docs():
        spec = d.get("spec", {})
        pod = spec.get("template", {}).get("spec", {})
        for c in pod.get("containers", []):
            for e in c.get("env", []):
                if e["name"].startswith("TABLECAST_"):
                    assert e["name"] in options, f"{d['metadata']['name']}: {e['name']}"
