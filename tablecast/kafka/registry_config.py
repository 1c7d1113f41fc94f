"""How this process reaches Schema Registries: TLS, a client certificate, basic or bearer
auth, and the address, from a ``.properties`` file in confluent-kafka's spelling
(``serve --registry-config FILE``, ``attach --registry-config FILE``).

A table's catalog entry names its registry's URL and nothing secret: each node and
tool reaches the registry with settings of its own.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx


class RegistryConfigError(ValueError):
    """The registry settings cannot be used (an unknown key, a file that is not there)."""


#: the settings a registry client takes, as confluent-kafka's SchemaRegistryClient spells
#: them; Java's serializers' spellings (``schema.registry.url``,
#: ``schema.registry.ssl.*``) are read too
_KEYS = frozenset(
    (
        "url",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "enable.ssl.certificate.verification",
        "basic.auth.credentials.source",
        "basic.auth.user.info",
        "bearer.auth.credentials.source",
        "bearer.auth.token",
    )
)


@dataclass(frozen=True)
class RegistrySettings:
    """How this process reaches Schema Registries: ``props`` in confluent-kafka's spelling.

    ``url`` replaces every table's registry address (the node's own way to it); the TLS
    and auth settings apply to whichever registry a table names.
    """

    props: Mapping[str, str] = field(default_factory=dict)
    source: str | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.props) - _KEYS)
        if unknown:
            known = ", ".join(sorted(_KEYS))
            raise RegistryConfigError(f"unknown registry settings {', '.join(unknown)} ({known})")
        p = self.props
        if "basic.auth.user.info" in p and ":" not in p["basic.auth.user.info"]:
            raise RegistryConfigError("basic.auth.user.info is USER:PASSWORD")
        if p.get("basic.auth.credentials.source", "USER_INFO").upper() != "USER_INFO":
            raise RegistryConfigError("basic.auth.credentials.source: only USER_INFO is read")
        if p.get("bearer.auth.credentials.source", "STATIC_TOKEN").upper() != "STATIC_TOKEN":
            raise RegistryConfigError("bearer.auth.credentials.source: only STATIC_TOKEN is read")
        if "basic.auth.user.info" in p and "bearer.auth.token" in p:
            raise RegistryConfigError("basic.auth.user.info or bearer.auth.token, not both")
        if ("ssl.key.location" in p) != ("ssl.certificate.location" in p):
            raise RegistryConfigError("ssl.certificate.location and ssl.key.location go together")
        for key in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
            if key in p and not Path(p[key]).is_file():
                raise RegistryConfigError(f"{key}: no such file {p[key]}")
        if has_credentials(p.get("url", "")):
            raise RegistryConfigError("url: no credentials in it (basic.auth.user.info holds them)")
        verify = p.get("enable.ssl.certificate.verification", "true").lower()
        if verify not in ("true", "false"):
            raise RegistryConfigError("enable.ssl.certificate.verification is true or false")

    @classmethod
    def load(cls, path: str | Path) -> RegistrySettings:
        """A Java-style ``.properties`` file (as the Kafka client settings are)."""
        from jproperties import Properties

        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise RegistryConfigError(f"cannot read {path}: {e.strerror}") from None
        props = Properties()
        try:
            props.load(data, "utf-8")
        except Exception as e:  # jproperties' own errors on a file it cannot parse
            raise RegistryConfigError(f"{path}: not a .properties file: {e}") from None
        read = {k.removeprefix("schema.registry."): v.data for k, v in props.items()}
        return cls(read, str(path))

    def address(self, url: str) -> str:
        """Where this process reaches the registry a table names at `url`."""
        return self.props.get("url", url).rstrip("/")

    def client(self, timeout: float) -> httpx.Client:
        """An HTTP client with these settings' TLS and auth."""
        p = self.props
        verify: ssl.SSLContext | bool = True
        unchecked = p.get("enable.ssl.certificate.verification", "true").lower() == "false"
        if unchecked or "ssl.ca.location" in p or "ssl.certificate.location" in p:
            verify = ssl.create_default_context(cafile=p.get("ssl.ca.location"))
            if unchecked:
                verify.check_hostname = False
                verify.verify_mode = ssl.CERT_NONE
            if "ssl.certificate.location" in p:
                verify.load_cert_chain(
                    p["ssl.certificate.location"], p["ssl.key.location"], p.get("ssl.key.password")
                )
        auth: httpx.Auth | None = None
        headers: dict[str, str] = {}
        if "basic.auth.user.info" in p:
            user, _, password = p["basic.auth.user.info"].partition(":")
            auth = httpx.BasicAuth(user, password)
        elif "bearer.auth.token" in p:
            headers["authorization"] = f"Bearer {p['bearer.auth.token']}"
        return httpx.Client(timeout=timeout, verify=verify, auth=auth, headers=headers)

    def describe(self) -> str:
        """The settings with their secrets left out (for the log)."""
        hidden = ("basic.auth.user.info", "bearer.auth.token", "ssl.key.password")
        shown = [f"{k}={'***' if k in hidden else v}" for k, v in sorted(self.props.items())]
        return ", ".join(shown) or "none"


def has_credentials(url: str) -> bool:
    """Whether `url` carries a user or password (``https://user:pw@host``): settings hold
    those, and a URL the catalog keeps must not."""
    return "@" in url.split("//", 1)[-1].split("/", 1)[0]


_current = RegistrySettings()


def use(settings: RegistrySettings) -> None:
    """Make `settings` how this process reaches registries (before any table is read)."""
    global _current
    _current = settings


def current() -> RegistrySettings:
    return _current
