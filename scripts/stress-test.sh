#!/usr/bin/env bash
# Runs the CPU test suite ROUNDS times (default 3) in each of its three builds
# (release: scripts/test.sh; ASan+UBSan and TSan: scripts/sanitizers.sh) while
# stress-ng keeps every core busy, and prints a table of test x passes.
#
# Why: CI runs on a 2-core machine that may be shared. A test that only passes
# on an idle machine (a sleep taken for a synchronisation, a wall-clock bound,
# an assumed order between concurrent calls) fails there at random and throws
# away the submission. Run this before changing tests, the batcher, the server
# lifecycle or the load generator (server/README-dev.md).
#
# Usage: scripts/stress-test.sh [ROUNDS] [BUILD...]   BUILD: release asan tsan (default all three)
# Environment: STRESS_WORKERS (stress-ng --cpu workers, default nproc),
#              STRESS_OUT (folder for the JUnit files, default build/stress-test).
# Exit status: 0 when every test passed in every round, 1 otherwise.
# Not part of .ci/run: three rounds of three builds take well over an hour on
# two busy cores.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
shift || true
builds=("$@")
[ ${#builds[@]} -gt 0 ] || builds=(release asan tsan)
workers="${STRESS_WORKERS:-$(nproc)}"
out="${STRESS_OUT:-$PWD/build/stress-test}"
bash scripts/setup.sh
command -v stress-ng >/dev/null || { echo "stress-test: stress-ng is not installed" >&2; exit 1; }

# One ctest pass of BUILD; extra arguments go to ctest (-N: build and list only).
run_build() {
  local build="$1"
  shift
  case "$build" in
    release) bash scripts/test.sh "$@" ;;
    asan | tsan) bash scripts/sanitizers.sh "$build" "$@" ;;
    *) echo "stress-test: unknown build '$build'" >&2; return 2 ;;
  esac
}

# Build everything first, on idle cores (the builds are not what is tested).
for build in "${builds[@]}"; do run_build "$build" -N >/dev/null; done

rm -rf "$out"
mkdir -p "$out"
stress-ng --cpu "$workers" --timeout 0 --quiet &
stress_pid=$!
trap 'kill "$stress_pid" 2>/dev/null || true; wait "$stress_pid" 2>/dev/null || true' EXIT
echo "stress-test: stress-ng --cpu $workers running (pid $stress_pid); $rounds round(s) of: ${builds[*]}"

for ((round = 1; round <= rounds; round++)); do
  for build in "${builds[@]}"; do
    start=$(date +%s)
    if run_build "$build" --output-junit "$out/$build-round$round.xml" >"$out/$build-round$round.log" 2>&1; then
      verdict=passed
    else
      verdict="FAILED (log: $out/$build-round$round.log)"
    fi
    echo "stress-test: round $round $build: $verdict in $(( $(date +%s) - start )) s"
  done
done

kill "$stress_pid" 2>/dev/null || true
wait "$stress_pid" 2>/dev/null || true
trap - EXIT

# The table: one line per (build, test), passes out of rounds; a run whose
# JUnit file is missing (ctest did not get that far) counts as a failure of
# every test it would have run.
python3 - "$out" "$rounds" "${builds[@]}" <<'PY'
import os, sys, xml.etree.ElementTree as ET
out, rounds, builds = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
failed = False
print(f"\n| build | test | passed / {rounds} rounds |\n|---|---|---:|")
for build in builds:
    passes, missing = {}, 0
    for r in range(1, rounds + 1):
        path = os.path.join(out, f"{build}-round{r}.xml")
        if not os.path.exists(path):
            missing += 1
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            name = case.get("name")
            ok = case.get("status") == "run" and case.find("failure") is None and case.find("error") is None
            passes[name] = passes.get(name, 0) + (1 if ok else 0)
    if missing:
        failed = True
        print(f"| {build} | (ctest produced no results in {missing} round(s)) | - |")
    for name in sorted(passes):
        mark = "" if passes[name] == rounds else " **FLAKY**"
        failed |= passes[name] != rounds
        print(f"| {build} | {name} | {passes[name]}{mark} |")
total = "every test passed in every round" if not failed else "some test failed: see the logs in " + out
print(f"\nstress-test: {total}")
sys.exit(1 if failed else 0)
PY
