"""Kafka client settings translated between the Java and librdkafka dialects, keystores
included: JKS (made by keytool) and PKCS12 truststores become PEM files librdkafka reads."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, pkcs12

from tablecast.kafka.config import KafkaConfig, KafkaConfigError
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


@pytest.mark.skipif(shutil.which("keytool") is None, reason="keytool (Java) is not installed")
def test_jks_truststore_from_keytool_becomes_pem(tmp_path: Path) -> None:
    ca_file, ca = _ca(tmp_path)
    store = tmp_path / "trust.jks"
    subprocess.run(
        [
            "keytool",
            "-importcert",
            "-noprompt",
            "-alias",
            "ca",
            "-file",
            str(ca_file),
            "-keystore",
            str(store),
            "-storetype",
            "JKS",
            "-storepass",
            "changeit",
        ],
        check=True,
        capture_output=True,
    )
    conf = KafkaConfig(
        {"ssl.truststore.location": str(store), "ssl.truststore.password": "changeit"}
    ).librdkafka
    assert x509.load_pem_x509_certificates(Path(conf["ssl.ca.location"]).read_bytes())[0] == ca
    with pytest.raises(KafkaConfigError):
        _ = KafkaConfig(
            {"ssl.truststore.location": str(store), "ssl.truststore.password": "wrong"}
        ).librdkafka


def test_pem_ca_for_java_clients(tmp_path: Path) -> None:
    ca_file, _ = _ca(tmp_path)
    java = KafkaConfig({"ssl.ca.location": str(ca_file)}).java
    assert java["ssl.truststore.type"] == "PEM"
    assert java["ssl.truststore.location"] == str(ca_file)
