#!/usr/bin/env bash
# Creates (or refreshes) the Python environment the Python client's tests run
# in: a venv at ${1:-build/pyenv} with `client/python` installed from this
# checkout (pip, from PyPI: grpcio, grpcio-health-checking, protobuf, numpy,
# pytest; grpcio-tools to generate the stubs), plus kubernetes-validate,
# pyyaml and jsonschema for the deploy/ checks. Reinstalls only when the client
# sources or the protos changed since the last run.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir="${1:-build/pyenv}"
python=/usr/bin/python3
[ -x "$python" ] || python=python3
stamp_now="$(find client/python proto scripts/python_env.sh -type f \( -name '*.py' -o -name '*.toml' -o -name '*.proto' -o -name '*.sh' \) \
  -not -name '*_pb2*.py' -not -path '*/build/*' -not -path '*.egg-info*' -print0 | sort -z | xargs -0 sha256sum | sha256sum)"
if [ -x "$env_dir/bin/python" ] && [ "$(cat "$env_dir/.stamp" 2>/dev/null)" = "$stamp_now" ]; then
  exit 0
fi
echo "python_env: installing client/python into $env_dir" >&2
[ -x "$env_dir/bin/python" ] || "$python" -m venv "$env_dir"
"$env_dir/bin/pip" install --quiet --disable-pip-version-check --upgrade "./client/python[test]" \
  kubernetes-validate pyyaml jsonschema
echo "$stamp_now" >"$env_dir/.stamp"
