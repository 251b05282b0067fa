#!/usr/bin/env bash
# More seeds at the `unstable` scale's setting on a GPU, from the source tree, no network:
#
#   scripts/gpu_moreseeds.sh [SECONDS] [WORK] [OPTIONS...]
#
# The unstable search trained seeds 1-8 of this setting (width 256, depth 4, batch 2048, Adam LR 2e-3, 7000 steps,
# bf16 dots; results/unstable_search/w256-d4-lr0.002): on an H100 FP32 blew up in 0 of 8, while on a 2-core CPU it
# blew up in 4 of the same 8 (results/ensembles/w256-d4-lr0.002-cpu). This trains seeds 9-16 of the same member
# config and arms (fp32, paper_e4m3, mxfp8_e4m3), each arm's 8 members as one vmapped program, as the ensemble
# $NAME (default w256-d4-lr0.002-s9): `python -m mx_proxy.cli ensemble --out WORK/$NAME --first-seed 9 ...
# [OPTIONS...]` (OPTIONS come last, so a repeated option overrides the default), for at most SECONDS (default 480).
# A second call resumes from WORK; a fresh WORK starts from the exports committed in $COMMITTED (default
# results/ensembles/$NAME).
# Each member is exported as its unit finishes; the exports are copied to $OUT/results/ensembles/$NAME when $OUT is
# set (the device machine's output folder), else to results/ensembles/$NAME, and the ensemble's report
# (`mx-proxy report`) is printed and kept in WORK/report.md.
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT="${1:-480}"
WORK="${2:-/tmp/proxy-moreseeds}"
NAME="${NAME:-w256-d4-lr0.002-s9}"
DEST="${OUT:-.}/results/ensembles/$NAME"
COMMITTED="${COMMITTED:-results/ensembles/$NAME}"
. scripts/gpu_lib.sh
gpu_start
if [ ! -f "$WORK/$NAME/results/ensemble.json" ] && [ -f "$COMMITTED/ensemble.json" ]; then
  mkdir -p "$WORK/$NAME/results"
  cp -r "$COMMITTED/." "$WORK/$NAME/results/"  # a fresh machine: resume from the committed exports
fi
gpu_timed "more seeds" "$LIMIT" python -m mx_proxy.cli ensemble --out "$WORK/$NAME" --name "$NAME" --kind seed \
  --arms fp32 paper_e4m3 mxfp8_e4m3 --members 8 --first-seed 9 --horizon 7000 --width 256 --depth 4 --batch 2048 \
  --lr 0.002 --steps 7000 --diagnostics-every 50 --val-every 0 --dot bf16 --checkpoint-every 500 --group-size 8 \
  "${@:3}"
gpu_export "$WORK/$NAME/results" "$DEST" "$WORK"
