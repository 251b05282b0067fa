#!/usr/bin/env bash
# The search for a cheaper unstable setting (mx_proxy.experiments.unstable_search) on a GPU, from the source
# tree, no network:
#
#   scripts/gpu_search.sh [SECONDS] [WORK] [OPTIONS...]
#
# Starts from the committed table (results/unstable_search.csv, copied to WORK/unstable_search.csv unless WORK
# already has one), so the settings it decided are not trained again, and runs
# `python -m mx_proxy.experiments.unstable_search --out WORK --table WORK/unstable_search.csv [OPTIONS...]`
# for at most SECONDS (default 480) into WORK (default /tmp/proxy-search); a second call resumes from WORK's
# run stores. The table is rewritten after each stage and copied to $OUT/results/unstable_search.csv when $OUT
# is set (the device machine's output folder), else to results/unstable_search.csv; then the search's status
# (the table, and where each undecided setting stands) is printed and kept in WORK/status.txt. A stage the time
# limit cut short is trained again by the next call on a fresh machine: only decided settings are carried.
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT="${1:-480}"
WORK="${2:-/tmp/proxy-search}"
DEST="${OUT:-.}/results/unstable_search.csv"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -c 'import jax; print("jax", jax.__version__, "devices", jax.devices())'
mkdir -p "$WORK"
if [ ! -f "$WORK/unstable_search.csv" ] && [ -f results/unstable_search.csv ]; then
  cp results/unstable_search.csv "$WORK/unstable_search.csv"
fi
START=$(date +%s)
timeout --signal=INT "$LIMIT" python -m mx_proxy.experiments.unstable_search --out "$WORK" \
  --table "$WORK/unstable_search.csv" "${@:3}"
STATUS=$?
echo "unstable search exit status $STATUS after $(( $(date +%s) - START )) s (124/130: time limit reached, rerun to resume)"
if [ -f "$WORK/unstable_search.csv" ]; then
  mkdir -p "$(dirname "$DEST")"
  cp "$WORK/unstable_search.csv" "$DEST.tmp" && mv "$DEST.tmp" "$DEST"
  python -m mx_proxy.experiments.unstable_search --out "$WORK" --table "$WORK/unstable_search.csv" --status \
    | tee "$WORK/status.txt" || true
fi
