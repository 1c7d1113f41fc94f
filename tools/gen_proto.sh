#!/usr/bin/env bash
# Regenerate tablecast/proto/tables_pb2.py(i) from tables.proto. grpcio-tools is needed
# only here (it pins a protoc whose generated code needs protobuf >= its version at run
# time: keep pyproject's protobuf floor at the "Protobuf Python Version" it writes).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
"$python" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. tablecast/proto/tables.proto
grep "Protobuf Python Version" tablecast/proto/tables_pb2.py
