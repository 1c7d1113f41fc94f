"""Checking at start that Kafka can be reached with the settings in force.

librdkafka retries forever and reports authentication and TLS failures only
through its error callback, so a wrong password or an untrusted CA would look
like a hang. A command that needs Kafka calls :func:`check` first and fails
within its timeout with one line naming the cause.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from tablecast.kafka.config import KafkaConfig, client_conf, current

DEFAULT_TIMEOUT_S = 45.0


class KafkaUnavailable(RuntimeError):
    """Kafka cannot be used: unreachable, credentials refused, or its certificate not trusted."""


def check(bootstrap_servers: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Return once a broker answers metadata; raise :class:`KafkaUnavailable` saying why not."""
    seen: list[KafkaError] = []
    admin = AdminClient(client_conf(bootstrap_servers, {"error_cb": seen.append, "log_level": 0}))
    deadline = time.monotonic() + timeout
    while True:
        try:
            md = admin.list_topics(timeout=min(2.0, max(0.5, deadline - time.monotonic())))
            if md.brokers:
                return
        except KafkaException as e:
            seen.append(e.args[0])
        admin.poll(0.2)  # serves error_cb: how authentication and TLS failures are told
        cause = _fatal(seen, bootstrap_servers, current())
        if cause is not None:
            raise KafkaUnavailable(cause)
        if time.monotonic() >= deadline:
            raise KafkaUnavailable(_unreachable(seen, bootstrap_servers, current()))


def _fatal(errors: list[KafkaError], bootstrap: str, config: KafkaConfig) -> str | None:
    """A cause no retry will cure: refused credentials or an untrusted certificate."""
    for err in errors:
        text = err.str()
        if err.code() == KafkaError._AUTHENTICATION or "Authentication failed" in text:
            if "certificate verify failed" in text or "SSL handshake failed" in text:
                return _tls(bootstrap, text)
            creds = config.sasl_credentials()
            who = f"user {creds[0]!r}" if creds else "these credentials"
            return (
                f"Kafka at {bootstrap} refused {who} ({config.mechanism or 'SASL'}): "
                "check sasl.username/sasl.password or sasl.jaas.config"
            )
        if err.code() == KafkaError._SSL or "certificate verify failed" in text:
            return _tls(bootstrap, text)
    return None


def _tls(bootstrap: str, text: str) -> str:
    if "certificate verify failed" in text:
        return (
            f"the TLS certificate of Kafka at {bootstrap} is not trusted: set ssl.ca.location "
            "or ssl.truststore.location to the CA that signed it"
        )
    return f"TLS with Kafka at {bootstrap} failed: {_short(text)}"


def _unreachable(errors: list[KafkaError], bootstrap: str, config: KafkaConfig) -> str:
    last = _short(errors[-1].str()) if errors else "no answer"
    hint = ""
    if config.protocol == "PLAINTEXT" and any("brokers are down" in e.str() for e in errors):
        hint = " (a secured broker? pass --kafka-config with its client settings)"
    return f"cannot reach Kafka at {bootstrap}: {last}{hint}"


def _short(text: str) -> str:
    # librdkafka's messages carry the broker's name and a count of repeats: keep the gist
    return text.split(": ", 1)[-1].strip() if ": " in text else text
