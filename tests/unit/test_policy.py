"""The authorization policy: parsing (YAML and JSON, clear errors), matching claims, filling
prefixes from claims, and the key spans that reads intersect with."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
import orjson
import pytest

from tablecast import serde
from tablecast.contract.table_info import TableInfo
from tablecast.query.auth import Auth
from tablecast.query.errors import ApiError
from tablecast.query.peer_calls import not_refused
from tablecast.query.policy import Grants, KeyScope, Policy, PolicyError, prefix_end

POLICY = {
    "rules": [
        {"tables": {"activity": {"key_prefix": "{sub}"}}},
        {"match": {"role": "admin"}, "tables": {"*": "*"}},
        {"match": {"groups": "auditors"}, "tables": {"audit": "*"}},
        {
            "match": {"tier": 2, "beta": True},
            "tables": {"orders": [{"key_prefix": "{tenant}/"}, {"key_prefix": "public/"}]},
        },
    ]
}


def _table(name: str, key: Any = None) -> TableInfo:
    return TableInfo(
        name=name,
        topic=f"app.table.{name}",
        partitions=4,
        key=(key or serde.string()).spec(),
        value=serde.json().spec(),
    )


def _of(grants: Grants, info: TableInfo) -> KeyScope | None:
    """The grants' scope of one table (the router passes its catalog lookup instead)."""
    return grants.table_scope(info.name, lambda _: info)[1]


def _scope(policy: Policy, claims: dict[str, Any], table: str, key: Any = None) -> KeyScope | None:
    return _of(policy.grants(claims), _table(table, key))


def test_yaml_and_json_files_read_alike(tmp_path: Path) -> None:
    as_json = tmp_path / "p.json"
    as_json.write_text(json.dumps(POLICY))
    as_yaml = tmp_path / "p.yaml"
    as_yaml.write_text(
        """
rules:
  - tables: {activity: {key_prefix: "{sub}"}}
  - match: {role: admin}
    tables: {"*": "*"}
  - match: {groups: auditors}
    tables: {audit: "*"}
  - match: {tier: 2, beta: true}
    tables:
      orders:
        - key_prefix: "{tenant}/"
        - key_prefix: public/
"""
    )
    assert Policy.load(as_json).rules == Policy.load(as_yaml).rules == Policy.parse(POLICY).rules


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ([], '{"rules": [...]}'),
        ({"rules": [], "extra": 1}, '{"rules": [...]}'),
        ({"rules": [{"tabels": {}}]}, "rule 1"),
        ({"rules": [{"tables": {}}]}, "tables maps"),
        ({"rules": [{"match": {"groups": ["a", "b"]}, "tables": {"t": "*"}}]}, "match.groups"),
        ({"rules": [{"tables": {"t": "all"}}]}, "tables.t"),
        ({"rules": [{"tables": {"t": {"key_prefix": 3}}}]}, "tables.t"),
        ({"rules": [{"tables": {"t": {"prefix": "a"}}}]}, "tables.t"),
        ({"rules": [{"match": "admin", "tables": {"t": "*"}}]}, "match is a mapping"),
    ],
)
def test_bad_policies_name_the_place(doc: Any, says: str) -> None:
    with pytest.raises(PolicyError) as e:
        Policy.parse(doc, "p.yaml")
    assert says in str(e.value) and str(e.value).startswith("p.yaml")


