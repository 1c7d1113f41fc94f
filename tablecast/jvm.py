"""The JVM parts tablecast runs: resolved from Maven Central, cached, never committed.

Two jar sets, each described by a pom under ``tablecast/_jvm/`` (inside the
package, so an installed wheel has them):

- ``kafka-broker``: the Apache Kafka broker that ``tablecast kafka start`` runs;
- ``spark-kafka``: Spark's Kafka source and sink, passed to Spark on ``spark.jars``.

They stay apart because the broker and Spark's connector need different
``kafka-clients`` versions. ``spark-kafka`` also holds tablecast's own
producer interceptor (``_jvm/interceptors``), compiled with ``javac`` against
the connector's ``kafka-clients`` on first use; ``_jvm/hadoop`` holds the local
file system a local session checkpoints through (compiled against PySpark's
Hadoop, put on the driver's class path). Each set is copied into
``~/.cache/tablecast/jars/<name>-<hash of its pom>`` once; a changed pom gets a
fresh directory, so the cache never serves stale jars.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

# the cache key hashes the poms' bytes, not their place: moving them kept the cache
POM_ROOT = Path(__file__).resolve().parent / "_jvm"
JAR_SETS = ("kafka-broker", "spark-kafka")


def cache_root() -> Path:
    return Path(os.environ.get("TABLECAST_CACHE_DIR", Path.home() / ".cache" / "tablecast"))


def jar_dir(name: str) -> Path:
    """The directory holding jar set `name`, resolving it with Maven on first use."""
    pom = POM_ROOT / name / "pom.xml"
    if not pom.exists():
        raise FileNotFoundError(f"no pom for jar set {name!r} at {pom}")
    digest = hashlib.sha256(pom.read_bytes() + (POM_ROOT / "settings.xml").read_bytes())
    target = cache_root() / "jars" / f"{name}-{digest.hexdigest()[:12]}"
    if (target / ".complete").exists():
        return target
    _resolve(pom, target)
    return target


def _resolve(pom: Path, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven (mvn) is needed once to fetch the JVM jars; install it")
    log.info("fetching jars for %s from Maven Central into %s (once) ...", pom.parent.name, target)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [
        mvn,
        "-q",
        "-B",
        "-s",
        str(POM_ROOT / "settings.xml"),
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={partial}",
        "-DincludeScope=runtime",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mvn failed for {pom}:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    (partial / ".complete").write_text("ok\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


#: the producer interceptor that moves the pipeline's timestamp header into the record
TIMESTAMP_INTERCEPTOR = "tablecast.kafka.TimestampFromHeader"


def interceptor_jar() -> Path | None:
    """tablecast's producer interceptors as a jar, compiled once (None without a JDK)."""
    kafka = sorted(jar_dir("spark-kafka").glob("kafka-clients-*.jar"))
    return _compiled(
        "interceptors",
        kafka,
        "table records carry the time they were written, not the time of the input "
        "record that produced them",
    )


def hadoop_jar() -> Path | None:
    """tablecast's Hadoop file system as a jar, compiled once (None without a JDK). It goes
    on the driver's class path, not on ``spark.jars``: Hadoop loads file systems there."""
    import pyspark  # it serves Spark sessions, so PySpark is there

    hadoop = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    return _compiled(
        "hadoop",
        hadoop,
        "local checkpoints go through Hadoop's checksummed local file system and "
        "Spark's default manager",
    )


def _compiled(name: str, classpath: list[Path], without: str) -> Path | None:
    """The Java sources under ``_jvm/<name>`` compiled against `classpath` into a jar,
    once per sources and class path (None without a JDK: `without` says what follows)."""
    sources = sorted((POM_ROOT / name).glob("*.java"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources))
    digest.update(" ".join(p.name for p in classpath).encode())
    target = cache_root() / "jars" / f"{name}-{digest.hexdigest()[:12]}"
    jar = target / f"tablecast-{name}.jar"
    if jar.exists():
        return jar
    javac = shutil.which("javac")
    if javac is None:
        log.warning("no javac (a JDK) here: %s", without)
        return None
    import tempfile
    import zipfile

    with tempfile.TemporaryDirectory(prefix="tablecast-javac-") as tmp:
        cp = os.pathsep.join(map(str, classpath))
        cmd = [javac, "--release", "17", "-cp", cp, "-d", tmp, *map(str, sources)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"javac failed for {POM_ROOT / name}:\n{done.stderr[-3000:]}")
        target.mkdir(parents=True, exist_ok=True)
        partial = jar.with_suffix(".partial")
        with zipfile.ZipFile(partial, "w") as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for cls in sorted(Path(tmp).rglob("*.class")):
                z.write(cls, cls.relative_to(tmp).as_posix())
        partial.rename(jar)
    return jar


def jars(name: str) -> list[Path]:
    found = sorted(jar_dir(name).glob("*.jar"))
    if name == "spark-kafka":
        own = interceptor_jar()
        found += [own] if own is not None else []
    return found


def classpath(name: str) -> str:
    return os.pathsep.join(str(p) for p in jars(name))


def main(argv: list[str]) -> int:
    """``python -m tablecast.jvm NAME``: the comma-separated jars of set NAME (fetched
    once), for ``spark-submit --jars``; with ``--classpath``, joined as a classpath.
    ``hadoop``: the jar of tablecast's local file system, for ``--driver-class-path``."""
    names = [a for a in argv if not a.startswith("-")] or ["spark-kafka"]
    if names == ["hadoop"]:
        jar = hadoop_jar()
        print(jar or "")
        return 0 if jar is not None else 1
    if len(names) != 1 or names[0] not in JAR_SETS:
        print(f"usage: python -m tablecast.jvm [--classpath] {{{'|'.join((*JAR_SETS, 'hadoop'))}}}")
        return 2
    sep = os.pathsep if "--classpath" in argv else ","
    print(sep.join(str(p) for p in jars(names[0])))
    return 0


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO)
    sys.exit(main(sys.argv[1:]))
