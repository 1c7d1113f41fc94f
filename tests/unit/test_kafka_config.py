"""Kafka client settings translated between the Java and librdkafka dialects, keystores
included: JKS (made by keytool) and PKCS12 truststores become PEM files librdkafka reads."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    pkcs12,
)

from tablecast.kafka import config as kafka_config
from tablecast.kafka.config import KafkaConfig
from tablecast.kafka.secure import make_certificates

JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="app" password="p\\"w";'
)


def _ca(tmp: Path) -> tuple[Path, x509.Certificate]:
    ca_pem, _ = make_certificates(["127.0.0.1"])
    path = tmp / "ca.pem"
    path.write_text(ca_pem)
    return path, x509.load_pem_x509_certificate(ca_pem.encode())


def test_sasl_both_ways_and_secrets_redacted() -> None:
    java = KafkaConfig(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": JAAS,
        }
    )
    assert java.librdkafka["sasl.username"] == "app"
    assert java.librdkafka["sasl.password"] == 'p"w'
    assert "sasl.jaas.config" not in java.librdkafka
    rd = KafkaConfig(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "s3cret",
        }
    )
    assert rd.java["sasl.mechanism"] == "PLAIN"
    assert "PlainLoginModule required" in rd.java["sasl.jaas.config"]
    assert "sasl.password" not in rd.java
    assert "s3cret" not in str(rd.redacted()) and "s3cret" not in rd.describe()


def test_pkcs12_truststore_becomes_pem(tmp_path: Path) -> None:
    _, ca = _ca(tmp_path)
    store = tmp_path / "trust.p12"
    store.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"ca", None, None, [ca], BestAvailableEncryption(b"changeit")
        )
    )
    conf = KafkaConfig(
        {
            "ssl.truststore.location": str(store),
            "ssl.truststore.type": "PKCS12",
            "ssl.truststore.password": "changeit",
        }
    ).librdkafka
    pem = Path(conf["ssl.ca.location"]).read_bytes()
    assert x509.load_pem_x509_certificates(pem)[0] == ca
    assert "ssl.truststore.location" not in conf


def test_pem_ca_for_java_clients(tmp_path: Path) -> None:
    ca_file, _ = _ca(tmp_path)
    java = KafkaConfig({"ssl.ca.location": str(ca_file)}).java
    assert java["ssl.truststore.type"] == "PEM"
    assert java["ssl.truststore.location"] == str(ca_file)


def _p12_truststore(tmp: Path, ca: x509.Certificate) -> dict[str, str]:
    store = tmp / "trust.p12"
    store.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"ca", None, None, [ca], BestAvailableEncryption(b"changeit")
        )
    )
    return {
        "ssl.truststore.location": str(store),
        "ssl.truststore.type": "PKCS12",
        "ssl.truststore.password": "changeit",
    }


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp directory of the test's own, standing in for /tmp."""
    root = tmp_path / "tmp"
    root.mkdir(mode=0o1777)
    root.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    monkeypatch.setattr(kafka_config, "_own_pem_dir", None, raising=False)
    return root


def _private_to_us(path: Path, mode: int) -> bool:
    st = path.lstat()
    return st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == mode


def test_pem_files_go_to_a_private_directory_made_for_them(tmp_path: Path, temp_root: Path) -> None:
    _, ca = _ca(tmp_path)
    conf = KafkaConfig(_p12_truststore(tmp_path, ca)).librdkafka
    pem = Path(conf["ssl.ca.location"])
    assert pem.parent == temp_root / f"tablecast-kafka-pem-{os.getuid()}"
    assert _private_to_us(pem.parent, 0o700) and _private_to_us(pem, 0o600)
    assert x509.load_pem_x509_certificates(pem.read_bytes()) == [ca]
    # the next run reuses it; a file there that is not what it should hold is written again
    pem.write_text("truncated")
    again = KafkaConfig(_p12_truststore(tmp_path, ca)).librdkafka
    assert again["ssl.ca.location"] == str(pem)
    assert x509.load_pem_x509_certificates(pem.read_bytes()) == [ca]


@pytest.mark.parametrize("made_by", ["anyone may write", "group may read", "another user", "link"])
def test_a_pem_directory_someone_else_could_write_is_not_trusted(
    tmp_path: Path, temp_root: Path, made_by: str
) -> None:
    """Another user made the well-known directory first and put their own CA in it under
    the name ours would have: it is neither read nor written, a fresh private one is used."""
    _, ca = _ca(tmp_path)
    (tmp_path / "attacker").mkdir()
    _, theirs = _ca(tmp_path / "attacker")
    name = hashlib.sha256(ca.public_bytes(Encoding.PEM)).hexdigest()[:16] + ".pem"
    shared = temp_root / f"tablecast-kafka-pem-{os.getuid()}"
    planted_in = temp_root / "theirs" if made_by == "link" else shared
    planted_in.mkdir()
    planted = planted_in / name
    planted.write_bytes(theirs.public_bytes(Encoding.PEM))
    if made_by == "anyone may write":
        shared.chmod(0o777)
    elif made_by == "group may read":
        shared.chmod(0o750)
    else:
        planted_in.chmod(0o700)
        os.chown(planted_in, 65534, 65534)
        if made_by == "link":
            shared.symlink_to(planted_in)
    conf = KafkaConfig(_p12_truststore(tmp_path, ca)).librdkafka
    pem = Path(conf["ssl.ca.location"])
    assert not pem.resolve().is_relative_to(planted_in.resolve())
    assert x509.load_pem_x509_certificates(pem.read_bytes()) == [ca]
    assert _private_to_us(pem.parent, 0o700) and _private_to_us(pem, 0o600)
    assert x509.load_pem_x509_certificates(planted.read_bytes()) == [theirs]  # not written
