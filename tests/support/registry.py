"""A real Schema Registry: Apicurio Registry 2.6 (from Maven Central, in-memory storage),
whose Confluent-compatible API (``/apis/ccompat/v7``) confluent-kafka's serializers and
tablecast's nodes use as they would Confluent's; over plain HTTP, or over HTTPS only, with
a certificate of a private CA (its HTTP server, Quarkus, does the TLS; this build fixes
client certificates off, so it asks for none)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
import zipfile
from pathlib import Path

import httpx
import trustme

from tablecast import jvm
from tablecast.kafka.broker import free_port

from .jvm_service import JvmService

POMS = Path(__file__).resolve().parent / "jvm"


def _unpacked() -> Path:
    """The registry's runner jar, unpacked once beside the zip Maven fetched."""
    (archive,) = jvm.jar_dir("apicurio-registry", POMS).glob("*.zip")
    home = archive.with_suffix("")
    if not (home / ".complete").exists():
        partial = home.with_name(home.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(archive) as z:
            z.extractall(partial)
        (partial / ".complete").touch()
        shutil.rmtree(home, ignore_errors=True)
        partial.rename(home)
    (runner,) = home.glob("*-runner.jar")
    return runner


class SchemaRegistry(JvmService):
    def __init__(self, tls: bool = False) -> None:
        super().__init__("tablecast-registry-", "registry.log")
        self.port = free_port()
        #: the PEM of the CA whose certificate the HTTPS registry shows
        self.ca: Path | None = self._tls_material() if tls else None

    @property
    def root(self) -> str:
        """The server's root (its own APIs live under /apis)."""
        scheme = "https" if self.ca else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The Confluent-compatible API's root, as clients are given it."""
        scheme = "https" if self.ca else "http"
        return f"{scheme}://127.0.0.1:{self.port}/apis/ccompat/v7"

    def _tls_material(self) -> Path:
        """A CA and the server's certificate for 127.0.0.1; the CA's PEM."""
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        server.private_key_and_cert_chain_pem.write_to_path(str(self.dir / "server.pem"))
        ca.cert_pem.write_to_path(str(self.dir / "ca.pem"))
        return self.dir / "ca.pem"

    def _http_flags(self) -> list[str]:
        if self.ca is None:
            return [f"-Dquarkus.http.port={self.port}"]
        return [
            f"-Dquarkus.http.ssl-port={self.port}",
            f"-Dquarkus.http.port={free_port()}",
            "-Dquarkus.http.insecure-requests=disabled",
            f"-Dquarkus.http.ssl.certificate.files={self.dir / 'server.pem'}",
            f"-Dquarkus.http.ssl.certificate.key-files={self.dir / 'server.pem'}",
        ]

    def _probe(self) -> bool:
        verify = ssl.create_default_context(cafile=str(self.ca)) if self.ca else True
        return httpx.get(self.url + "/subjects", timeout=2, verify=verify).status_code == 200

    def start(self, timeout: float = 120.0) -> SchemaRegistry:
        java = jvm.require_java()
        runner = _unpacked()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(java),
                    "-Xmx256m",
                    "-XX:TieredStopAtLevel=1",
                    *self._http_flags(),
                    "-Dquarkus.http.host=127.0.0.1",
                    "-jar",
                    str(runner),
                ],
                cwd=self.dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if self._probe():
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"schema registry not up; log:\n{self.log_tail()}")
