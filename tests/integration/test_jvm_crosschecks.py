"""What the Python side computes, checked against the JVM's own answer: Kafka's murmur2,
the checkpoint file system's jar (javac), and a JKS truststore made by keytool. These start
a JVM, so they live here rather than in the fast lane."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from cryptography import x509

from tablecast import jvm
from tablecast.contract.partitioner import murmur2
from tablecast.kafka.config import KafkaConfig, KafkaConfigError
from tablecast.kafka.secure import make_certificates


def test_murmur2_matches_the_java_implementation(tmp_path: Path) -> None:
    """300 random keys hashed by Kafka's own Utils.murmur2 in a JVM, compared with ours."""
    rng = random.Random(7)
    keys = [rng.randbytes(rng.randint(0, 40)) for _ in range(300)]
    src = tmp_path / "Murmur.java"
    src.write_text(
        "import org.apache.kafka.common.utils.Utils;\n"
        "public class Murmur { public static void main(String[] a) throws Exception {\n"
        "  java.io.BufferedReader r = new java.io.BufferedReader("
        "new java.io.InputStreamReader(System.in));\n"
        "  String line; while ((line = r.readLine()) != null) {\n"
        "    byte[] b = java.util.HexFormat.of().parseHex(line.trim());\n"
        "    System.out.println(Utils.murmur2(b)); } } }\n"
    )
    cp = jvm.classpath("kafka-broker")
    done = subprocess.run(
        ["java", "-cp", cp, str(src)],
        input="\n".join(k.hex() for k in keys) + "\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    java = [int(x) for x in done.stdout.split()]
    assert java == [murmur2(k) for k in keys]


def test_the_jar_is_compiled_once_and_named_for_spark_submit(capsys) -> None:  # type: ignore[no-untyped-def]
    jar = jvm.hadoop_jar()
    if jar is None:  # no JDK: sessions keep Hadoop's default (unit/test_checkpoint_conf.py)
        pytest.skip("no javac here")
    assert jvm.hadoop_jar() == jar
    with zipfile.ZipFile(jar) as z:
        assert "tablecast/hadoop/UncheckedLocalFileSystem.class" in z.namelist()
    assert jvm.main(["hadoop"]) == 0
    assert capsys.readouterr().out.strip() == str(jar)


@pytest.mark.skipif(shutil.which("keytool") is None, reason="keytool (Java) is not installed")
def test_jks_truststore_from_keytool_becomes_pem(tmp_path: Path) -> None:
    ca_pem, _ = make_certificates(["127.0.0.1"])
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text(ca_pem)
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
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


def test_quick_jvms_keep_room_to_compile() -> None:
    """The development JVMs run C1 alone, for which Java reserves only 48 MB of code cache: a
    Spark driver filled that within a minute of the demo and stopped compiling. The options
    give it the room a JVM with both compilers has."""
    done = subprocess.run(
        ["java", *jvm.QUICK_JVM, "-XX:+PrintFlagsFinal", "-version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "JDK_JAVA_OPTIONS": ""},
    )
    assert done.returncode == 0, done.stderr
    flags = {p[1]: p[3] for line in done.stdout.splitlines() if len(p := line.split()) >= 4}
    assert flags["TieredStopAtLevel"] == "1"
    assert int(flags["ReservedCodeCacheSize"]) >= 240 * 1024 * 1024
