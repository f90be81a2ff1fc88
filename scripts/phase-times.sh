# Sourced by the build and test scripts: `phase NAME COMMAND...` runs COMMAND
# and, when FLASHSAMPLER_PHASE_LOG names a file, appends "NAME SECONDS" to it,
# also when COMMAND fails (the failure is still returned). .ci/run prints the
# file as a table at its end, so CI's time per phase is known at every run.
phase() {
  local name="$1" start=$SECONDS status=0
  shift
  "$@" || status=$?
  if [ -n "${FLASHSAMPLER_PHASE_LOG:-}" ]; then
    echo "$name $((SECONDS - start))$([ "$status" -eq 0 ] || echo " (failed)")" >>"$FLASHSAMPLER_PHASE_LOG"
  fi
  return "$status"
}
