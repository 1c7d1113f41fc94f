#!/usr/bin/env bash
# The built wheel, installed into a fresh virtualenv outside the repository,
# gives a working `tablecast`: alone (at most 150 MB, no PySpark) it serves a node
# and says which extra the demo needs; with [pipeline], `tablecast demo` starts
# (broker, Spark pipeline, node, generator), prints its curl lines, answers them,
# and stops on SIGTERM.
#
#   tools/wheel_smoke.sh            build the wheel (python -m build) and check it
#   WHEEL=dist/x.whl tools/wheel_smoke.sh   check a wheel built already
#
# Needs python3 with venv, Java 17, and the JVM jars in ~/.cache/tablecast (or
# Maven to fetch them once). pip's cache makes reinstalling PySpark fast.
set -euo pipefail
unset PYTHONDONTWRITEBYTECODE  # as ./run: each module's bytecode is written on first import
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
work=$(mktemp -d /tmp/tablecast-wheel-smoke.XXXXXX)
demo_pid=""
cleanup() {
  if [ -n "$demo_pid" ] && kill -0 "$demo_pid" 2>/dev/null; then
    kill -TERM "$demo_pid" 2>/dev/null || true
    sleep 20
    kill -KILL "$demo_pid" 2>/dev/null || true
  fi
  # whatever the demo left behind (found by this run's own directory), by pid
  for pid in $(pgrep -f "$work/" || true); do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
start=$(date +%s)
say() { echo "[wheel-smoke $(( $(date +%s) - start ))s] $*"; }

if [ -z "${WHEEL:-}" ]; then
  builder="$repo/.venv/bin/python"
  [ -x "$builder" ] || builder=$py
  say "building the sdist and the wheel from it ..."
  "$builder" -m build -o "$work/dist" "$repo" > "$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log"; exit 1; }
  WHEEL=$(ls "$work"/dist/tablecast-*.whl)
fi
say "wheel: $(basename "$WHEEL") ($(( $(stat -c %s "$WHEEL") / 1024 )) kB)"

say "installing it alone (a serving node, the Client, the CLI) into a fresh virtualenv ($work/venv) ..."
"$py" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$WHEEL"
cd "$work"  # nothing of the repository on the path
unset PYTHONPATH
where=$("$work/venv/bin/python" -c "import tablecast, os; print(os.path.dirname(tablecast.__file__))")
case "$where" in
  "$work"/venv/*) say "tablecast imports from $where" ;;
  *) echo "FAIL: tablecast imported from $where, not from the new virtualenv"; exit 1 ;;
esac
size=$(du -sm "$work"/venv/lib/python*/site-packages | cut -f1)
say "site-packages of the plain install: $size MB"
[ "$size" -le 150 ] || { echo "FAIL: the plain install takes $size MB (at most 150)"; exit 1; }
"$work/venv/bin/python" -c "
import importlib.util as u
extra = [m for m in ('pyspark', 'pandas', 'pyarrow', 'granian', 'grpc') if u.find_spec(m)]
assert not extra, f'the plain install has {extra}'" || { echo "FAIL: extras in the plain install"; exit 1; }
say "$("$work/venv/bin/tablecast" --version)"
set +e
"$work/venv/bin/tablecast" demo > "$work/nodemo.out" 2> "$work/nodemo.err" < /dev/null
code=$?
set -e
if [ "$code" != 1 ] || [ "$(wc -l < "$work/nodemo.err")" != 1 ] \
    || ! grep -q "^tablecast: error: .*pip install 'tablecast\[pipeline\]'" "$work/nodemo.err"; then
  echo "FAIL: without the pipeline extra, demo exited $code and said:"; cat "$work/nodemo.err"; exit 1
fi
say "without the extra, demo says: $(cat "$work/nodemo.err")"

