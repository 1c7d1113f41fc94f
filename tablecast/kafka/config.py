"""Kafka client settings for every client tablecast makes, from one Java-style ``.properties`` file.

Kafka users keep their client settings as Java properties (``client.properties``:
``security.protocol``, ``sasl.jaas.config``, ``ssl.truststore.location`` ...).
tablecast has two kinds of Kafka client: Spark's Kafka source and sink, which
are Java and take the properties as ``kafka.``-prefixed options, and the
nodes' and tools' confluent-kafka clients, which are librdkafka and spell some
settings differently (``sasl.username`` instead of a JAAS line, PEM files
instead of Java keystores). :class:`KafkaConfig` reads the file once and gives
each kind its own dialect, so one file configures everything.

The file is named by ``--kafka-config`` or ``TABLECAST_KAFKA_CONFIG``; a
command that was given one puts it in its environment, so every process it
starts (nodes, the pipeline, the generator) uses the same file. Secrets never
leave this module unredacted except into the clients themselves.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV = "TABLECAST_KAFKA_CONFIG"

#: settings only the Java clients understand; translated for librdkafka, never passed to it
_JAVA_ONLY = {
    "sasl.jaas.config",
    "ssl.truststore.location",
    "ssl.truststore.password",
    "ssl.truststore.type",
    "ssl.keystore.type",
    "ssl.keystore.key",
    "ssl.keystore.certificate.chain",
    "ssl.truststore.certificates",
    "ssl.protocol",
    "ssl.enabled.protocols",
    "ssl.trustmanager.algorithm",
    "ssl.keymanager.algorithm",
    "sasl.login.callback.handler.class",
    "sasl.client.callback.handler.class",
}
#: librdkafka spellings with no Java twin; translated for Spark, never passed to it
_LIBRDKAFKA_ONLY = {
    "sasl.username",
    "sasl.password",
    "sasl.mechanisms",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "enable.ssl.certificate.verification",
}
_SECRET = re.compile(r"password|secret|jaas|\.key$|keystore\.key|token", re.IGNORECASE)
_JAAS_FIELD = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class KafkaConfigError(ValueError):
    """The Kafka client settings cannot be used (a missing file, an unreadable keystore ...)."""


@dataclass(frozen=True)
class KafkaConfig:
    """Client settings as the user wrote them (Java or librdkafka spellings, or both)."""

    props: Mapping[str, str] = field(default_factory=dict)
    source: str | None = None

    @classmethod
    def load(cls, path: str | Path) -> KafkaConfig:
        from jproperties import Properties

        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as e:
            raise KafkaConfigError(f"cannot read Kafka config {p}: {e.strerror}") from None
        props = Properties()
        props.load(data, "utf-8")
        return cls({k: v.data for k, v in props.items()}, str(p))

    @property
    def empty(self) -> bool:
        return not self.props

    @property
    def protocol(self) -> str:
        return self.props.get("security.protocol", "PLAINTEXT").upper()

    @property
    def mechanism(self) -> str | None:
        p = self.props
        return p.get("sasl.mechanism") or p.get("sasl.mechanisms")

    def sasl_credentials(self) -> tuple[str, str] | None:
        p = self.props
        if "sasl.username" in p:
            return p["sasl.username"], p.get("sasl.password", "")
        jaas = p.get("sasl.jaas.config")
        if jaas:
            fields = {k: re.sub(r"\\(.)", r"\1", v) for k, v in _JAAS_FIELD.findall(jaas)}
            if "username" in fields:
                return fields["username"], fields.get("password", "")
        return None

    # -- librdkafka (confluent-kafka) ----------------------------------------------
    @cached_property
    def librdkafka(self) -> dict[str, str]:
        """The settings in librdkafka's dialect (Java keystores converted to PEM files)."""
        p = self.props
        out = {k: v for k, v in p.items() if k not in _JAVA_ONLY}
        creds = self.sasl_credentials()
        if creds is not None:
            out["sasl.username"], out["sasl.password"] = creds
        if "ssl.endpoint.identification.algorithm" in out:
            out["ssl.endpoint.identification.algorithm"] = (
                out["ssl.endpoint.identification.algorithm"] or "none"
            )
        if "ssl.truststore.location" in p and "ssl.ca.location" not in p:
            out["ssl.ca.location"] = _truststore_pem(
                p["ssl.truststore.location"],
                p.get("ssl.truststore.password", ""),
                p.get("ssl.truststore.type", ""),
            )
        kstype = p.get("ssl.keystore.type", "").upper()
        if kstype == "PEM" and "ssl.keystore.key" in p:
            cert, key = _write_secret_pem(
                p["ssl.keystore.certificate.chain"], p["ssl.keystore.key"]
            )
            out.pop("ssl.keystore.location", None)
            out["ssl.certificate.location"], out["ssl.key.location"] = cert, key
        elif kstype == "JKS" and "ssl.keystore.location" in p:
            cert, key = _jks_keystore_pem(
                p["ssl.keystore.location"],
                p.get("ssl.keystore.password", ""),
                p.get("ssl.key.password"),
            )
            out.pop("ssl.keystore.location", None)
            out.pop("ssl.keystore.password", None)
            out["ssl.certificate.location"], out["ssl.key.location"] = cert, key
        return out

    # -- Java (Spark's Kafka source and sink) --------------------------------------
    @cached_property
    def java(self) -> dict[str, str]:
        """The settings in the Java clients' dialect (PEM files named as PEM stores)."""
        p = self.props
        out = {k: v for k, v in p.items() if k not in _LIBRDKAFKA_ONLY}
        if "sasl.mechanisms" in p and "sasl.mechanism" not in p:
            out["sasl.mechanism"] = p["sasl.mechanisms"]
        if "sasl.jaas.config" not in p and "sasl.username" in p:
            module = _LOGIN_MODULES.get((self.mechanism or "PLAIN").upper())
            if module is None:
                raise KafkaConfigError(f"no JAAS login module known for {self.mechanism}")
            out["sasl.jaas.config"] = (
                f'{module} required username="{_jaas_escape(p["sasl.username"])}" '
                f'password="{_jaas_escape(p.get("sasl.password", ""))}";'
            )
        if "ssl.ca.location" in p and "ssl.truststore.location" not in p:
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.location"] = p["ssl.ca.location"]
        if "ssl.certificate.location" in p and "ssl.keystore.location" not in p:
            out["ssl.keystore.type"] = "PEM"
            out["ssl.keystore.certificate.chain"] = _read(p["ssl.certificate.location"])
            out["ssl.keystore.key"] = _read(p["ssl.key.location"])
            if "ssl.key.password" in p:
                out["ssl.key.password"] = p["ssl.key.password"]
        algo = p.get("ssl.endpoint.identification.algorithm")
        if algo is not None and algo.lower() == "none":
            out["ssl.endpoint.identification.algorithm"] = ""
        return out

    def redacted(self) -> dict[str, str]:
        """The settings with every secret masked: safe to log or show."""
        return {k: ("*****" if _SECRET.search(k) else v) for k, v in self.props.items()}

    def describe(self) -> str:
        """One line for logs: where the settings came from and how we connect (no secrets)."""
        if self.empty:
            return "PLAINTEXT (no Kafka config)"
        creds = self.sasl_credentials()
        who = f" as {creds[0]!r}" if creds else ""
        mech = f" {self.mechanism}" if self.mechanism else ""
        return f"{self.protocol}{mech}{who} (from {self.source or 'settings'})"


