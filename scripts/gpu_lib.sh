# What every scripts/gpu_*.sh does around its one training command (sourced, not run).

# The device, printed; the source tree first on PYTHONPATH (the GPU machine runs from it, with no install).
gpu_start() {
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  python -c 'import jax; print("jax", jax.__version__, "devices", jax.devices())'
}

# gpu_timed LABEL LIMIT COMMAND...: COMMAND for at most LIMIT seconds (then SIGINT, which the trainers turn into a
# checkpoint and a clean stop), and a line with its exit status and duration.
gpu_timed() {
  local label="$1" limit="$2" start status
  shift 2
  start=$(date +%s)
  timeout --signal=INT "$limit" "$@"
  status=$?
  echo "$label exit status $status after $(( $(date +%s) - start )) s (124/130: time limit reached, rerun to resume)"
}

# gpu_export RESULTS DEST WORK: an ensemble's exports (RESULTS, its results folder) copied to DEST, and its report
# (`mx-proxy report`) printed and kept in WORK/report.md; nothing where RESULTS holds no ensemble yet.
gpu_export() {
  [ -f "$1/ensemble.json" ] || return 0
  mkdir -p "$2"
  cp -r "$1/." "$2/"
  python -m mx_proxy.cli report "$2" | tee "$3/report.md" || true
}