def test_unreadable_files_are_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the policy file"):
        Policy.load(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules: [\n")
    with pytest.raises(PolicyError, match="not valid YAML") as e:
        Policy.load(broken)
    assert "\n" not in str(e.value)


def test_grants_are_the_union_of_matching_rules() -> None:
    p = Policy.parse(POLICY)
    alice = p.grants({"sub": "alice"})
    assert alice.allows_table("activity") and not alice.allows_table("audit")
    with pytest.raises(ApiError) as e:
        alice.require_table("audit")
    assert e.value.status == 403 and e.value.code == "forbidden"
    auditor = p.grants({"sub": "al", "groups": ["staff", "auditors"]})  # a list claim contains it
    assert auditor.allows_table("audit") and _of(auditor, _table("audit")) is None
    assert _scope(p, {"sub": "al", "groups": ["auditors"]}, "activity").prefixes == (b"al",)
    admin = p.grants({"sub": "root", "role": "admin"})
    assert admin.allows_table("anything") and _of(admin, _table("activity")) is None
    assert not p.grants({"sub": "x", "role": ["user"]}).allows_table("anything")


def test_claims_match_only_values_of_their_own_kind() -> None:
    p = Policy.parse(POLICY)
    ok = {"sub": "a", "tier": 2, "beta": True, "tenant": "acme"}
    assert _scope(p, ok, "orders").prefixes == (b"acme/", b"public/")
    for bad in ({"tier": "2"}, {"beta": 1}, {"beta": "true"}, {"tier": True}):
        assert not p.grants({**ok, **bad}).allows_table("orders"), bad
    assert p.grants({**ok, "tier": 2.0}).allows_table("orders")  # a number is a number


def test_a_claim_that_cannot_fill_a_prefix_grants_nothing() -> None:
    p = Policy.parse(POLICY)
    # an empty prefix would be the whole table: the rule applies, its grant gives nothing
    for claims in ({}, {"sub": ""}, {"sub": None}, {"sub": ["a"]}, {"sub": True}, {"sub": {}}):
        assert not p.grants(claims).allows_table("activity"), claims
    assert _scope(p, {"sub": 42}, "activity").prefixes == (b"42",)
    # one failed grant does not take the others of the rule with it
    assert _scope(p, {"tier": 2, "beta": True}, "orders").prefixes == (b"public/",)


def test_templates_fill_any_claim_and_keep_literal_text() -> None:
    p = Policy.parse(
        {
            "rules": [
                {"tables": {"t": {"key_prefix": "{https://idp.example/org}:{sub}|"}}},
                {"tables": {"u": {"key_prefix": ""}}},  # written empty: the whole table
            ]
        }
    )
    assert _scope(p, {"sub": "bo", "https://idp.example/org": "o1"}, "t").prefixes == (b"o1:bo|",)
    assert _scope(p, {"sub": "bo"}, "u") is None


def test_scope_spans_merge_covered_prefixes_and_clip_ranges() -> None:
    s = KeyScope([b"ab", b"a", b"b/", b"b/x", b"c\xff"])
    assert s.prefixes == (b"a", b"b/", b"c\xff")
    assert s.spans == ((b"a", b"b"), (b"b/", b"b0"), (b"c\xff", b"d"))
    assert s.allows(b"abc") and s.allows(b"b/1") and not s.allows(b"b") and not s.allows(b"")
    assert s.clip(None, None) == list(s.spans)
    assert s.clip(b"a5", b"b/5") == [(b"a5", b"b"), (b"b/", b"b/5")]
    assert s.clip(b"b0", None) == [(b"c\xff", b"d")]
    assert s.clip(b"x", None) == [] and s.clip(None, b"a") == []
    assert KeyScope([b"\xff"]).spans == ((b"\xff", None),)
    assert prefix_end(b"a\xff\xff") == b"b" and prefix_end(b"\xff") is None


def test_prefixes_apply_to_serialized_keys_by_format() -> None:
    p = Policy.parse({"rules": [{"tables": {"*": {"key_prefix": "{sub}"}}}]})
    assert _scope(p, {"sub": "é"}, "s").prefixes == ("é".encode(),)
    assert _scope(p, {"sub": "[1,"}, "j", serde.json()).allows(b"[1,2]")
    assert _scope(p, {"sub": "é"}, "b", serde.bytes()).prefixes == (b"\xe9",)
    assert _scope(p, {"sub": "\u20ac"}, "b", serde.bytes()).spans == ()
    assert _scope(p, {"sub": "1"}, "l", serde.long()).spans == ()  # only "*" grants long keys


def test_grants_are_compiled_once_per_token() -> None:
    secret = "unit-test-secret-0123456789abcdef0123"
    auth = Auth(secret, policy=Policy.parse(POLICY))
    token = "Bearer " + jwt.encode({"sub": "alice", "exp": int(time.time() + 60)}, secret)
    first = auth.caller(token)
    assert first is auth.caller(token) and first.grants is not None
    assert first.subject == "alice"
    info = _table("activity")
    assert _of(first.grants, info) is _of(first.grants, info)  # the spans too
    assert Auth(secret).caller(token).grants is None  # no policy: nothing to compile


def test_a_peers_refusal_is_passed_on_not_routed_around() -> None:
    ok = (200, b"{}", [])
    assert not_refused(ok) is ok and not_refused((503, b"", []))[0] == 503
    for status, code in ((401, "unauthorized"), (403, "forbidden")):
        body = orjson.dumps({"error": {"code": code, "message": "not for you"}})
        with pytest.raises(ApiError) as e:
            not_refused((status, body, []))
        assert (e.value.status, e.value.message) == (status, "not for you")
    with pytest.raises(ApiError) as e:
        not_refused((403, b"garbage", []))
    assert e.value.status == 403
