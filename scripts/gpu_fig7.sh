#!/usr/bin/env bash
# Fig. 7 as rates on a GPU: the committed branch ensemble (results/ensembles/fig7-6000) replicated from this
# machine's own replay of its state, from the source tree, no network:
#
#   scripts/gpu_fig7.sh [SECONDS] [WORK] [OPTIONS...]
#
# A GPU's replay of seed 0's paper_e4m3 run to step 6500 cannot equal the CPU run the committed members
# branched from, so this starts a new ensemble with the same spec (arms, 8 members, 1000-step horizon, branch at
# step 6000), named $NAME (default fig7-6000-gpu), branched from the GPU's replayed state (with its FP32 twin):
# `python -m mx_proxy.experiments.branch_replay --results $RESULTS --out WORK --new WORK/$NAME [OPTIONS...]`
# ($RESULTS defaults to results/ensembles/fig7-6000; OPTIONS e.g. --arms adam_eps=1e-15), for at most SECONDS
# (default 480) into WORK (default /tmp/proxy-fig7). Each arm's members train as one vmapped program and are
# exported as they finish. A second call resumes from WORK; on a fresh machine, from the new ensemble's exports
# committed in results/ensembles/$NAME (copied into WORK first), provided the replay there matches the history
# those members recorded, bit for bit (else it is refused). The exports are copied to
# $OUT/results/ensembles/$NAME when $OUT is set (the device machine's output folder), else to
# results/ensembles/$NAME, and the ensemble's report (`mx-proxy report`) is printed and kept in WORK/report.md.
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT="${1:-480}"
WORK="${2:-/tmp/proxy-fig7}"
NAME="${NAME:-fig7-6000-gpu}"
RESULTS="${RESULTS:-results/ensembles/fig7-6000}"
DEST="${OUT:-.}/results/ensembles/$NAME"
. scripts/gpu_lib.sh
gpu_start
mkdir -p "$WORK"
if [ ! -d "$WORK/$NAME" ] && [ -f "results/ensembles/$NAME/ensemble.json" ]; then
  cp -r "results/ensembles/$NAME" "$WORK/$NAME"  # a fresh machine: resume from the committed exports
fi
gpu_timed "fig7 replica" "$LIMIT" python -m mx_proxy.experiments.branch_replay --results "$RESULTS" --out "$WORK" \
  --new "$WORK/$NAME" "${@:3}"
gpu_export "$WORK/$NAME" "$DEST" "$WORK"
