"""The JVM parts tablecast runs: resolved with Maven, cached, never committed.

Two jar sets, each described by a pom under ``tablecast/_jvm/`` (inside the
package, so an installed wheel has them):

- ``kafka-broker``: the Apache Kafka broker that ``tablecast kafka start`` runs;
- ``spark-kafka``: Spark's Kafka source and sink, passed to Spark on ``spark.jars``.

They stay apart because the broker and Spark's connector need different
``kafka-clients`` versions. ``spark-kafka`` also holds tablecast's own
producer interceptor (``_jvm/interceptors``), compiled with ``javac`` against
the connector's ``kafka-clients`` on first use: without a JDK there is no jar
set, since table records would otherwise carry the time they were written
instead of their input's. ``_jvm/hadoop`` holds the local file system a local
session checkpoints through (compiled against PySpark's Hadoop, put on the
driver's class path; optional). Each set is copied into
``~/.cache/tablecast/jars/<name>-<hash of its pom>`` once; a changed pom gets a
fresh directory, so the cache never serves stale jars.

Java is the one of ``JAVA_HOME`` when that is set, else the one on ``PATH``;
:func:`require_java` checks it is Java 17 or newer. Maven runs with the user's
own settings when they name a mirror, so a company mirror or proxy wins; only
where no settings name one does every lookup go to Maven Central
(``_jvm/settings.xml``: Spark's parent pom names repositories that are often
unreachable).

This module needs only the standard library: the image build runs it as a file.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

log = logging.getLogger(__name__)

# the cache key hashes the poms' bytes, not their place: moving them kept the cache
POM_ROOT = Path(__file__).resolve().parent / "_jvm"
JAR_SETS = ("kafka-broker", "spark-kafka")
#: what each set is for, in the progress lines of a fetch
PURPOSE = {"kafka-broker": "the Kafka broker", "spark-kafka": "Spark's Kafka connector"}

MIN_JAVA = 17
#: the JIT and the collector of the JVMs ``tablecast dev`` and ``demo`` start (broker,
#: Spark): C1 alone, since a Spark driver in local mode keeps C2 compiling for minutes (each
#: micro-batch runs code not run before), and on a few cores that comes out of every batch;
#: the serial collector, since a development driver's heap is small and G1's concurrent
#: threads cost more CPU than its pauses would. C1 code is slower at full throughput,
#: which a development pipeline seldom runs at. With C1 alone the JVM reserves 48 MB for
#: compiled code, which a running driver fills within a minute and then stops compiling
#: ("CodeCache is full"), so the code cache gets the size it has with both compilers.
QUICK_JVM = {
    "-XX:TieredStopAtLevel=1": r"TieredStopAtLevel",
    "-XX:+UseSerialGC": r"\+Use\w+GC",
    "-XX:ReservedCodeCacheSize=240m": r"ReservedCodeCacheSize",
}


def use_quick_jvm() -> None:
    """Give every JVM this process starts from now on :data:`QUICK_JVM`'s options, beside
    whatever ``JDK_JAVA_OPTIONS`` already holds; an option whose pattern matches what that
    holds (a JIT or a collector chosen there) is left out."""
    given = os.environ.get("JDK_JAVA_OPTIONS", "")
    extra = [option for option, chosen in QUICK_JVM.items() if not re.search(chosen, given)]
    os.environ["JDK_JAVA_OPTIONS"] = " ".join([given, *extra]).strip()


INSTALL_JDK = (
    f"install a JDK {MIN_JAVA} or newer (e.g. Debian's openjdk-{MIN_JAVA}-jdk-headless) "
    "and set JAVA_HOME to it"
)
#: how often a Maven fetch that is still running says so
HEARTBEAT_S = 15.0


class JavaMissing(RuntimeError):
    """No usable Java or javac here: the message names what was found and what to install."""


def _say(message: str) -> None:
    """Progress of a fetch or compile, on stderr whatever logging is set up (``./run setup``
    sets up none)."""
    print(f"[tablecast] {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("TABLECAST_CACHE_DIR", Path.home() / ".cache" / "tablecast"))


# -- Java ---------------------------------------------------------------------------------


def find_tool(tool: str) -> Path | None:
    """`tool` (``java``, ``javac``) of ``JAVA_HOME`` when it is set, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        path = Path(home) / "bin" / tool
        return path if path.is_file() and os.access(path, os.X_OK) else None
    found = shutil.which(tool)
    return Path(found) if found else None


