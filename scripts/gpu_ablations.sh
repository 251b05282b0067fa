#!/usr/bin/env bash
# Activation and normalization ablations as rates (mx_proxy.experiments.cell_rates) on a GPU, from the source
# tree, no network:
#
#   scripts/gpu_ablations.sh [SECONDS] [WORK] [OPTIONS...]
#
# Trains each cell (an activation and a normalization) of the `unstable` scale as a seed ensemble of fp32 and
# mxfp8_e4m3 (8 seeds each, the scale's rate_members): `python -m mx_proxy.experiments.cell_rates --out WORK
# --table WORK/$NAME.csv --cells $ABLATION_CELLS [OPTIONS...]` for at most SECONDS (default 480) into WORK
# (default /tmp/proxy-ablations). $ABLATION_CELLS defaults to the normalization cells first (GELU with
# LayerNorm without affine parameters, RMSNorm, none, then LayerNorm: the search's own setting, whose rates
# are known), then the other activations with LayerNorm (each (cell, recipe) compiles its own program, ~40 s
# on an H100 beside ~40 s of training for 8 seeds);
# empty: the scale's own list; OPTIONS (e.g. --scale, --members, --cells) come last and win. Each cell's
# ensemble resumes in WORK/CELL; on a fresh machine the exports committed in $COMMITTED (default
# results/$NAME, NAME default ablation_rates_unstable) are copied in first, so only what no machine finished
# trains (a cell cut short by the limit loses its unfinished unit). The table and every cell's exports are
# copied to $OUT/results/$NAME.csv and $OUT/results/$NAME/CELL when $OUT is set (the device machine's output
# folder), else into results/.
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT="${1:-480}"
WORK="${2:-/tmp/proxy-ablations}"
NAME="${NAME:-ablation_rates_unstable}"
COMMITTED="${COMMITTED:-results/$NAME}"
DEST="${OUT:-.}/results"
CELLS="${ABLATION_CELLS-act=gelu,norm=layernorm_noaffine act=gelu,norm=rmsnorm act=gelu,norm=none \
act=gelu,norm=layernorm act=relu,norm=layernorm act=swiglu,norm=layernorm act=relu2,norm=layernorm act=silu,norm=layernorm}"
. scripts/gpu_lib.sh
gpu_start
mkdir -p "$WORK"
for cell in "$COMMITTED"/*/; do  # a fresh machine: resume from the committed exports
  cell="${cell%/}"
  if [ -f "$cell/ensemble.json" ] && [ ! -d "$WORK/$(basename "$cell")/results" ]; then
    mkdir -p "$WORK/$(basename "$cell")" && cp -r "$cell" "$WORK/$(basename "$cell")/results"
  fi
done
gpu_timed "ablation rates" "$LIMIT" python -m mx_proxy.experiments.cell_rates --out "$WORK" --table "$WORK/$NAME.csv" \
  ${CELLS:+--cells $CELLS} "${@:3}"
mkdir -p "$DEST/$NAME"
[ -f "$WORK/$NAME.csv" ] && cp "$WORK/$NAME.csv" "$DEST/$NAME.csv.tmp" && mv "$DEST/$NAME.csv.tmp" "$DEST/$NAME.csv"
for cell in "$WORK"/*/results; do
  if [ -f "$cell/ensemble.json" ]; then
    name="$(basename "$(dirname "$cell")")"
    mkdir -p "$DEST/$NAME/$name" && cp -r "$cell/." "$DEST/$NAME/$name/"
  fi
done
[ -f "$DEST/$NAME.csv" ] && cat "$DEST/$NAME.csv"
exit 0
