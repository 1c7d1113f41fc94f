"""How a process reaches Schema Registries: the settings file, checked when it is read."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tablecast.kafka.registry_config import RegistryConfigError, RegistrySettings


def test_java_and_confluent_kafka_spellings_read_alike(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read until a client is made")
    f = tmp_path / "registry.properties"
    f.write_text(
        "schema.registry.url=https://registry:8081/\n"
        f"schema.registry.ssl.ca.location={ca}\n"
        "basic.auth.credentials.source=USER_INFO\n"
        "basic.auth.user.info=ann:s3cr:et\n"
    )
    s = RegistrySettings.load(f)
    assert s.address("http://elsewhere/apis") == "https://registry:8081"
    assert RegistrySettings().address("http://elsewhere/apis/") == "http://elsewhere/apis"
    assert s.props["ssl.ca.location"] == str(ca)
    shown = s.describe()
    assert "s3cr" not in shown and "basic.auth.user.info=***" in shown


@pytest.mark.parametrize(
    ("props", "why"),
    [
        ({"schema.registry.urls": "x"}, "unknown registry settings"),
        ({"basic.auth.user.info": "no-colon"}, "USER:PASSWORD"),
        ({"basic.auth.credentials.source": "SASL_INHERIT"}, "only USER_INFO"),
        ({"bearer.auth.credentials.source": "OAUTHBEARER"}, "only STATIC_TOKEN"),
        ({"basic.auth.user.info": "a:b", "bearer.auth.token": "t"}, "not both"),
        ({"ssl.key.location": "/etc/hostname"}, "go together"),
        ({"ssl.ca.location": "/no/such/ca.pem"}, "no such file"),
        ({"enable.ssl.certificate.verification": "maybe"}, "true or false"),
    ],
)
def test_settings_that_cannot_work_are_refused_when_read(props: dict[str, str], why: str) -> None:
    with pytest.raises(RegistryConfigError, match=why):
        RegistrySettings(props)


def test_a_missing_file_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(RegistryConfigError, match="cannot read"):
        RegistrySettings.load(tmp_path / "none.properties")


def test_the_client_carries_the_auth() -> None:
    with RegistrySettings({"basic.auth.user.info": "ann:pw"}).client(1.0) as c:
        request = c.build_request("GET", "http://registry/subjects")
        flow = c.auth.sync_auth_flow(request)  # type: ignore[union-attr]
        assert next(flow).headers["authorization"].startswith("Basic ")
    with RegistrySettings({"bearer.auth.token": "tok"}).client(1.0) as c:
        assert c.build_request("GET", "http://r/").headers["authorization"] == "Bearer tok"
    with RegistrySettings().client(1.0) as c:
        assert "authorization" not in c.build_request("GET", "http://r/").headers
        assert isinstance(c, httpx.Client)


def test_credentials_in_the_url_and_unparsable_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RegistryConfigError, match="credentials"):
        RegistrySettings({"url": "https://ann:pw@registry:8081/apis"})
    f = tmp_path / "bad.properties"
    f.write_bytes(b"url=\\uZZZZ\n")
    with pytest.raises(RegistryConfigError):
        RegistrySettings.load(f)


def test_one_address_for_two_registries_is_refused_not_guessed() -> None:
    from tablecast.cluster import schema_registry
    from tablecast.kafka import registry_config

    before = registry_config.current()
    registry_config.use(RegistrySettings({"url": "http://127.0.0.1:9/apis"}))
    try:
        first = schema_registry.registry("http://a.example/apis")
        second = schema_registry.registry("http://b.example/apis")
        assert first.refused is None and first.url == "http://127.0.0.1:9/apis"
        with pytest.raises(schema_registry.SchemaUnreadable, match="one registry"):
            second.decode(b"\x00\x00\x00\x00\x01\x02")
    finally:
        registry_config.use(before)