free_port() { "$work/venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
kport=$(free_port)

say "a serving node from the plain install, on a dev broker (port $kport) ..."
"$work/venv/bin/tablecast" kafka start --port "$kport" --data-dir "$work/kafka" > "$work/kafka.out" 2>&1 \
  || { echo "FAIL: kafka start"; tail -20 "$work/kafka.out"; exit 1; }
"$work/venv/bin/tablecast" serve --app smoke --bootstrap-servers "127.0.0.1:$kport" --port "$port" \
  --data-dir "$work/node" > "$work/node.out" 2>&1 < /dev/null &
node_pid=$!
node_ok=""
for _ in $(seq 1 60); do
  # /healthz, not /readyz: an app that never published a table has no catalog to load
  if curl -sf "http://127.0.0.1:$port/healthz" > /dev/null 2>&1 \
      && curl -sf "http://127.0.0.1:$port/v1/tables" | grep -q '"tables"'; then
    node_ok=1; break
  fi
  kill -0 "$node_pid" 2>/dev/null || break
  sleep 1
done
kill -TERM "$node_pid" 2>/dev/null || true
wait "$node_pid" || true
"$work/venv/bin/tablecast" kafka stop --data-dir "$work/kafka" > /dev/null 2>&1 || true
[ -n "$node_ok" ] || { echo "FAIL: the node never answered /healthz and /v1/tables"; tail -30 "$work/node.out"; exit 1; }
say "the node answered /healthz and /v1/tables, and stopped on SIGTERM"

say "adding the pipeline extra for the demo ..."
# as ./run installs it: imports compile what they use
"$work/venv/bin/python" -m pip install -q --no-compile "$WHEEL[pipeline]"
say "site-packages with [pipeline]: $(du -sm "$work"/venv/lib/python*/site-packages | cut -f1) MB"
port=$(free_port)
kport=$(free_port)
say "tablecast demo --port $port --kafka-port $kport ..."
"$work/venv/bin/tablecast" demo --port "$port" --kafka-port "$kport" --data-dir "$work/demo" \
  > "$work/demo.out" 2> "$work/demo.err" < /dev/null &
demo_pid=$!
for _ in $(seq 1 480); do
  grep -q "curl .*/keys/" "$work/demo.out" 2>/dev/null && break
  kill -0 "$demo_pid" 2>/dev/null || { echo "FAIL: demo exited"; tail -40 "$work/demo.err"; exit 1; }
  sleep 1
done
grep -q "curl .*/keys/" "$work/demo.out" || {
  echo "FAIL: no curl lines after 480 s"; tail -40 "$work/demo.err"; exit 1; }
say "the demo printed:"
grep "curl " "$work/demo.out"
status=0
while read -r url; do
  # a watch line (curl -N) streams until stopped: its first seconds are enough
  code=$(curl -s --max-time 5 -o "$work/answer" -w '%{http_code}' "$url" || true)
  echo "  $url -> $code $(head -c 200 "$work/answer")"
  [ "$code" = 200 ] || status=1
done < <(grep -o "curl \(-N \)\?[^ ]*" "$work/demo.out" | awk '{print $NF}')
[ "$status" = 0 ] || { echo "FAIL: a curl line did not answer 200"; exit 1; }

say "SIGTERM to the demo (pid $demo_pid) ..."
kill -TERM "$demo_pid"
for _ in $(seq 1 30); do
  kill -0 "$demo_pid" 2>/dev/null || break
  sleep 1
done
if kill -0 "$demo_pid" 2>/dev/null; then echo "FAIL: demo still running 30 s after SIGTERM"; exit 1; fi
wait "$demo_pid" || true
demo_pid=""
# nothing it started may outlive it (broker, pipeline, node, generator); Spark's Python
# workers are the JVM's children and leave once it has gone, so give them a few seconds
for _ in $(seq 1 10); do
  pgrep -f "$work/" > /dev/null || break
  sleep 1
done
if pgrep -f "$work/" > /dev/null; then
  echo "FAIL: processes of the demo outlived it by 10 s:"; pgrep -af "$work/"; exit 1
fi
say "OK: built, installed, demo answered, stopped by SIGTERM"
