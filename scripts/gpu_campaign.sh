#!/usr/bin/env bash
# The paper-scale campaign on GPUs (see docs/campaign.md, docs/cluster.md), from the source tree, no network.
#
#   scripts/gpu_campaign.sh [SECONDS] [WORK] [CAMPAIGN OPTIONS...]
#
# A thin wrapper over `mx-proxy campaign --scale paper --out WORK --quiet [CAMPAIGN OPTIONS...]`, run for at most
# SECONDS (default 480) into WORK (default /tmp/proxy-paper). On one GPU machine give no options (the local
# executor); on a Slurm cluster's login node give the executor's, e.g.
#   scripts/gpu_campaign.sh 86400 /shared/proxy-paper --executor slurm --slurm-gpus-per-task 1 --slurm-partition gpu
# (then SECONDS bounds the submitting process only: its jobs keep running, and a second call attaches to them).
# The campaign trains its headline first (paired
# run, interventions, controls, then the LR grid) and exports each run as it
# finishes, so a time-limited call keeps everything it finished and a second
# call resumes from the run store. Finished results and their figures are
# copied to $OUT/results/paper and $OUT/figures when $OUT is set (the device
# machine's output folder), else to results/paper and figures/; the headline
# (`mx-proxy report`) is printed and kept in WORK/report.md.
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT="${1:-480}"
WORK="${2:-/tmp/proxy-paper}"
SCALE="${SCALE:-paper}"
DEST="${OUT:-.}/results/$SCALE"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python - <<'PY'
import jax
print("jax", jax.__version__, "devices", jax.devices())
PY
START=$(date +%s)
timeout --signal=INT "$LIMIT" python -m mx_proxy.cli campaign --scale "$SCALE" --out "$WORK" --quiet "${@:3}"
STATUS=$?
echo "campaign exit status $STATUS after $(( $(date +%s) - START )) s (124/130: time limit reached, rerun to resume)"
python -m mx_proxy.cli campaign --scale "$SCALE" --out "$WORK" --status || true  # where each run stands
mkdir -p "$DEST"
if [ -d "$WORK/results" ]; then
  cp -r "$WORK/results/." "$DEST/"
  python -m mx_proxy.cli figures --only headline_lr_sweep headline_zeta headline_ln_clamping headline_interventions \
      --results "$(dirname "$DEST")" --out "$(dirname "$(dirname "$DEST")")/figures" --no-store || true
  python -m mx_proxy.cli report "$DEST" | tee "$WORK/report.md" || true  # the headline as Markdown
fi
ls "$DEST" | head -50
