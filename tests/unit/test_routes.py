"""The route table (tablecast/http/routes.py): what each path matches, the parameters each
route takes, and that the table and the app and the OpenAPI document agree; and the figures
of /metrics, which each part of the node reports itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tablecast.cluster.node import Node, NodeConfig
from tablecast.http.app import HttpApp
from tablecast.http.openapi import document
from tablecast.http.routes import ROUTES, Routes
from tablecast.query.auth import Auth
from tablecast.query.errors import ApiError

ROUTING = Routes()


@pytest.mark.parametrize(
    ("method", "path", "name", "args"),
    [
        ("GET", "/v1/tables", "tables", {}),
        ("GET", "/v1/tables/t/keys/k", "key", {"table": "t", "key": "k"}),
        # a key's %2F is data; the table name is decoded too
        ("GET", "/v1/tables/my%20t/keys/a%2Fb", "key", {"table": "my t", "key": "a/b"}),
        ("GET", "/v1/tables/t/keys/a/b", "key", {"table": "t", "key": "a/b"}),
        ("GET", "/v1/tables/t/keys/a/b/history", "history", {"table": "t", "key": "a/b"}),
        ("GET", "/v1/tables/t/keys/k/windows", "windows", {"table": "t", "key": "k"}),
        ("GET", "/v1/tables/t/keys/k/metadata", "metadata", {"table": "t", "key": "k"}),
        # a key ending in /history can only be read as ?key=
        ("GET", "/v1/tables/t/keys/k%2Fhistory", "key", {"table": "t", "key": "k/history"}),
        ("GET", "/v1/tables/t/keys", "key", {"table": "t"}),
        ("GET", "/v1/tables/t/history", "history", {"table": "t"}),
        ("POST", "/v1/tables/t/keys:batchGet", "batch_get", {"table": "t"}),
        ("GET", "/v1/tables/t/index/by_city/Paris", "index_lookup",
         {"table": "t", "index": "by_city", "value": "Paris"}),
        ("GET", "/v1/tables/t/index/by_city/a/b", "index_lookup",
         {"table": "t", "index": "by_city", "value": "a/b"}),
        ("GET", "/v1/tables/t/index/by_city", "index_range", {"table": "t", "index": "by_city"}),
        ("GET", "/v1/tables/t/range", "range", {"table": "t"}),
        ("GET", "/v1/tables/t/count", "count", {"table": "t"}),
        ("GET", "/v1/tables/t/watch", "watch", {"table": "t"}),
        ("GET", "/v1/cluster", "cluster", {}),
        ("GET", "/internal/tables/t/scan", "internal_scan", {"table": "t"}),
        ("POST", "/internal/answers", "internal_batch", {}),
        ("GET", "/ui/", "ui", {}),
        ("GET", "/ui/static/js/app.js", "ui", {"name": "js/app.js"}),
        ("GET", "/ui/api/nodes", "ui_api", {}),
        ("GET", "/healthz", "healthz", {}),
        ("GET", "/openapi.json", "openapi", {}),
    ],
)  # fmt: skip
def test_each_path_matches_its_route(
    method: str, path: str, name: str, args: dict[str, str]
) -> None:
    route, got = ROUTING.match(method, path)
    assert (route.name, got) == (name, args)


@pytest.mark.parametrize(
    ("method", "path", "code"),
    [
        ("GET", "/v1/tables/t/range/x", "not_found"),
        ("GET", "/v1/nothing", "not_found"),
        ("GET", "/ui/api/other", "not_found"),
        ("GET", "/healthz/", "not_found"),
        ("GET", "/v1/tables/t/keys:batchGet", "method_not_allowed"),
        ("DELETE", "/v1/tables/t/keys/k", "method_not_allowed"),
        ("POST", "/internal/reads/", "not_found"),
        ("GET", "/internal/reads", "method_not_allowed"),
    ],
)
def test_other_paths_and_methods_are_refused(method: str, path: str, code: str) -> None:
    with pytest.raises(ApiError) as e:
        ROUTING.match(method, path)
    assert e.value.code == code


def test_a_parameter_the_route_does_not_take_is_named() -> None:
    route, _ = ROUTING.match("GET", "/v1/tables/t/keys/k")
    ROUTING.check(route, {"max_lag": "3", "as_of": "0", "key": "k"})
    with pytest.raises(ApiError, match=r"unknown query parameter.*max-lag.*takes: after"):
        ROUTING.check(route, {"max-lag": "3"})
    route, _ = ROUTING.match("GET", "/healthz")
    with pytest.raises(ApiError, match="takes: none"):
        ROUTING.check(route, {"x": "1"})
    route, _ = ROUTING.match("GET", "/v1/tables/t/watch")
    ROUTING.check(route, {"key": "a", "anything": "the watch reads its own"})


def test_every_route_has_its_endpoint_and_declares_its_path_parameters() -> None:
    for route in ROUTES:
        assert callable(getattr(HttpApp, "_" + route.endpoint, None)), route
        assert (route.endpoint == "read") == (route.read is not None), route
        in_path = re.findall(r"\{(\w+)", route.path)
        if route.summary:  # documented: every path parameter described
            declared = [p.name for p in route.params if p.where == "path"]
            assert declared == in_path, route.path


def test_the_document_holds_every_documented_route_and_no_other() -> None:
    paths = document()["paths"]
    documented = {(r.documented_path, r.method.lower()) for r in ROUTES if r.summary}
    assert {(p, m) for p, ops in paths.items() for m in ops} == documented
    assert not any(p.startswith(("/internal", "/ui")) for p in paths)


def test_metrics_hold_each_part_of_the_node_once(tmp_path: Path) -> None:
    """Each part of the node reports its own figures; together one valid exposition."""
    config = NodeConfig("unit", "127.0.0.1:9", "http://127.0.0.1:9", "node-1", tmp_path / "n")
    app = HttpApp(Node(config), Auth(), rate_limit=5.0, forwarding="batched")
    status, body, _ = app._exposition()
    families = [f.name for f in text_string_to_metric_families(body.decode())]
    assert status == 200 and len(families) == len(set(families))
    for name in (
        "tablecast_http_requests",  # the request figures
        "tablecast_rate_limited",  # the limits
        "tablecast_replica_lag",  # the ingestion
        "tablecast_watches",  # the watches
        "tablecast_forward_batches",  # the forwarding batches
    ):
        assert name in families, name
    renewed = [
        s.labels["consumer"]
        for f in text_string_to_metric_families(body.decode())
        if f.name == "tablecast_kafka_consumers_renewed"
        for s in f.samples
    ]
    assert sorted(renewed) == ["catalog", "table", "watch_feed"]