# -- the process-wide settings ------------------------------------------------------
_current: KafkaConfig | None = None


def use(config: KafkaConfig | str | Path | Mapping[str, str] | None) -> KafkaConfig:
    """Make `config` the settings of every Kafka client this process (and its children) makes.

    A path is also put in ``TABLECAST_KAFKA_CONFIG``, so processes started from
    here read the same file.
    """
    global _current
    if config is None:
        _current = KafkaConfig()
        os.environ.pop(ENV, None)
    elif isinstance(config, KafkaConfig):
        _current = config
        if config.source:
            os.environ[ENV] = str(Path(config.source).resolve())
    elif isinstance(config, str | Path):
        _current = KafkaConfig.load(config)
        os.environ[ENV] = str(Path(config).resolve())
    else:
        _current = KafkaConfig(dict(config))
    return _current


def current() -> KafkaConfig:
    """The settings in force: those given to :func:`use`, else ``TABLECAST_KAFKA_CONFIG``'s."""
    global _current
    if _current is None:
        path = os.environ.get(ENV)
        _current = KafkaConfig.load(path) if path else KafkaConfig()
    return _current


def client_conf(bootstrap_servers: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A confluent-kafka client configuration: the settings in force, then `extra`."""
    return {"bootstrap.servers": bootstrap_servers, **current().librdkafka, **(extra or {})}


def producer_conf(bootstrap_servers: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A durable producer: acks from every in-sync replica, idempotent (no duplicates on retry)."""
    return client_conf(
        bootstrap_servers, {"acks": "all", "enable.idempotence": True, **(extra or {})}
    )


def spark_options(bootstrap_servers: str) -> dict[str, str]:
    """Options for Spark's Kafka source and sink (``kafka.``-prefixed Java settings)."""
    opts = {f"kafka.{k}": v for k, v in current().java.items()}
    opts["kafka.bootstrap.servers"] = bootstrap_servers
    return opts


# -- keystores ----------------------------------------------------------------------
def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise KafkaConfigError(f"cannot read {path}: {e.strerror}") from None


def _jaas_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


#: this process's own PEM directory, made when the shared one cannot be trusted
_own_pem_dir: Path | None = None


def _pem_dir() -> Path:
    """A directory for PEM files that only this user can write or read.

    The temp directory's well-known name is used only if it is ours and closed to
    everyone else: whoever made it first could otherwise have put a CA of their own
    in it under the name looked for, or read the keys written there.
    """
    global _own_pem_dir
    d = Path(tempfile.gettempdir()) / f"tablecast-kafka-pem-{os.getuid()}"
    with contextlib.suppress(FileExistsError):  # judged below, whoever made it
        d.mkdir(mode=0o700)
    if _private(d):
        return d
    if _own_pem_dir is None or not _private(_own_pem_dir):
        _own_pem_dir = Path(tempfile.mkdtemp(prefix="tablecast-kafka-pem-"))
        log.warning(
            "%s is not a directory private to this user (uid %d): PEM files go to %s",
            d,
            os.getuid(),
            _own_pem_dir,
        )
    return _own_pem_dir


def _private(d: Path) -> bool:
    """Whether `d` is a directory (not a link to one) of ours, with no group or other access."""
    try:
        st = d.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _write_secret_pem(*texts: str) -> tuple[str, ...]:
    """Write PEM texts to private files (0600) and return their paths."""
    import hashlib

    directory = _pem_dir()
    paths = []
    for text in texts:
        name = hashlib.sha256(text.encode()).hexdigest()[:16] + ".pem"
        path = directory / name
        try:
            whole = path.read_text() == text
        except (OSError, UnicodeDecodeError):
            whole = False
        if not whole:
            # written aside and renamed: a process killed mid-write leaves no partial file
            # under the name later runs reuse
            fd, aside = tempfile.mkstemp(dir=directory, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(aside, path)
        paths.append(str(path))
    return tuple(paths)


def _truststore_pem(location: str, password: str, kind: str) -> str:
    """The CA certificates of a Java truststore (JKS, PKCS12 or PEM) as a PEM file path."""
    kind = (kind or _guess_store_type(location)).upper()
    if kind == "PEM":
        return location
    data = Path(location).read_bytes() if Path(location).exists() else None
    if data is None:
        raise KafkaConfigError(f"cannot read truststore {location}")
    certs: list[bytes] = []
    if kind == "PKCS12":
        from cryptography.hazmat.primitives.serialization import Encoding, pkcs12

        try:
            store = pkcs12.load_pkcs12(data, password.encode() or None)
        except ValueError as e:
            raise KafkaConfigError(f"cannot open truststore {location}: {e}") from None
        pems = [c.certificate.public_bytes(Encoding.PEM) for c in store.additional_certs]
        if store.cert is not None:
            pems.append(store.cert.certificate.public_bytes(Encoding.PEM))
        certs = pems
    elif kind == "JKS":
        jks = _pyjks(location)
        try:
            store = jks.KeyStore.loads(data, password)
        except Exception as e:  # pyjks raises its own family on a bad password or format
            raise KafkaConfigError(f"cannot open truststore {location}: {e}") from None
        certs = [_der_to_pem(c.cert) for c in store.certs.values()]
    else:
        raise KafkaConfigError(f"truststore type {kind} of {location} is not supported")
    if not certs:
        raise KafkaConfigError(f"truststore {location} holds no certificate")
    return _write_secret_pem(b"".join(certs).decode())[0]


def _pyjks(location: str) -> Any:
    """pyjks, which reads Java's JKS stores; it is the [jks] extra (PKCS12 and PEM need none)."""
    try:
        import jks
    except ImportError:
        raise KafkaConfigError(
            f"{location} is a JKS store, which needs pyjks: pip install 'tablecast[jks]' "
            "(or give a PKCS12 or PEM file)"
        ) from None
    return jks


def _jks_keystore_pem(location: str, password: str, key_password: str | None) -> tuple[str, str]:
    jks = _pyjks(location)
    try:
        store = jks.KeyStore.load(location, password)
    except Exception as e:  # pyjks raises its own family on a bad password or format
        raise KafkaConfigError(f"cannot open keystore {location}: {e}") from None
    for entry in store.private_keys.values():
        if not entry.is_decrypted():
            entry.decrypt(key_password or password)
        chain = b"".join(_der_to_pem(c[1]) for c in entry.cert_chain)
        key = _der_to_pem(entry.pkey_pkcs8, "PRIVATE KEY")
        cert_path, key_path = _write_secret_pem(chain.decode(), key.decode())
        return cert_path, key_path
    raise KafkaConfigError(f"keystore {location} holds no private key")


def _der_to_pem(der: bytes, label: str = "CERTIFICATE") -> bytes:
    import base64
    import textwrap

    body = "\n".join(textwrap.wrap(base64.b64encode(der).decode(), 64))
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----\n".encode()


def _guess_store_type(location: str) -> str:
    suffix = Path(location).suffix.lower()
    if suffix in (".p12", ".pfx", ".pkcs12"):
        return "PKCS12"
    if suffix in (".pem", ".crt", ".cer"):
        return "PEM"
    return "JKS"
