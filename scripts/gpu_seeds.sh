#!/usr/bin/env bash
# The paper's setting at seeds 1-4 (mx_proxy.experiments.paper_seeds: fp32, paper_e4m3 and mxfp8_e4m3, width 512,
# 9000 steps) on a GPU, from the source tree, no network:
#
#   scripts/gpu_seeds.sh [SECONDS] [WORK] [OPTIONS...]
#
# Runs `python -m mx_proxy.experiments.paper_seeds --out WORK --group-size 4 [OPTIONS...]` (each arm's four seeds
# as one vmapped program) for at most SECONDS (default 480) into WORK (default /tmp/proxy-seeds); a second call
# resumes from WORK's run store; a fresh WORK starts from the committed exports (paper_seeds --committed). Each
# member is exported as its unit finishes; the exports are copied to $OUT/results/ensembles/seeds-w512 when $OUT
# is set (the device machine's output folder), else to results/ensembles/seeds-w512, and the ensemble's report
# (`mx-proxy report`) is printed and kept in WORK/report.md.
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT="${1:-480}"
WORK="${2:-/tmp/proxy-seeds}"
DEST="${OUT:-.}/results/ensembles/seeds-w512"
. scripts/gpu_lib.sh
gpu_start
gpu_timed "paper seeds" "$LIMIT" python -m mx_proxy.experiments.paper_seeds --out "$WORK" --group-size 4 "${@:3}"
mkdir -p "$DEST"
gpu_export "$WORK/results" "$DEST" "$WORK"
ls "$DEST" | head -50
