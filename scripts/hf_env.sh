#!/usr/bin/env bash
# The environment of the Hugging Face test (client/python/tests_hf, ctest
# hf_generate_test): a venv at ${1:-build/hfenv} on Debian's /usr/bin/python3
# with --system-site-packages, so that it sees Debian's CPU torch
# (python3-torch 1.13, installed here with apt: PyPI's torch wheels pull in
# gigabytes of CUDA libraries), plus, from PyPI, a transformers release that
# still runs on torch 1.13 (pinned below) and client/python.
# Reinstalls only when the client, the test or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir="${1:-build/hfenv}"
# 4.46.3 (2024-11): a release that still supports torch 1.x and runs on
# Debian 12's torch 1.13 with Python 3.11 (client/python/tests_hf passes with
# it; the one workaround, for torch 1.13's broken torch.distributed.fsdp import
# on Python 3.11, is in examples/hf_generate.py). Newer releases were not tried.
transformers_pin="transformers==4.46.3"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ! dpkg -s python3-torch >/dev/null 2>&1; then
  echo "hf_env: installing python3-torch (Debian's CPU torch)" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
fi
stamp_now="$(find client/python scripts/hf_env.sh proto -type f \( -name '*.py' -o -name '*.toml' -o -name '*.proto' -o -name '*.sh' \) \
  -not -name '*_pb2*.py' -not -path '*/build/*' -not -path '*.egg-info*' -print0 | sort -z | xargs -0 sha256sum | sha256sum)"
if [ -x "$env_dir/bin/python" ] && [ "$(cat "$env_dir/.stamp" 2>/dev/null)" = "$stamp_now" ]; then
  exit 0
fi
echo "hf_env: installing client/python and $transformers_pin into $env_dir" >&2
[ -x "$env_dir/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$env_dir"
"$env_dir/bin/pip" install --quiet --disable-pip-version-check --upgrade "./client/python[test]" "$transformers_pin"
"$env_dir/bin/python" -c "import torch, transformers; print('hf_env: torch', torch.__version__, 'transformers', transformers.__version__)" >&2
echo "$stamp_now" >"$env_dir/.stamp"
