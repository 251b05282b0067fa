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
# (the table, and where each undecided setting stands) is printed and kept in WORK/status.txt. Each setting's
# exported members are carried the same way: the committed results/unstable_search/ is copied to WORK/carried
# (unless WORK already has one), the search carries every finished unit of members there (--carry), and it is
# copied to $OUT/results/unstable_search/ (else results/unstable_search/). So a fresh machine trains only the
# members no machine finished; a unit the time limit cut short is trained again.
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT="${1:-480}"
WORK="${2:-/tmp/proxy-search}"
DEST="${OUT:-.}/results/unstable_search.csv"
CARRY_DEST="${OUT:-.}/results/unstable_search"
. scripts/gpu_lib.sh
gpu_start
mkdir -p "$WORK"
if [ ! -f "$WORK/unstable_search.csv" ] && [ -f results/unstable_search.csv ]; then
  cp results/unstable_search.csv "$WORK/unstable_search.csv"
fi
if [ ! -d "$WORK/carried" ] && [ -d results/unstable_search ]; then
  cp -r results/unstable_search "$WORK/carried"
fi
gpu_timed "unstable search" "$LIMIT" python -m mx_proxy.experiments.unstable_search --out "$WORK" \
  --table "$WORK/unstable_search.csv" --carry "$WORK/carried" "${@:3}"
if [ -f "$WORK/unstable_search.csv" ]; then
  mkdir -p "$(dirname "$DEST")"
  cp "$WORK/unstable_search.csv" "$DEST.tmp" && mv "$DEST.tmp" "$DEST"
  if [ -d "$WORK/carried" ]; then
    mkdir -p "$CARRY_DEST" && cp -r "$WORK/carried/." "$CARRY_DEST/"
  fi
  python -m mx_proxy.experiments.unstable_search --out "$WORK" --table "$WORK/unstable_search.csv" --status \
    | tee "$WORK/status.txt" || true
fi
