"""A broker that exits while starting is reported with its log's last error, since the log
may be gone (a test's temporary directory) by the time anyone looks."""

from __future__ import annotations

from pathlib import Path

from tablecast.kafka.broker import _last_error


def test_the_last_error_of_the_log_is_quoted(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    log.write_text(
        "[2026-11-29 11:12:40,001] INFO starting (kafka.Kafka$)\n"
        "[2026-11-29 11:12:41,002] ERROR first problem (kafka.Kafka$)\n"
        "[2026-11-29 11:12:41,003] ERROR Exiting Kafka due to fatal exception (kafka.Kafka$)\n"
        "org.apache.kafka.common.KafkaException: Socket server failed to bind to 127.0.0.1:43600\n"
        "\tat kafka.network.Acceptor.openServerSocket(SocketServer.scala:734)\n"
    )
    assert _last_error(log) == (
        "; its last error: org.apache.kafka.common.KafkaException: "
        "Socket server failed to bind to 127.0.0.1:43600"
    )


def test_no_log_or_no_error_adds_nothing(tmp_path: Path) -> None:
    assert _last_error(tmp_path / "missing.log") == ""
    quiet = tmp_path / "quiet.log"
    quiet.write_text("[2026-11-29 11:12:40,001] INFO starting (kafka.Kafka$)\n")
    assert _last_error(quiet) == ""
