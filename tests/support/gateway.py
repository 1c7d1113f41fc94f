"""nginx (Debian's, unpacked once into the test cache, never installed as a service) in
front of a Schema Registry, as production registries are reached: HTTPS with a private
CA's certificate, a client certificate demanded of every caller, and basic auth or a
bearer token checked before a request reaches the registry."""

from __future__ import annotations

import base64
import glob
import hashlib
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import trustme

from tablecast import jvm
from tablecast.kafka.broker import free_port

from .jvm_service import JvmService

USER, PASSWORD = "reader", "s3cret-pw"
TOKEN = "a-static-bearer-token"


def nginx() -> Path:
    """Debian's nginx binary, fetched with ``apt-get download`` and unpacked (no install
    scripts run, so no service starts) on first use."""
    home = jvm.cache_root() / "nginx-deb"
    binary = home / "usr" / "sbin" / "nginx"
    if (home / ".complete").exists():
        return binary
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    print("[tablecast] apt-get download nginx (unpacked into the test cache) ...", flush=True)
    command = ["apt-get", "download", "-q", "nginx"]
    if subprocess.run(command, cwd=home, capture_output=True).returncode != 0:
        # a stale package index: refresh it once (root only, as a fresh CI machine runs)
        subprocess.run(["apt-get", "update", "-q"], capture_output=True)
        subprocess.run(command, cwd=home, check=True, capture_output=True)
    (deb,) = glob.glob(str(home / "nginx_*.deb"))
    subprocess.run(["dpkg-deb", "-x", deb, str(home)], check=True, capture_output=True)
    (home / ".complete").touch()
    return binary


class RegistryGateway(JvmService):
    """Two HTTPS ports in front of the registry at `upstream` (``http://127.0.0.1:P``), each
    demanding a client certificate of :attr:`ca`: :attr:`basic_url` asks basic auth
    (:data:`USER`/:data:`PASSWORD`), :attr:`bearer_url` the bearer :data:`TOKEN`."""

    def __init__(self, upstream: str) -> None:
        super().__init__("tablecast-gateway-", "nginx.log")
        self.upstream = upstream
        self.basic_port, self.bearer_port = free_port(), free_port()
        ca = trustme.CA()
        ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
            str(self.dir / "server.pem")
        )
        client = ca.issue_cert("tablecast-node")
        client.cert_chain_pems[0].write_to_path(str(self.dir / "client.pem"))
        client.private_key_pem.write_to_path(str(self.dir / "client.key"))
        ca.cert_pem.write_to_path(str(self.dir / "ca.pem"))
        #: the CA that signed the gateway's certificate and the client's
        self.ca = self.dir / "ca.pem"
        #: a client certificate and key the gateway accepts
        self.client_cert, self.client_key = self.dir / "client.pem", self.dir / "client.key"

    def url(self, auth: str) -> str:
        """The registry's Confluent API behind the gateway's `auth` ("basic" or "bearer")."""
        port = self.basic_port if auth == "basic" else self.bearer_port
        return f"https://127.0.0.1:{port}/apis/ccompat/v7"

    def _config(self) -> str:
        digest = base64.b64encode(hashlib.sha1(PASSWORD.encode()).digest()).decode()
        (self.dir / "htpasswd").write_text(f"{USER}:{{SHA}}{digest}\n")
        tls = f"""
        ssl_certificate {self.dir}/server.pem;
        ssl_certificate_key {self.dir}/server.pem;
        ssl_client_certificate {self.ca};
        ssl_verify_client on;"""
        return f"""
daemon off;
master_process off;
worker_processes 1;
pid {self.dir}/nginx.pid;
error_log {self.log} info;
events {{ worker_connections 256; }}
http {{
    access_log {self.dir}/access.log;
    client_body_temp_path {self.dir}/body;
    proxy_temp_path {self.dir}/proxy;
    fastcgi_temp_path {self.dir}/fastcgi;
    uwsgi_temp_path {self.dir}/uwsgi;
    scgi_temp_path {self.dir}/scgi;
    server {{
        listen 127.0.0.1:{self.basic_port} ssl;{tls}
        location / {{
            auth_basic "registry";
            auth_basic_user_file {self.dir}/htpasswd;
            proxy_pass {self.upstream};
        }}
    }}
    server {{
        listen 127.0.0.1:{self.bearer_port} ssl;{tls}
        location / {{
            if ($http_authorization != "Bearer {TOKEN}") {{ return 401; }}
            proxy_pass {self.upstream};
        }}
    }}
}}
"""

    def start(self) -> RegistryGateway:
        (self.dir / "nginx.conf").write_text(self._config())
        argv = [
            str(nginx()),
            "-p",
            str(self.dir),
            "-c",
            str(self.dir / "nginx.conf"),
            "-e",
            str(self.log),
        ]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out)
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    got = httpx.get(
                        self.url("basic") + "/subjects",
                        verify=context,
                        auth=(USER, PASSWORD),
                        timeout=5,
                    )
                    if got.status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                if not self.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"nginx did not come up: {self.log_tail()}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
