#!/usr/bin/env bash
# How much one training's WER moves with ESPnet's seed: the three models of the recipe
# trained again with other seeds on the data of a finished run, decoded greedily on the
# first test set, in a table of WER per model and seed with the mean, the spread
# (max - min) and the difference to the standard model per seed. The spread is the
# noise any difference between the models (or between two configurations of one) has
# to beat. Written to BASE/exp/seed_spread.md (--out FILE: elsewhere).
#
#   bash egs/digits/asr1/local/seed_spread.sh --dir BASE [--seeds "0 1 2"]
#       [--train_args "..."] [--out FILE]
#
# BASE is a run dir of run.sh whose stages 1-5 are done (data, token list, stats).
# The configs' own seed (--base_seed, 0: `seed: 0` in conf/train_*.yaml) is BASE's own
# training when its stages 6-8 are done and --train_args is empty: its models and its
# scored stage-10 decodings are used, not trained again (one thread: the same models).
# Each seed trains the three models side by side exactly as run.sh's stages 6-8 do
# (--train_jobs 3, one torch thread each), in BASE/seeds/S/ (data and stats are links
# into BASE); --train_args goes to every training (e.g. a configuration to compare).
# Greedy searches at batch 32 (the same hypotheses as batch 1): standard / greedy,
# multiblank / mb_greedy, tdt / tdt_greedy. A re-run skips what is done (run.sh's
# stage markers, the scored decodings).
set -euo pipefail

recipe=$(cd "$(dirname "$0")/.." && pwd)
repo=$(cd "$recipe/../../.." && pwd)
dir=""
seeds="0 1 2"
base_seed=0
train_args=""
python=$(source "$repo/tools/venv_path.sh" && echo "$VENV/bin/python")
inference_model=valid.loss.ave.pth
out_md=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dir|--seeds|--python|--inference_model|--train_args|--base_seed)
      [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 1; }
      declare "${1#--}=$2"; shift 2 ;;
    --out)
      [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 1; }
      out_md=$2; shift 2 ;;
    *) echo "unknown option: $1" >&2; exit 1 ;;
  esac
done
[ -n "$dir" ] || { echo "--dir BASE is required (a run dir of run.sh)" >&2; exit 1; }
dir=$(cd "$dir" && pwd)
[ -n "$out_md" ] || out_md=$dir/exp/seed_spread.md
for k in 1 2 3 4 5; do
  [ -e "$dir/exp/.done/$k" ] || { echo "$dir: stage $k of run.sh not done" >&2; exit 1; }
done
for seed in $seeds; do
  case $seed in
    ''|*[!0-9]*) echo "--seeds must be non-negative integers, got '$seed'" >&2; exit 1 ;;
  esac
done
test_set=test
searches="standard:greedy multiblank:mb_greedy tdt:tdt_greedy"

log() { echo "$(date '+%Y-%m-%dT%H:%M:%S') [seed_spread] $*"; }

source "$recipe/local/decode_scored.sh"

decode_greedy() {  # decode_greedy RUN MODEL SEARCH SEED: decode (unless scored), record
  local run=$1 model=$2 search=$3 seed=$4 out
  out=$run/exp/asr_$model/decode_${search}_${inference_model%.pth}/$test_set
  decode_scored "$out" "$repo/conf/decode/$search.yaml" 32 "$run/exp/asr_$model" \
    "$inference_model" "$model / $search (seed $seed)"
  runs+=("$model=$search=$seed=$out")
}

base_trained() {
  [ -z "$train_args" ] && [ -e "$dir/exp/.done/6" ] && [ -e "$dir/exp/.done/7" ] &&
    [ -e "$dir/exp/.done/8" ]
}

runs=()
for seed in $seeds; do
  if [ "$seed" = "$base_seed" ] && base_trained; then
    log "seed $seed: the models of $dir (run.sh's own training)"
    run=$dir
    for pair in $searches; do
      decode_greedy "$run" "${pair%%:*}" "${pair#*:}" "$seed"
    done
    continue
  fi
  run=$dir/seeds/$seed
  mkdir -p "$run/exp/.done"
  for d in data wav; do
    [ -e "$run/$d" ] || [ -L "$run/$d" ] || ln -s "$dir/$d" "$run/$d"
  done
  [ -e "$run/exp/asr_stats_word" ] || [ -L "$run/exp/asr_stats_word" ] ||
    ln -s "$dir/exp/asr_stats_word" "$run/exp/asr_stats_word"
  for k in 1 2 3 4 5; do cp -p "$dir/exp/.done/$k" "$run/exp/.done/$k"; done
  cp -p "$dir/exp/.done/layout" "$run/exp/.done/layout" 2>/dev/null || true
  log "training the three models with seed $seed in $run"
  bash "$recipe/run.sh" --dir "$run" --python "$python" --stage 6 --stop_stage 8 \
    --inference_model "$inference_model" --train_args "--seed $seed $train_args"
  for pair in $searches; do
    decode_greedy "$run" "${pair%%:*}" "${pair#*:}" "$seed"
  done
done
PYTHONPATH=$recipe/local "$python" -m report.seeds --test_set "$test_set" \
  --train_args "$train_args" "${runs[@]}" > "$out_md.tmp"
mv "$out_md.tmp" "$out_md"
log "wrote $out_md"
cat "$out_md"