def _where() -> str:
    home = os.environ.get("JAVA_HOME")
    return f"JAVA_HOME={home}" if home else "PATH"


_VERSION = re.compile(r'(?:version "|javac )(\d+)(?:\.(\d+))?')


def major_version(text: str) -> int | None:
    """The feature version that ``java -version`` or ``javac -version`` printed (8 for
    the old style "1.8.0_392"), or None if `text` holds none."""
    found = _VERSION.search(text)
    if found is None:
        return None
    major = int(found.group(1))
    if major == 1 and found.group(2):
        major = int(found.group(2))
    return major


@functools.cache
def _version(tool: Path) -> tuple[int | None, str]:
    """(major version, the first line it printed) of a ``java`` or ``javac``."""
    try:
        done = subprocess.run([str(tool), "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    said = (done.stderr + done.stdout).strip()
    major = major_version(said)
    lines = [line for line in said.splitlines() if "version" in line or line.startswith("javac")]
    return major, (lines or said.splitlines() or ["nothing"])[0]


def _checked(tool: str, needed_for: str) -> Path:
    found = find_tool(tool)
    if found is None:
        if os.environ.get("JAVA_HOME"):
            where = f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/{tool}"
        else:
            where = f"no {tool} on PATH (and JAVA_HOME is not set)"
        raise JavaMissing(f"{where}: {needed_for}: {INSTALL_JDK}")
    major, said = _version(found)
    if major is None:
        raise JavaMissing(f"{found} (from {_where()}) printed no version ({said!r}): {INSTALL_JDK}")
    if major < MIN_JAVA:
        raise JavaMissing(
            f"{found} (from {_where()}) is Java {major}; tablecast needs Java {MIN_JAVA} "
            f"or newer: {INSTALL_JDK}"
        )
    return found


def require_java(compiler: bool = False) -> Path:
    """The ``java`` every JVM of this process and its children runs, checked to be Java 17
    or newer (and, with `compiler`, a ``javac`` beside it); raise :class:`JavaMissing`.

    The broker is started as plain ``java`` and Spark takes ``JAVA_HOME``'s: a
    ``JAVA_HOME`` java is put first on PATH so that both run the one checked.
    """
    java = _checked("java", "the Kafka broker and Spark run on Java")
    if compiler:
        _checked(
            "javac",
            "the pipeline compiles its record-timestamp interceptor with javac (without it, "
            "table records would carry the time they were written, not their input's)",
        )
    if os.environ.get("JAVA_HOME"):
        path = os.environ.get("PATH", "")
        if path.split(os.pathsep)[0] != str(java.parent):
            os.environ["PATH"] = os.pathsep.join([str(java.parent), path])
    return java


# -- jar sets -----------------------------------------------------------------------------


def _target(name: str, root: Path = POM_ROOT) -> Path:
    pom = root / name / "pom.xml"
    if not pom.exists():
        raise FileNotFoundError(f"no pom for jar set {name!r} at {pom}")
    digest = hashlib.sha256(pom.read_bytes() + (POM_ROOT / "settings.xml").read_bytes())
    return cache_root() / "jars" / f"{name}-{digest.hexdigest()[:12]}"


def jar_dir(name: str, root: Path = POM_ROOT) -> Path:
    """The directory holding jar set `name` (the pom at `root`/`name`: tablecast's own, or
    one of the tests'), resolving it with Maven on first use."""
    target = _target(name, root)
    if (target / ".complete").exists():
        return target
    _resolve(name, root / name / "pom.xml", target)
    return target


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _mirrors(settings: Path) -> list[str] | None:
    """The ids of the mirrors a Maven settings file names (None: not readable as XML).
    A blocked mirror serves nothing (Maven's own conf/settings.xml blocks plain-HTTP
    repositories with one): it is not a mirror the user chose."""
    try:
        root = ET.parse(settings).getroot()
    except (ET.ParseError, OSError):
        return None
    found = []
    for element in root.iter():
        if _local(element.tag) == "mirror":
            fields = {_local(c.tag): (c.text or "").strip() for c in element}
            if fields.get("blocked", "").lower() != "true":
                found.append(fields.get("id") or "?")
    return found


def _with_central(user: Path) -> Path:
    """A copy of the user's settings (their proxies, servers and profiles kept) with
    tablecast's mirror to Maven Central added: for users whose settings name no mirror."""
    tree = ET.parse(user)
    root = tree.getroot()
    ns = root.tag[1:].split("}", 1)[0] if root.tag.startswith("{") else ""

    def q(tag: str) -> str:
        return f"{{{ns}}}{tag}" if ns else tag

    if ns:
        ET.register_namespace("", ns)  # written without a prefix, as Maven expects
    mirrors = next((e for e in root if _local(e.tag) == "mirrors"), None)
    if mirrors is None:
        mirrors = ET.SubElement(root, q("mirrors"))
    for ours in ET.parse(POM_ROOT / "settings.xml").getroot().iter("mirror"):
        mirror = ET.SubElement(mirrors, q("mirror"))
        for field in ours:
            ET.SubElement(mirror, q(field.tag)).text = field.text
    text = ET.tostring(root, encoding="unicode", xml_declaration=True)
    merged = (
        cache_root() / "maven" / f"settings-{hashlib.sha256(text.encode()).hexdigest()[:12]}.xml"
    )
    if not merged.exists():
        merged.parent.mkdir(parents=True, exist_ok=True)
        partial = merged.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(text)
        partial.rename(merged)
    return merged


def maven_settings(mvn: str) -> tuple[list[str], str]:
    """(the settings arguments for `mvn`, where lookups go) — the user's settings win.

    Maven reads the user's ``~/.m2/settings.xml`` and its installation's
    ``conf/settings.xml`` (``-s``/``-gs`` in ``MAVEN_ARGS`` replace them). If
    either names a mirror, Maven runs with them as they are. If neither does,
    lookups go to Maven Central through tablecast's mirror: added to a copy of
    the user's settings when there is one, else tablecast's settings alone.
    """
    given = shlex.split(os.environ.get("MAVEN_ARGS", ""))
    if any(a.split("=", 1)[0] in ("-s", "--settings", "-gs", "--global-settings") for a in given):
        return [], "the settings given in MAVEN_ARGS"
    user = Path.home() / ".m2" / "settings.xml"
    installed = Path(os.path.realpath(mvn)).parent.parent / "conf" / "settings.xml"
    for settings in (user, installed):
        if not settings.is_file():
            continue
        mirrors = _mirrors(settings)
        if mirrors is None:  # Maven reports what is wrong with it better than a guess here
            return [], f"your Maven settings ({settings})"
        if mirrors:
            return [], f"mirror {mirrors[0]!r} of your Maven settings ({settings})"
    if user.is_file():
        return ["-s", str(_with_central(user))], f"Maven Central, with your settings ({user})"
    return ["-s", str(POM_ROOT / "settings.xml")], "Maven Central"


def _resolve(name: str, pom: Path, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            "Maven (mvn) is needed once to fetch the JVM jars: install it "
            "(e.g. Debian's maven package)"
        )
    settings, source = maven_settings(mvn)
    _say(f"fetching the jars of {name} ({PURPOSE.get(name, name)}), once, from {source} ...")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    output = target.with_name(f"{name}.mvn.log")
    cmd = [
        mvn,
        "-q",
        "-B",
        *settings,
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={partial}",
        "-DincludeScope=runtime",
    ]
    started = time.monotonic()
    with open(output, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            while True:
                try:
                    code = proc.wait(HEARTBEAT_S)
                    break
                except subprocess.TimeoutExpired:
                    _say(f"... still fetching {name} ({time.monotonic() - started:.0f} s)")
        except BaseException:  # Ctrl-C: stop our Maven, by its pid
            proc.kill()
            proc.wait()
            raise
    if code != 0:
        lines = [line.strip() for line in output.read_text(errors="replace").splitlines()]
        errors = [line.removeprefix("[ERROR]").strip() for line in lines if "[ERROR]" in line]
        why = next((e for e in errors if e), next((x for x in reversed(lines) if x), "no output"))
        raise RuntimeError(
            f"Maven could not fetch the jars of {name} (mvn exit {code}): {why} "
            f"(its output: {output})"
        )
    jars = sorted(partial.glob("*.jar"))
    size = sum(j.stat().st_size for j in jars)
    (partial / ".complete").write_text("ok\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    _say(
        f"{name}: {len(jars)} jars, {size / 1e6:.1f} MB, in {target} "
        f"({time.monotonic() - started:.0f} s)"
    )


#: the producer interceptor that moves the pipeline's timestamp header into the record
TIMESTAMP_INTERCEPTOR = "tablecast.kafka.TimestampFromHeader"
INTERCEPTOR_NEEDS_JAVAC = (
    "the pipeline compiles its record-timestamp interceptor with javac (without it, table "
    "records would carry the time they were written, not their input's)"
)


def interceptor_jar() -> Path:
    """tablecast's producer interceptors as a jar, compiled once; raise
    :class:`JavaMissing` when it needs compiling and there is no javac."""
    kafka = sorted(jar_dir("spark-kafka").glob("kafka-clients-*.jar"))
    jar = _compiled("interceptors", kafka, INTERCEPTOR_NEEDS_JAVAC, required=True)
    if jar is None:  # required: _compiled raised already
        raise JavaMissing(f"no javac: {INTERCEPTOR_NEEDS_JAVAC}: {INSTALL_JDK}")
    return jar


def interceptor_compiled() -> bool:
    """Whether the interceptor jar is compiled already (then no javac is needed)."""
    target = _target("spark-kafka")
    if not (target / ".complete").exists():
        return False
    return _compiled_jar("interceptors", sorted(target.glob("kafka-clients-*.jar"))).exists()


GROUPED_TABLES_NEED_JAVAC = (
    "the pipeline compiles the processors of table group_bys whose functions are Columns with javac"
)


def pyspark_jars(pattern: str = "*.jar") -> list[Path]:
    """The jars PySpark ships (those named by `pattern`); it serves Spark sessions, so a
    caller that needs them has PySpark."""
    import pyspark

    return sorted((Path(pyspark.__file__).parent / "jars").glob(pattern))


def grouped_tables_jar() -> Path:
    """tablecast's transformWithState processors of a table group_by folded in the JVM, as a
    jar, compiled once against PySpark's jars; raise :class:`JavaMissing` without a javac."""
    jar = _compiled("grouped-tables", pyspark_jars(), GROUPED_TABLES_NEED_JAVAC, required=True)
    assert jar is not None  # required: _compiled raised already
    return jar


def pipeline_jars_compiled() -> bool:
    """Whether every jar the pipeline compiles is compiled already (then no javac is needed)."""
    try:
        spark = pyspark_jars()
    except ImportError:  # a node-only install: it runs no pipeline
        return interceptor_compiled()
    return interceptor_compiled() and _compiled_jar("grouped-tables", spark).exists()


def hadoop_jar() -> Path | None:
    """tablecast's Hadoop file system as a jar, compiled once (None without a JDK). It goes
    on the driver's class path, not on ``spark.jars``: Hadoop loads file systems there."""
    hadoop = pyspark_jars("hadoop-client-api-*.jar")
    return _compiled(
        "hadoop",
        hadoop,
        "local checkpoints go through Hadoop's checksummed local file system and "
        "Spark's default manager",
    )


def _compiled_jar(name: str, classpath: list[Path]) -> Path:
    """Where the jar of the sources under ``_jvm/<name>`` compiled against `classpath` goes:
    one per sources and class path."""
    sources = sorted((POM_ROOT / name).glob("*.java"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources))
    digest.update(" ".join(p.name for p in classpath).encode())
    return cache_root() / "jars" / f"{name}-{digest.hexdigest()[:12]}" / f"tablecast-{name}.jar"


def _compiled(
    name: str, classpath: list[Path], without: str, required: bool = False
) -> Path | None:
    """The Java sources under ``_jvm/<name>`` compiled against `classpath` into a jar, once.
    Without a javac: raise :class:`JavaMissing` if `required`, else warn that `without`
    follows and return None."""
    jar = _compiled_jar(name, classpath)
    if jar.exists():
        return jar
    javac = find_tool("javac")
    if javac is None:
        if required:
            raise JavaMissing(f"no javac (from {_where()}): {without}: {INSTALL_JDK}")
        log.warning("no javac (a JDK) here: %s", without)
        return None
    import tempfile
    import zipfile

    _say(f"compiling tablecast's {name} with {javac} (once) ...")
    sources = sorted((POM_ROOT / name).glob("*.java"))
    with tempfile.TemporaryDirectory(prefix="tablecast-javac-") as tmp:
        cp = os.pathsep.join(map(str, classpath))
        cmd = [str(javac), "--release", "17", "-cp", cp, "-d", tmp, *map(str, sources)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"javac failed for {POM_ROOT / name}:\n{done.stderr[-3000:]}")
        jar.parent.mkdir(parents=True, exist_ok=True)
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
        found.append(interceptor_jar())
        found.append(grouped_tables_jar())
    return found


def classpath(name: str) -> str:
    return os.pathsep.join(str(p) for p in jars(name))


# -- class-data archives -------------------------------------------------------------------
# A JVM that maps the classes it loaded last time from an archive starts in about two thirds
# of the CPU time. The first JVM on a classpath writes the archive at its exit; a mismatch
# (another Java build, say) only makes the JVM warn and load its classes as usual.


def class_archive(classpath: str) -> Path:
    """Where the class-data archive of JVMs running on `classpath` is kept: one per Java,
    classpath and options from the environment, since the JVM refuses an archive made by
    another Java or classpath, or with laxer bytecode verification."""
    java = require_java()
    said = _version(java)[1]
    options = [os.environ.get(name, "") for name in ("JDK_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS")]
    # the JVM also checks each jar's size and time: fetched anew, they need a new archive
    jars = [f"{s.st_size}:{s.st_mtime_ns}" for s in map(_stat, classpath.split(os.pathsep)) if s]
    text = "\n".join([str(java.resolve()), said, classpath, *options, *jars])
    key = hashlib.sha256(text.encode())
    return cache_root() / "class-archives" / f"{key.hexdigest()[:12]}.jsa"


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def class_archive_options(classpath: str, dump_to: Path | None = None) -> list[str]:
    """The options that start a JVM from `classpath`'s archive, or, while there is none and
    `dump_to` is given, make it write one there at its exit (see :func:`keep_class_archive`)."""
    archive = class_archive(classpath)
    if archive.exists():
        return [f"-XX:SharedArchiveFile={archive}"]
    return [] if dump_to is None else [f"-XX:ArchiveClassesAtExit={dump_to}"]


def keep_class_archive(classpath: str, dumped: Path) -> None:
    """Keep `dumped`, written by a JVM that has since exited cleanly, as `classpath`'s
    archive unless another JVM's is kept already; removes `dumped` either way. The archive
    appears whole or not at all, since JVMs starting meanwhile may read it."""
    if not dumped.exists():
        return
    archive = class_archive(classpath)
    try:
        if not archive.exists():
            archive.parent.mkdir(parents=True, exist_ok=True)
            partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
            shutil.copyfile(dumped, partial)
            os.replace(partial, archive)
    finally:
        dumped.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    """``python -m tablecast.jvm NAME``: the comma-separated jars of set NAME (fetched
    once), for ``spark-submit --jars``; with ``--classpath``, joined as a classpath.
    ``hadoop``: the jar of tablecast's local file system, for ``--driver-class-path``."""
    names = [a for a in argv if not a.startswith("-")] or ["spark-kafka"]
    try:
        if names == ["hadoop"]:
            jar = hadoop_jar()
            print(jar or "")
            return 0 if jar is not None else 1
        if len(names) != 1 or names[0] not in JAR_SETS:
            sets = "|".join((*JAR_SETS, "hadoop"))
            print(f"usage: python -m tablecast.jvm [--classpath] {{{sets}}}", file=sys.stderr)
            return 2
        sep = os.pathsep if "--classpath" in argv else ","
        print(sep.join(str(p) for p in jars(names[0])))
    except (RuntimeError, OSError) as e:  # JavaMissing and Maven's failure included
        lines = [line for line in str(e).splitlines() if line.strip()]
        print(f"tablecast: error: {lines[0] if lines else e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main(sys.argv[1:]))
