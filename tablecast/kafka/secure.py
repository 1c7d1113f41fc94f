"""What a secured dev broker needs: a CA, a server certificate, a SCRAM user, client settings.

``tablecast kafka start --secure`` makes a broker that speaks SASL_SSL
(SCRAM-SHA-512) only, so that everything tablecast does can be tried against
the kind of Kafka production runs. The material is made once per data dir and
kept there: ``ca.pem`` (the CA clients trust), ``broker.pem`` (the broker's key
and certificate, for 127.0.0.1 and localhost), ``scram.secret`` (the admin
user's password, 0600) and ``client.properties``, the ready client settings
to pass as ``--kafka-config``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509

USER = "admin"
MECHANISM = "SCRAM-SHA-512"
LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


@dataclass(frozen=True)
class SecureMaterial:
    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.dir / "broker.pem"

    @property
    def password_file(self) -> Path:
        return self.dir / "scram.secret"

    @property
    def client_properties(self) -> Path:
        return self.dir / "client.properties"

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    def jaas(self) -> str:
        return f'{LOGIN_MODULE} required username="{USER}" password="{self.password}";'

    def ensure(self) -> None:
        """Make whatever is missing: a restarted broker keeps its CA and its user's password."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.password_file.exists():
            _private_write(self.password_file, secrets.token_urlsafe(24) + "\n")
        if not (self.ca.exists() and self.keystore.exists()):
            ca_pem, keystore_pem = make_certificates(["127.0.0.1", "localhost"])
            self.ca.write_text(ca_pem)
            _private_write(self.keystore, keystore_pem)
        _private_write(
            self.client_properties,
            "# Kafka client settings for the secured dev broker: pass as --kafka-config\n"
            "security.protocol=SASL_SSL\n"
            f"sasl.mechanism={MECHANISM}\n"
            f"sasl.jaas.config={self.jaas()}\n"
            "ssl.truststore.type=PEM\n"
            f"ssl.truststore.location={self.ca}\n",
        )

    def broker_settings(self, port: int) -> dict[str, str]:
        """server.properties lines for a SASL_SSL listener on `port` (clients and brokers)."""
        return {
            "listeners": f"SASL_SSL://127.0.0.1:{port}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{port}",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": self.jaas(),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
            "ssl.client.auth": "none",
        }

    def scram_format_args(self) -> list[str]:
        """The storage tool's arguments that create the SCRAM user when the log dir is formatted."""
        return ["--add-scram", f"{MECHANISM}=[name={USER},password={self.password}]"]


def _private_write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def make_certificates(hosts: list[str]) -> tuple[str, str]:
    """A CA (PEM), and a key + certificate chain (PEM, PKCS#8) it signed for `hosts`
    (IP addresses or DNS names)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tablecast dev CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName([_name(h) for h in hosts]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [x509.ExtendedKeyUsageOID.SERVER_AUTH, x509.ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    ca_pem = ca.public_bytes(pem).decode()
    return ca_pem, key_pem.decode() + cert.public_bytes(pem).decode() + ca_pem


def _name(host: str) -> x509.GeneralName:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)
