#!/usr/bin/env bash
# Train one of the recipe's models again with 1, 2, ... DDP processes (run.sh's
# --train_procs) on the data of a finished run, decode the first test set with the same
# search, and write a markdown section comparing WER and wall time per epoch to
# BASE/exp/procs_comparison.md, which the report (stage 11, re-run here when BASE is
# scored) appends to RESULTS.md.
#
#   bash egs/digits/asr1/local/compare_procs.sh --dir BASE [--procs "1 2"]
#       [--seeds "0 1 2"] [--model multiblank] [--search mb_greedy] [--out FILE]
#
# Every number of processes is trained once per seed (ESPnet's --seed; 0 is ESPnet's
# default and the recipe's): the spread between seeds at one process is the noise that
# a WER difference between process counts is compared with. --out writes the section
# elsewhere (e.g. a second model's); only BASE/exp/procs_comparison.md goes into the report.
#
# BASE is a run dir of run.sh whose stages 1-5 are done (data, token list, stats). Each
# training runs alone (--train_jobs 1: the processes get the machine), in
# BASE/procs/N/ for seed 0, BASE/procs/N_seedS/ for seed S (data and stats are
# links into BASE). A re-run skips what is done:
# run.sh's stage markers for the training, the scored decoding for the rest.
set -euo pipefail

recipe=$(cd "$(dirname "$0")/.." && pwd)
repo=$(cd "$recipe/../../.." && pwd)
dir=""
procs="1 2"
seeds="0"
model=multiblank
search=mb_greedy
python=$(source "$repo/tools/venv_path.sh" && echo "$VENV/bin/python")
inference_model=valid.loss.ave.pth
out_md=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dir|--procs|--seeds|--model|--search|--python|--inference_model)
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
report_md=$dir/exp/procs_comparison.md
[ -n "$out_md" ] || out_md=$report_md
case $model in
  standard) stage=6 ;;
  multiblank) stage=7 ;;
  tdt) stage=8 ;;
  *) echo "--model must be standard, multiblank or tdt, got '$model'" >&2; exit 1 ;;
esac
for k in 1 2 3 4 5; do
  [ -e "$dir/exp/.done/$k" ] || { echo "$dir: stage $k of run.sh not done" >&2; exit 1; }
done
decode_conf=$repo/conf/decode/$search.yaml
[ -f "$decode_conf" ] || { echo "no decode config $decode_conf" >&2; exit 1; }
test_set=test
for seed in $seeds; do
  case $seed in
    ''|*[!0-9]*) echo "--seeds must be non-negative integers, got '$seed'" >&2; exit 1 ;;
  esac
done

log() { echo "$(date '+%Y-%m-%dT%H:%M:%S') [compare_procs] $*"; }
source "$recipe/local/decode_scored.sh"

runs=()
for seed in $seeds; do
  for n in $procs; do
    run=$dir/procs/$n
    [ "$seed" = 0 ] || run=${run}_seed$seed
    mkdir -p "$run/exp/.done"
    for d in data wav; do
      [ -e "$run/$d" ] || [ -L "$run/$d" ] || ln -s "$dir/$d" "$run/$d"
    done
    [ -e "$run/exp/asr_stats_word" ] || [ -L "$run/exp/asr_stats_word" ] ||
      ln -s "$dir/exp/asr_stats_word" "$run/exp/asr_stats_word"
    for k in 1 2 3 4 5; do cp -p "$dir/exp/.done/$k" "$run/exp/.done/$k"; done
    cp -p "$dir/exp/.done/layout" "$run/exp/.done/layout" 2>/dev/null || true
    log "training $model with $n process(es), seed $seed, in $run"
    bash "$recipe/run.sh" --dir "$run" --python "$python" --stage "$stage" \
      --stop_stage "$stage" --train_jobs 1 --train_procs "$n" \
      --inference_model "$inference_model" --train_args "--seed $seed"
    out=$run/exp/asr_$model/decode_${search}_${inference_model%.pth}/$test_set
    decode_scored "$out" "$decode_conf" 1 "$run/exp/asr_$model" "$inference_model" \
      "$model / $search"
    runs+=("$n=$seed=$run/exp/asr_$model=$out")
  done
done
PYTHONPATH=$recipe/local "$python" -m report.procs --model "$model" --search "$search" \
  --test_set "$test_set" "${runs[@]}" > "$out_md.tmp"
mv "$out_md.tmp" "$out_md"
log "wrote $out_md"
cat "$out_md"
if [ "$out_md" = "$report_md" ] && [ -e "$dir/exp/.done/10" ]; then
  # the base run is scored: report again, with this section
  rm -f "$dir/exp/.done/11"
  bash "$recipe/run.sh" --dir "$dir" --python "$python" --stage 11 --stop_stage 11 \
    --inference_model "$inference_model" > "$dir/exp/report_again.log"
  log "report: $dir/exp/RESULTS.md"
fi
