#!/usr/bin/env bash
# Connected digits, 8 kHz: standard vs multi-blank RNN-T vs TDT (espnet-multiblank), end
# to end, with and without language models.
#
#   bash egs/digits/asr1/run.sh                 # everything (33-38 min on 2 idle cores, README.md)
#   bash egs/digits/asr1/run.sh --smoke         # tiny data + model, 2 epochs
#   bash egs/digits/asr1/run.sh --stage 11 --stop_stage 16
#   bash egs/digits/asr1/run.sh --dir /tmp/digits   # write data/, exp/ elsewhere
#
# Stages (ESPnet style; each writes a done-marker only after it succeeded, outputs are
# written under temporary names and renamed, so a re-run skips finished stages and redoes
# a failed one from scratch; running a stage again invalidates the stages after it):
#   1  tools: sox, espeak-ng, flite, festival + voices (apt-get install when root), venv
#   2  data synthesis: TTS train / held-out dev, test; a list of "account numbers" and
#      held-out dev_known, test_known sets that say them; real-speech test from Debian
#      packages
#   3  Kaldi-style data dirs (wav.scp, text, utt2spk, spk2utt); the account list's text
#   4  word-level token list
#   5  ESPnet collect_stats (feature mean/var, shape files)
#   6  train the standard transducer
#   7  train the multi-blank transducer (same encoder/decoder, durations [2,4,8])
#   8  train the TDT (same encoder/decoder, durations 0..8: the same largest jump);
#      6, 7, 8 and 9 run side by side (--train_jobs 4, the default: one torch thread
#      each; on 2 cores they share the CPUs, sooner than some after the others, which
#      leaves a core idle: README.md). --train_jobs N runs at most N at a
#      time (in stage order), --train_jobs 1 one after the other with all threads.
#      --train_procs N trains each model with N DDP processes on this machine (ESPnet's
#      DDP through the plug-in: gloo, --multiprocessing_distributed true
#      --dist_world_size N); the configs' batch size is the global one, split among the
#      processes, so the training is the same. With --train_jobs J > 1 that makes up to
#      J*N processes of one torch thread each; with --train_jobs 1 the N processes share
#      the CPUs (cpus / N threads each).
#   9  train the models of --sherpa_models again on sherpa-onnx's features (frontend:
#      kaldi_fbank, conf/train_<model>_kaldi.yaml; default: the TDT), side by side
#      with 6-8: the models sherpa-onnx can decode (stage 14)
#  10  train two word LMs with ESPnet's LM trainer: "train" on the training transcripts,
#      "known" on the account list
#  11  decode test, test_real: standard greedy + beam (+ mb_greedy, the same greedy code
#      as the multi-blank model's); multi-blank mb_greedy + mb_beam; TDT tdt_greedy +
#      tdt_beam, one utterance at a time; the batched beam searches (frame and label
#      rules, batch 32); the plug-in's searches write test_real's word times (1best_recog/ctm);
#      then the throughput runs, and every plug-in search on test in float16 and
#      bfloat16 (--dtype_jobs, batch --dtype_batch 32; not timed)
#  12  LM fusion, the label-synchronous batched beam searches (--lm_searches): the
#      weight of each LM chosen on its dev set (dev for "train", dev_known for
#      "known"; --lm_weights, --lm_known_weights), then test, test_real with the
#      "train" LM and test_known without and with the "known" LM; at the chosen
#      weights one one-at-a-time beam run per model and the frame-synchronous batched
#      beams (--lm_extra_jobs); --lm_decode_jobs decodings at a time
#  13  streaming (the models' chunk conformers, docs/streaming.md), with each model's
#      greedy search: (a) test decoded offline at --stream_chunks encoder frames per
#      chunk (4 16: 160, 640 ms; batched: the chunk-masked encoder output, i.e. the
#      hypotheses the streams give) for the streaming WER; (b) --stream_utts
#      utterances of test streamed at those chunks in pieces of --stream_piece samples
#      (80 ms), one stream at a time, and --stream_batch streams at once at chunk
#      --stream_batch_chunk (timed: RTF, search time; their hypotheses are checked
#      against (a)); (c) --stream_utts utterances of test_real streamed at the same
#      chunks for the emission delays against its known word boundaries
#      (--lm_decode_jobs at a time, not timed)
#  14  deployment without torch: each model exported to ONNX
#      (espnet_multiblank.bin.export_onnx, checked against PyTorch) and test decoded
#      with the torch-free runtime (espnet_multiblank.runtime.decode; --deploy_tags):
#      greedy one utterance at a time (timed) and 32 at a time, label-synchronous beam
#      search, and streams at 640 ms chunks (16 streams together), greedy and beam;
#      stage 9's models exported for sherpa-onnx too (--format sherpa_onnx) and test
#      decoded by sherpa-onnx, by the runtime (its greedy rule and sherpa-onnx's) and
#      by the plug-in (PyTorch, greedy, one utterance at a time)
#  15  score WER / CER; word-time errors of test_real against its known boundaries;
#      the streaming emission delays; the runtime's and sherpa-onnx's decodings
#  16  report: exp/RESULTS.md (+ RESULTS.md next to this script), validation-loss and
#      WER-vs-search-time plots
set -euo pipefail

recipe=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$recipe/../../.." && pwd)

# ---------------------------------------------------------------- options
stage=1
stop_stage=16
smoke=false
dir=$recipe                 # working directory: data/, wav/, exp/ go there
python=$(source "$repo/tools/venv_path.sh" && echo "$VENV/bin/python")
nj=2                        # parallel TTS processes
num_train=8000              # synthetic utterances
num_dev=300
num_test=500
num_real=150                # real-speech utterances per speaker (2 speakers)
num_accounts=100            # known account numbers (local/make_accounts.py)
num_known_dev=200           # dev_known / test_known utterances (strings from the list)
num_known_test=400
train_config=$recipe/conf/train_standard.yaml
mb_train_config=$recipe/conf/train_multiblank.yaml
tdt_train_config=$recipe/conf/train_tdt.yaml
decode_conf_dir=$repo/conf/decode
inference_model=valid.loss.ave.pth
decode_threads=1            # torch threads while decoding (speed comparison)
train_jobs=4                # trainings at once (one torch thread each when > 1)
train_procs=1               # DDP processes per model (CPU, gloo); 1: no DDP
train_args=""               # extra arguments for asr_train (both models)
lm_config=$recipe/conf/train_lm.yaml             # LM "train": training transcripts
lm_known_config=$recipe/conf/train_lm_known.yaml # LM "known": the account list
lm_args=""                  # extra arguments for lm_train (both LMs)
# model:search[:batch] decoded with the LMs (the weight grids), batch 1 if not given
lm_searches="standard:mb_beam_label:32 multiblank:mb_beam_label:32 tdt:tdt_beam_label:32"
# decoded at the weights lm_searches chose for the same model: test_known with the known
# LM (and, batched, without it) and, batched, test with the train LM
lm_extra_jobs="standard:mb_beam:1 multiblank:mb_beam:1 tdt:tdt_beam:1
  standard:mb_beam:32 multiblank:mb_beam:32 tdt:tdt_beam:32"
lm_weights="0.1 0.2 0.4"    # candidates for LM "train", chosen on dev (0, no LM, too)
lm_known_weights="0.2 0.4 0.8 1.6"  # candidates for LM "known", on dev_known (and 0)
lm_decode_jobs=2            # LM decodings at a time (not timed: they may share CPUs)
decode_jobs=""              # stage 11's model:search[:batch] (default below)
# the batched beam searches decoded in stage 11 (with the one-at-a-time ones)
batched_jobs="standard:mb_beam:32 standard:mb_beam_label:32 multiblank:mb_beam:32
  multiblank:mb_beam_label:32 tdt:tdt_beam:32 tdt:tdt_beam_label:32"
# model:search decoded on the first test set in half precision too (--dtype), to
# compare with float32
dtype_jobs="standard:mb_greedy multiblank:mb_greedy multiblank:mb_beam tdt:tdt_greedy
  tdt:tdt_beam"
dtypes="float16 bfloat16"
# their batch: float32's batched decoding gives the hypotheses of batch 1, so half
# precision at batch 32 is compared with float32 at batch 1 (stage 11's decodings)
dtype_batch=32
# streaming (stage 13): model:search decoded as streams, chunk sizes (encoder frames of
# 40 ms), the piece length (samples: 640 = 80 ms at 8 kHz), the batched run's streams
# and chunk
stream_jobs="standard:mb_greedy multiblank:mb_greedy tdt:tdt_greedy"
stream_chunks="4 16"
stream_piece=640
stream_batch=16
stream_batch_chunk=16
stream_utts=100             # utterances of each test set streamed (spread over it)
# stage 14: the models exported to ONNX, and the runtime's decodings of the first test
# set, "model:tag" with tag one of greedy_b1 (timed), greedy_b32, beam_b32 (beam 4),
# stream_greedy_c16, stream_beam_c16 (16 encoder frames = 640 ms per chunk, 16
# streams at a time, pieces of --stream_piece samples)
deploy_models="standard multiblank tdt"
# stage 9: the models trained again on sherpa-onnx's features (conf/train_<m>_kaldi.yaml,
# exp/asr_<m>_kaldi), exported for sherpa-onnx in stage 14 ("": none)
sherpa_models="tdt"
deploy_tags="greedy_b1 greedy_b32 beam_b32 stream_greedy_c16 stream_beam_c16"

usage() {
  sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
  echo "Options: --stage N --stop_stage N --smoke --dir DIR --python PY --nj N"
  echo "         --num_train N --num_dev N --num_test N --num_real N --train_args '...'"
  echo "         --train_jobs N --train_procs N --decode_threads N --inference_model F"
  echo "         --decode_conf_dir D --num_accounts N --num_known_dev N --num_known_test N"
  echo "         --lm_args '...' --lm_searches 'model:search ...' --lm_weights 'W ...'"
  echo "         --lm_known_weights 'W ...' --lm_decode_jobs N --dtype_jobs 'model:search ...'"
  echo "         --dtype_batch N"
  echo "         --decode_jobs 'model:search[:batch] ...' --lm_extra_jobs 'model:search:batch ...'"
  echo "         --stream_jobs 'model:search ...' --stream_chunks 'C ...' --stream_piece N"
  echo "         --stream_batch N --stream_batch_chunk C --stream_utts N"
  echo "         --deploy_models 'model ...' --deploy_tags 'tag ...'"
  echo "         --train_config F --mb_train_config F --tdt_train_config F"
  echo "         --sherpa_models 'model ...'"
}
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=true; shift ;;
    --stage|--stop_stage|--dir|--python|--nj|--num_train|--num_dev|--num_test|--num_real|\
    --train_args|--inference_model|--decode_conf_dir|--decode_threads|--train_jobs|\
    --train_procs|--num_accounts|--num_known_dev|--num_known_test|--lm_args|\
    --lm_searches|--lm_weights|--lm_known_weights|--lm_decode_jobs|--dtype_jobs|\
    --dtype_batch|--decode_jobs|--lm_extra_jobs|\
    --stream_jobs|--stream_chunks|--stream_piece|--stream_batch|--stream_batch_chunk|\
    --stream_utts|--deploy_models|--deploy_tags|--train_config|--mb_train_config|\
    --tdt_train_config|--sherpa_models)
      [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 1; }
      declare "${1#--}=$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option: $1" >&2; usage >&2; exit 1 ;;
  esac
done

case $train_procs in
  ''|*[!0-9]*|0) echo "--train_procs must be a positive integer, got '$train_procs'" >&2; exit 1 ;;
esac
case $train_jobs in
  ''|*[!0-9]*|0) echo "--train_jobs must be a positive integer, got '$train_jobs'" >&2; exit 1 ;;
esac
case $lm_decode_jobs in
  ''|*[!0-9]*|0) echo "--lm_decode_jobs must be a positive integer, got '$lm_decode_jobs'" >&2; exit 1 ;;
esac
for w in $lm_weights $lm_known_weights; do
  case $w in
    ''|*[!0-9.]*|*.*.*|.) echo "LM weights must be non-negative numbers, got '$w'" >&2; exit 1 ;;
  esac
done

suffix=""
if $smoke; then
  suffix=_smoke
  num_train=300; num_dev=40; num_test=60; num_real=20
  num_accounts=20; num_known_dev=20; num_known_test=30
  # tiny model, 2 epochs; same structure as the full configs
  train_args="--encoder_conf output_size=64 --encoder_conf linear_units=128
    --encoder_conf num_blocks=1 --encoder_conf attention_heads=2
    --decoder_conf hidden_size=64 --joint_net_conf joint_space_size=64
    --max_epoch 2 --num_iters_per_epoch 12 --batch_size 16 --valid_batch_size 16
    --scheduler_conf warmup_steps=20
    --keep_nbest_models 1 $train_args"
  lm_args="--max_epoch 2 --num_iters_per_epoch 5 $lm_args"
  lm_weights="0.2"; lm_known_weights="0.4 0.8"
  # one beam search with the LMs, one search in half precision (the smoke run stays
  # short; the tests cover the other searches)
  lm_searches="tdt:tdt_beam_label:32"
  lm_extra_jobs="tdt:tdt_beam:1 tdt:tdt_beam:32"
  dtype_jobs="multiblank:mb_greedy"
  # of the batched beams, one of each rule
  batched_jobs="tdt:tdt_beam_label:32 multiblank:mb_beam:32"
  # streaming: the two lattices that jump frames, one chunk
  stream_jobs="multiblank:mb_greedy tdt:tdt_greedy"
  stream_chunks="4"; stream_batch=4; stream_batch_chunk=4; stream_utts=20
  # deployment: the two lattices that jump frames, greedy and one stream of each kind
  deploy_models="multiblank tdt"
  deploy_tags="greedy_b1 beam_b32 stream_greedy_c4"
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
wavdir=$dir/wav$suffix
data=$dir/data$suffix
exp=$dir/exp$suffix
done_dir=$exp/.done
mkdir -p "$exp" "$done_dir"
export PYTHONUNBUFFERED=1
train_cmd=("$python" -m espnet_multiblank.bin.asr_train)
infer_cmd=("$python" -m espnet_multiblank.bin.asr_inference)
test_sets="test test_real"
token_list=$data/token_list/word/tokens.txt
stats_dir=$exp/asr_stats_word
stats_dir_kaldi=$exp/asr_stats_word_kaldi   # sherpa-onnx's features (stage 9's models)

log() { echo "$(date '+%Y-%m-%dT%H:%M:%S') [run.sh] $*"; }
die() { log "ERROR: $*" >&2; exit 1; }

# run_stage N NAME FUNCTION [FIRST_DEPENDENT]: skip when done, else run, then mark done and
# invalidate the markers of the stages from FIRST_DEPENDENT (default N+1) on
run_stage() {
  local n=$1 name=$2 fn=$3 first_dependent=${4:-$(($1 + 1))}
  if [ "$n" -lt "$stage" ] || [ "$n" -gt "$stop_stage" ]; then return 0; fi
  if [ -e "$done_dir/$n" ]; then
    log "stage $n ($name): done already ($(cat "$done_dir/$n")), skipped"
    return 0
  fi
  local t0=$SECONDS
  log "stage $n ($name): start"
  "$fn"
  local k
  for k in $(seq "$first_dependent" 20); do rm -f "$done_dir/$k"; done
  echo "$(date '+%Y-%m-%dT%H:%M:%S'), $((SECONDS - t0)) s" > "$done_dir/$n"
  log "stage $n ($name): finished in $((SECONDS - t0)) s"
}

# --------------------------------------------------------------- stage 1: tools
apt_pkgs="sox espeak-ng flite festival festvox-kallpc16k festvox-us-slt-hts festvox-kdlpc16k"
real_pkgs="asterisk-core-sounds-en-wav asterisk-core-sounds-en saytime"
missing_tools() {
  local m=""
  command -v sox >/dev/null || m="$m sox"
  command -v espeak-ng >/dev/null || m="$m espeak-ng"
  command -v flite >/dev/null || m="$m flite"
  command -v festival >/dev/null || m="$m festival"
  [ -d /usr/share/festival/voices/english/kal_diphone ] || m="$m festvox-kallpc16k"
  [ -d /usr/share/festival/voices/english/ked_diphone ] || m="$m festvox-kdlpc16k"
  [ -d /usr/share/festival/voices/us/cmu_us_slt_arctic_hts ] || m="$m festvox-us-slt-hts"
  echo "$m"
}
stage_tools() {
  local m
  m=$(missing_tools)
  if [ -n "$m" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      log "installing Debian packages:$m"
      apt-get update -q
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q $apt_pkgs
      m=$(missing_tools)
      [ -z "$m" ] || die "still missing after apt-get install:$m"
    else
      die "missing:$m. Install with:  sudo apt-get update && sudo apt-get install -y $apt_pkgs"
    fi
  fi
  for v in kal kal16 awb slt rms; do
    flite -lv | grep -qw "$v" || die "flite voice $v missing (Debian package flite)"
  done
  espeak-ng --voices=en | grep -q " en-029 " || die "espeak-ng voice en-029 missing"
  local p
  for p in $real_pkgs; do
    if [ -z "$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}' | grep -v none)" ]; then
      log "WARNING: Debian package $p not available (apt-get update?): the real-speech" \
          "test set will lack its recordings"
    fi
  done
  if [ ! -x "$python" ]; then
    [ "$python" = "$(source "$repo/tools/venv_path.sh" && echo "$VENV/bin/python")" ] \
      || die "python $python not found"
    log "no virtual environment yet: bash tools/setup_env.sh"
    bash "$repo/tools/setup_env.sh"
  fi
  # find_spec only (importing ESPnet takes a while on a loaded machine)
  "$python" - <<'PY' || die "Python environment incomplete: run  bash tools/setup_env.sh  (repo root)"
import importlib.util
import sys

mods = (
    "torch",
    "espnet2.tasks.asr",
    "espnet_multiblank.bin.asr_train",
    "espnet_multiblank.bin.asr_inference",
    "matplotlib",
    "soundfile",
    "yaml",
)
missing = [m for m in mods if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python modules: {missing}")
PY
  log "tools ok: sox $(sox --version | awk '{print $NF}'), espeak-ng, flite, festival," \
      "python $("$python" -c 'import sys; print(sys.version.split()[0])')"
}

# ------------------------------------------------------ stage 2: data synthesis
accounts=$wavdir/accounts.txt   # the known account numbers (stage 2)
stage_synth() {
  local t0=$SECONDS s n seed texts params
  mkdir -p "$wavdir"
  "$python" "$recipe/local/make_accounts.py" --num "$num_accounts" --seed 4 "$accounts"
  for s in train dev test dev_known test_known; do
    texts=()
    case $s in
      train) n=$num_train; seed=1 ;;
      dev) n=$num_dev; seed=2 ;;
      test) n=$num_test; seed=3 ;;
      dev_known) n=$num_known_dev; seed=5; texts=(--texts "$accounts") ;;
      test_known) n=$num_known_test; seed=6; texts=(--texts "$accounts") ;;
    esac
    params="$s $n $seed"
    [ ${#texts[@]} -eq 0 ] || params="$params accounts $num_accounts"
    # a set completed by an interrupted earlier run (renamed only after success) is kept
    # if it was made with the same parameters
    if [ "$(cat "$wavdir/$s/params" 2>/dev/null)" = "$params" ]; then
      log "$s: kept from an earlier run ($n utterances)"
      continue
    fi
    rm -rf "$wavdir/$s" "$wavdir/$s.tmp"
    "$python" "$recipe/local/synth_digits.py" --set $s --num "$n" --seed $seed \
      --nj "$nj" "${texts[@]}" "$wavdir/$s.tmp"
    # the manifest holds absolute paths: fix them for the final name
    sed -i "s#$wavdir/$s.tmp/#$wavdir/$s/#" "$wavdir/$s.tmp/manifest.tsv"
    echo "$params" > "$wavdir/$s.tmp/params"
    mv "$wavdir/$s.tmp" "$wavdir/$s"
  done
  log "synthetic data: $((SECONDS - t0)) s"

  # real speech: recordings of isolated digits from Debian packages, never installed
  rm -rf "$wavdir/test_real" "$wavdir/test_real.tmp" "$wavdir/debs.tmp"
  mkdir -p "$wavdir/debs.tmp/x"
  local p got=0
  for p in $real_pkgs; do
    if (cd "$wavdir/debs.tmp" && apt-get download -q "$p" >/dev/null 2>&1); then
      got=$((got + 1))
    else
      log "WARNING: apt-get download $p failed"
    fi
  done
  for p in "$wavdir"/debs.tmp/*.deb; do
    [ -e "$p" ] && dpkg -x "$p" "$wavdir/debs.tmp/x"
  done
  if [ $got -gt 0 ] && "$python" "$recipe/local/make_real_digits.py" \
      --root "$wavdir/debs.tmp/x" --num_per_speaker "$num_real" "$wavdir/test_real.tmp"; then
    sed -i "s#$wavdir/test_real.tmp/#$wavdir/test_real/#" "$wavdir/test_real.tmp/manifest.tsv"
    mv "$wavdir/test_real.tmp" "$wavdir/test_real"
  else
    log "WARNING: no real-speech test set (packages $real_pkgs unavailable)"
    rm -rf "$wavdir/test_real.tmp"
  fi
  rm -rf "$wavdir/debs.tmp"
  du -sh "$wavdir"/* | sed 's/^/    /'
}

# --------------------------------------------------------- stage 3: data dirs
stage_data() {
  local s
  mkdir -p "$data"
  for s in train dev test test_real dev_known test_known; do
    rm -rf "$data/$s"
    if [ -f "$wavdir/$s/manifest.tsv" ]; then
      "$python" "$recipe/local/data_prep.py" "$wavdir/$s/manifest.tsv" "$data/$s"
    fi
    # the known word boundaries of test_real (local/make_real_digits.py)
    if [ -f "$wavdir/$s/word_times" ]; then
      cp "$wavdir/$s/word_times" "$data/$s/word_times"
    fi
  done
  for s in train dev test dev_known test_known; do
    [ -f "$data/$s/wav.scp" ] || die "data dirs incomplete: no $data/$s"
  done
  # the text of the known LM: the account list itself
  rm -rf "$data/accounts"
  mkdir -p "$data/accounts.tmp"
  cp "$accounts" "$data/accounts.tmp/text"
  mv "$data/accounts.tmp" "$data/accounts"
}

# -------------------------------------------------------- stage 4: token list
stage_tokens() {
  "$python" "$recipe/local/make_token_list.py" "$data/train/text" "$token_list"
}

# ----------------------------------------------------- stage 5: collect_stats
common_args() {
  echo --use_preprocessor true --token_type word --token_list "$token_list" \
    --non_linguistic_symbols none --cleaner none --g2p none \
    --train_data_path_and_name_and_type "$data/train/wav.scp,speech,sound" \
    --train_data_path_and_name_and_type "$data/train/text,text,text" \
    --valid_data_path_and_name_and_type "$data/dev/wav.scp,speech,sound" \
    --valid_data_path_and_name_and_type "$data/dev/text,text,text"
}
collect_stats() {  # collect_stats CONFIG DIR: feature statistics and shapes into DIR
  local config=$1 dir=$2
  rm -rf "$dir" "$dir.tmp"
  mkdir -p "$dir.tmp"
  # shellcheck disable=SC2046
  "${train_cmd[@]}" --collect_stats true --ngpu 0 --config "$config" \
    $(common_args) --normalize none \
    --train_shape_file "$data/train/wav.scp" --valid_shape_file "$data/dev/wav.scp" \
    --batch_size 32 --output_dir "$dir.tmp" > "$dir.tmp/collect_stats.log" 2>&1 \
    || { tail -n 30 "$dir.tmp/collect_stats.log" >&2; die "collect_stats failed"; }
  # ESPnet's asr.sh: text_shape.<token_type> = "utt length,vocab_size"
  local v s
  v=$(wc -l < "$token_list")
  for s in train valid; do
    awk -v N="$v" '{ print $0 "," N }' "$dir.tmp/$s/text_shape" \
      > "$dir.tmp/$s/text_shape.word"
  done
  [ -s "$dir.tmp/train/feats_stats.npz" ] || die "no feats_stats.npz in $dir.tmp"
  mv "$dir.tmp" "$dir"
}
stage_stats() {
  # the model is built (to run its frontend) from the standard config; the frontend is
  # the same in the three configs; stage 9's models have sherpa-onnx's (kaldi_fbank)
  local pid="" m
  for m in $sherpa_models; do
    collect_stats "$(sherpa_config "$m")" "$stats_dir_kaldi" & pid=$!
    break  # one front end for all of them
  done
  collect_stats "$train_config" "$stats_dir"
  [ -z "$pid" ] || wait "$pid" || die "collect_stats ($stats_dir_kaldi) failed"
}
sherpa_config() {  # sherpa_config MODEL: its config on sherpa-onnx's features
  echo "$recipe/conf/train_${1}_kaldi.yaml"
}

# ----------------------------------------------------- stages 6, 7, 8: training
train_model() {  # train_model NAME CONFIG [STATS_DIR]
  local name=$1 config=$2 stats=${3:-$stats_dir}
  local out=$exp/asr_$name
  rm -rf "$out" "$out.tmp"
  mkdir -p "$out.tmp"
  log "training $name ($config): progress in $out.tmp/train.log"
  local t0=$SECONDS
  # shellcheck disable=SC2046,SC2086
  local threads=() ddp=()
  [ "$train_jobs" -gt 1 ] && threads=(env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1)
  if [ "$train_procs" -gt 1 ]; then
    # N CPU workers started by the plug-in (gloo); a rank that dies stops the run, one
    # that hangs makes the others fail after --dist_timeout
    ddp=(--multiprocessing_distributed true --dist_world_size "$train_procs"
      --dist_timeout 600)
  fi
  "${threads[@]}" "${train_cmd[@]}" --ngpu 0 --config "$config" $(common_args) \
    --normalize_conf stats_file="$stats/train/feats_stats.npz" \
    --train_shape_file "$stats/train/speech_shape" \
    --train_shape_file "$stats/train/text_shape.word" \
    --valid_shape_file "$stats/valid/speech_shape" \
    --valid_shape_file "$stats/valid/text_shape.word" \
    --resume false --output_dir "$out.tmp" "${ddp[@]}" $train_args \
    > "$out.tmp/train.log" 2>&1 &
  local pid=$!
  # show ESPnet's per-epoch summaries while it runs
  tail -n +1 -F --pid=$pid "$out.tmp/train.log" 2>/dev/null | grep --line-buffered -E \
    "epoch results|Traceback|Error|best model" | sed -u "s/^/    [$name] /" &
  local tailpid=$!
  local rc=0
  wait $pid || rc=$?
  wait $tailpid 2>/dev/null || true  # tail --pid ends with the training process
  if [ $rc -ne 0 ]; then
    tail -n 40 "$out.tmp/train.log" >&2
    die "training $name failed (rc $rc), log: $out.tmp/train.log"
  fi
  [ -e "$out.tmp/$inference_model" ] || die "training $name: no $inference_model"
  echo "$((SECONDS - t0))" > "$out.tmp/train_seconds"
  echo "$train_procs" > "$out.tmp/train_procs"
  # ESPnet's symlinks (valid.loss.ave.pth, ...) are relative: the rename keeps them valid
  mv "$out.tmp" "$out"
  # config.yaml holds absolute output paths of the temporary dir: harmless, but fix them
  sed -i "s#$out.tmp#$out#g" "$out/config.yaml"
}
stage_train_std() { train_model standard "$train_config"; }
stage_train_mb() { train_model multiblank "$mb_train_config"; }
stage_train_tdt() { train_model tdt "$tdt_train_config"; }
stage_train_sherpa() {  # one after the other (one by default: the TDT)
  local m
  for m in $sherpa_models; do
    train_model "${m}_kaldi" "$(sherpa_config "$m")" "$stats_dir_kaldi"
  done
}

# stage number, name, function of the trainings, in order (and the first stage that
# depends on them: decoding, 11, for 6-8; deployment, 14, for 9)
train_stages=(
  "6 train_standard stage_train_std 11"
  "7 train_multiblank stage_train_mb 11"
  "8 train_tdt stage_train_tdt 11"
)
[ -z "$sherpa_models" ] || train_stages+=("9 train_sherpa stage_train_sherpa 14")
# at most $train_jobs trainings at a time, in stage order
run_trainings() {
  local spec p rc=0 running pids=()
  if [ "$train_jobs" -le 1 ]; then
    for spec in "${train_stages[@]}"; do
      # shellcheck disable=SC2086
      run_stage $spec
    done
    return 0
  fi
  for spec in "${train_stages[@]}"; do
    while :; do  # bash reaps finished children at once: kill -0 fails for them
      running=0
      for p in "${pids[@]}"; do
        if kill -0 "$p" 2>/dev/null; then running=$((running + 1)); fi
      done
      [ "$running" -ge "$train_jobs" ] || break
      sleep 5
    done
    # shellcheck disable=SC2086
    run_stage $spec &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    wait "$p" || rc=1
  done
  [ $rc -eq 0 ] || die "training failed"
}

# ----------------------------------------------------------- stage 10: LMs
# train_lm NAME CONFIG TRAIN_TEXT VALID_TEXT: ESPnet's LM trainer (espnet2.bin.lm_train,
# imported after the plug-in's quiet module, as the ASR trainings are)
train_lm() {
  local name=$1 config=$2 text=$3 valid=$4
  local out=$exp/lm_$name t0=$SECONDS v f
  rm -rf "$out" "$out.tmp"
  mkdir -p "$out.tmp/shapes"
  v=$(wc -l < "$token_list")
  # ESPnet's text shape files: "key tokens,vocabulary" (word tokens)
  for f in train:"$text" valid:"$valid"; do
    awk -v V="$v" 'NF > 1 { print $1 " " (NF - 1) "," V }' "${f#*:}" \
      > "$out.tmp/shapes/${f%%:*}_shape.word"
  done
  log "training LM $name ($config) on $text: progress in $out.tmp/train.log"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$python" -c \
    'import espnet_multiblank.espnet.registration.quiet; from espnet2.bin.lm_train import main; main()' \
    --ngpu 0 --config "$config" --use_preprocessor true --token_type word \
    --token_list "$token_list" --non_linguistic_symbols none --cleaner none --g2p none \
    --train_data_path_and_name_and_type "$text,text,text" \
    --valid_data_path_and_name_and_type "$valid,text,text" \
    --train_shape_file "$out.tmp/shapes/train_shape.word" \
    --valid_shape_file "$out.tmp/shapes/valid_shape.word" \
    --resume false --output_dir "$out.tmp" $lm_args > "$out.tmp/train.log" 2>&1 \
    || { tail -n 30 "$out.tmp/train.log" >&2; die "LM training $name failed: $out.tmp/train.log"; }
  [ -e "$out.tmp/valid.loss.best.pth" ] || die "LM $name: no valid.loss.best.pth"
  echo "$((SECONDS - t0))" > "$out.tmp/train_seconds"
  mv "$out.tmp" "$out"
  sed -i "s#$out.tmp#$out#g" "$out/config.yaml"
}
stage_lms() {  # the two LMs side by side (one torch thread each)
  local pids=() rc=0 p
  train_lm train "$lm_config" "$data/train/text" "$data/dev/text" &
  pids+=($!)
  train_lm known "$lm_known_config" "$data/accounts/text" "$data/dev_known/text" &
  pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc = 0 ] || die "LM training failed (the end of its log is above)"
}

# ---------------------------------------------------------- decoding, shared
# model:search pairs; the speed comparison is greedy (standard) vs mb_greedy (multi-blank).
# standard:mb_greedy runs the plug-in's greedy code on the standard model (no big blanks):
# the same implementation on both models, which isolates the gain of the big blanks.
# model:search[:batch] (batch 1 if not given): one utterance at a time, then the
# batched beam searches of two rules (beam_sync frame and label; step: mb_beam_step,
# tdt_beam_step)
decode_jobs=${decode_jobs:-"standard:greedy standard:beam standard:mb_greedy multiblank:mb_greedy
  multiblank:mb_beam tdt:tdt_greedy tdt:tdt_beam $batched_jobs"}
# Throughput on the first test set, end to end (features, encoder, search, I/O; model
# loading excluded): model:search:batch:entry, entry "stock" = ESPnet's own
# `python -m espnet2.bin.asr_inference` (the start-up hook makes it decode the plug-in's
# models right; batch 1 only), "plugin" = espnet_multiblank.bin.asr_inference (batched
# encoder + batched search). The first job is the yardstick of the report's ratios.
throughput_jobs="standard:greedy:1:stock standard:mb_greedy:32:plugin
  multiblank:mb_greedy:32:plugin tdt:tdt_greedy:32:plugin"
throughput_dir() {  # throughput_dir MODEL SEARCH BATCH ENTRY
  echo "$exp/asr_$1/throughput_${4}_${2}_b${3}_${inference_model%.pth}"
}
# a job "model:search[:batch]": NAME SEARCH BS (1 if not given) and TAG, the search's
# name in directory names (SEARCH, or SEARCH_bBS when batched)
parse_job() {  # parse_job JOB: sets name search bs tag
  IFS=: read -r name search bs <<< "$1"
  bs=${bs:-1}
  tag=$search
  [ "$bs" = 1 ] || tag=${search}_b$bs
}
ctm_args() {  # ctm_args SEARCH SET: --write_ctm for the plug-in's searches on test_real
  case $1 in
    mb_*|tdt_*) [ "$2" = test_real ] && echo "--write_ctm true" ;;
  esac
  return 0
}
decode_dir() {  # decode_dir MODEL TAG [LM WEIGHT]: the parent of the per-set dirs
  if [ $# -eq 3 ]; then  # decode_dir MODEL SEARCH DTYPE
    echo "$exp/asr_$1/decode_${2}_${3}_${inference_model%.pth}"
  elif [ $# -ge 4 ]; then
    echo "$exp/asr_$1/decode_${2}_lm_${3}_w${4}_${inference_model%.pth}"
  else
    echo "$exp/asr_$1/decode_${2}_${inference_model%.pth}"
  fi
}
# decoding_args MODEL SEARCH SET BATCH [EXTRA...]: the inference arguments of one
# decoding (both entry points), --output_dir excluded
decoding_args() {
  local name=$1 search=$2 s=$3 bs=$4
  shift 4
  printf '%s\n' --ngpu 0 --config "$decode_conf_dir/$search.yaml" --batch_size "$bs" \
    --data_path_and_name_and_type "$data/$s/wav.scp,speech,sound" \
    --key_file "$data/$s/wav.scp" \
    --asr_train_config "$exp/asr_$name/config.yaml" \
    --asr_model_file "$exp/asr_$name/$inference_model" "$@"
}
check_conf() {  # check_conf SEARCH: its decoding config exists
  [ -f "$decode_conf_dir/$1.yaml" ] || die "missing decode config $decode_conf_dir/$1.yaml"
}
# decode_stock OUT MODEL SEARCH SET BATCH: one data set with ESPnet's own entry point
# (`python -m espnet2.bin.asr_inference`, the start-up hook), in a process of its own,
# into OUT (written as OUT.tmp, renamed when complete); $decode_threads torch threads
decode_stock() {
  local out=$1 args
  check_conf "$3"
  mapfile -t args < <(decoding_args "${@:2}")
  rm -rf "$out" "$out.tmp"
  mkdir -p "$out.tmp"
  OMP_NUM_THREADS=$decode_threads MKL_NUM_THREADS=$decode_threads \
    "$python" -m espnet2.bin.asr_inference "${args[@]}" --output_dir "$out.tmp" \
    > "$out.tmp.log" 2>&1 \
    || { tail -n 30 "$out.tmp.log" >&2; die "decoding failed: $out.tmp.log"; }
  mv "$out.tmp.log" "$out.tmp/decode.log"
  [ -f "$out.tmp/1best_recog/text" ] || die "no 1best_recog/text in $out.tmp"
  [ -f "$out.tmp/decoding_stats.json" ] || die "no decoding_stats.json in $out.tmp"
  mv "$out.tmp" "$out"
}
# The plug-in's decodings go through a queue: queue_decode OUT MODEL SEARCH SET BATCH
# [EXTRA...] adds one (into OUT, as decode_stock), queue_score SET OUT has OUT scored
# once decoded, queue_run N WHAT decodes the queued jobs in N processes
# (local/decode_many.py: each process imports ESPnet once, not once per decoding; with
# N = 1 the jobs run one after the other, so their times compare), scores and empties
# the queue. Each process has $decode_threads torch threads.
queue=""  # set by stage_decode etc. (under $exp)
queue_reset() { queue=$exp/decode_queue; rm -rf "$queue" "$queue.claims" "$queue.score"; }
queue_decode() {
  local out=$1 args
  check_conf "$3"
  mapfile -t args < <(decoding_args "${@:2}")
  ( IFS=$'\t'; echo "$out"$'\t'"${args[*]}" ) >> "$queue"
}
queue_score() { echo "$1 $2" >> "$queue.score"; }
queue_run() {
  local n=$1 what=$2 i rc=0 pids=() s out
  [ -s "$queue" ] || return 0
  log "$what: $(wc -l < "$queue") decodings in $n process(es)"
  rm -rf "$queue.claims"
  for ((i = 0; i < n; i++)); do
    OMP_NUM_THREADS=$decode_threads MKL_NUM_THREADS=$decode_threads \
      "$python" "$recipe/local/decode_many.py" "$queue" --worker "$i" &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  [ $rc = 0 ] || die "$what: decoding failed (the end of its log is above)"
  if [ -f "$queue.score" ]; then
    while read -r s out; do score "$s" "$out" > /dev/null; done < "$queue.score"
  fi
  queue_reset
}
score() {  # score SET DECODE_DIR (and its word times against known boundaries)
  "$python" "$recipe/local/score.py" "$data/$1/text" "$2/1best_recog/text" "$2"
  if [ -f "$2/1best_recog/ctm" ] && [ -f "$data/$1/word_times" ]; then
    "$python" "$recipe/local/score_times.py" "$data/$1/word_times" \
      "$2/1best_recog/ctm" "$2"
  fi
}
# ------------------------------------------------------------ stage 11: decode
stage_decode() {
  local job name search s bs entry tag dtype
  queue_reset
  for job in $decode_jobs; do
    parse_job "$job"
    for s in $test_sets; do
      [ -f "$data/$s/wav.scp" ] || { log "no $s data: skipped"; continue; }
      # shellcheck disable=SC2046
      queue_decode "$(decode_dir "$name" "$tag")/$s" "$name" "$search" "$s" "$bs" \
        $(ctm_args "$search" "$s")
    done
  done
  s=${test_sets%% *}
  for job in $throughput_jobs; do
    IFS=: read -r name search bs entry <<< "$job"
    if [ "$entry" = plugin ]; then
      queue_decode "$(throughput_dir "$name" "$search" "$bs" "$entry")/$s" "$name" \
        "$search" "$s" "$bs"
    fi
  done
  # one process, $decode_threads torch threads, one decoding at a time: the decoding
  # times are comparable between searches (batch 1, or the batched searches' batch)
  queue_run 1 "decoding $test_sets (timed)"
  for job in $throughput_jobs; do
    IFS=: read -r name search bs entry <<< "$job"
    [ "$entry" = plugin ] && continue
    log "throughput: $s with $name / $search, batch $bs, $entry entry point"
    decode_stock "$(throughput_dir "$name" "$search" "$bs" "$entry")/$s" "$name" \
      "$search" "$s" "$bs"
  done
  for job in $dtype_jobs; do
    name=${job%%:*}
    search=${job#*:}
    for dtype in $dtypes; do
      queue_decode "$(decode_dir "$name" "$search" "$dtype")/$s" "$name" "$search" \
        "$s" "$dtype_batch" --dtype "$dtype"
    done
  done
  queue_run "$lm_decode_jobs" "half precision on $s"
}

# ----------------------------------------------------- stage 12: LM decoding
# LM NAME: its dev set and test sets
lm_dev() { case $1 in train) echo dev ;; known) echo dev_known ;; esac; }
lm_tests() { case $1 in train) echo "$test_sets" ;; known) echo test_known ;; esac; }
lm_candidates() { case $1 in train) echo "$lm_weights" ;; known) echo "$lm_known_weights" ;; esac; }
lm_weight_file() {  # lm_weight_file MODEL TAG LM: the weight chosen on dev
  echo "$exp/asr_$1/lm_${3}_weight_${2}_${inference_model%.pth}.json"
}
lm_decode() {  # lm_decode MODEL SEARCH BS LM WEIGHT SET: queue SET's decoding, scored
  local out tag=$2
  [ "$3" = 1 ] || tag=${2}_b$3
  out=$(decode_dir "$1" "$tag" "$4" "$5")/$6
  queue_decode "$out" "$1" "$2" "$6" "$3" --lm_train_config "$exp/lm_$4/config.yaml" \
    --lm_file "$exp/lm_$4/valid.loss.best.pth" --lm_weight "$5"
  queue_score "$6" "$out"
}
plain_decode() {  # plain_decode MODEL SEARCH BS SET: the same without an LM
  local out tag=$2
  [ "$3" = 1 ] || tag=${2}_b$3
  out=$(decode_dir "$1" "$tag")/$4
  queue_decode "$out" "$1" "$2" "$4" "$3"
  queue_score "$4" "$out"
}
chosen_weight() {  # chosen_weight MODEL LM: the weight lm_searches chose for MODEL
  local job name search bs tag
  for job in $lm_searches; do
    parse_job "$job"
    if [ "$name" = "$1" ]; then
      "$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["chosen"])' \
        "$(lm_weight_file "$name" "$tag" "$2")"
      return 0
    fi
  done
  die "no --lm_searches entry for model $1 (needed by --lm_extra_jobs)"
}
stage_lm_decode() {
  local lm job name search bs tag dev s w weights
  queue_reset
  # the weight grids of both LMs on their dev sets, then the test sets at the weights
  # chosen (two queues: each of its processes imports ESPnet once)
  for lm in train known; do
    dev=$(lm_dev $lm)
    log "LM $lm: weights $(lm_candidates $lm) on $dev, searches $lm_searches"
    for job in $lm_searches; do
      parse_job "$job"
      plain_decode "$name" "$search" "$bs" "$dev"
      for w in $(lm_candidates $lm); do
        lm_decode "$name" "$search" "$bs" $lm "$w" "$dev"
      done
    done
  done
  queue_run "$lm_decode_jobs" "LM weights on $(lm_dev train), $(lm_dev known)"
  for lm in train known; do
    dev=$(lm_dev $lm)
    for job in $lm_searches; do
      parse_job "$job"
      weights=()
      for w in $(lm_candidates $lm); do
        weights+=("$w=$(decode_dir "$name" "$tag" $lm "$w")/$dev/score.json")
      done
      "$python" "$recipe/local/choose_lm_weight.py" \
        --no_lm "$(decode_dir "$name" "$tag")/$dev/score.json" \
        "$(lm_weight_file "$name" "$tag" $lm)" "${weights[@]}"
      w=$(chosen_weight "$name" $lm)
      for s in $(lm_tests $lm); do
        [ -f "$data/$s/wav.scp" ] || continue
        lm_decode "$name" "$search" "$bs" $lm "$w" "$s"
        if [ $lm = known ]; then plain_decode "$name" "$search" "$bs" "$s"; fi
      done
    done
    # at the chosen weights: the one-at-a-time reference (test_known only) and the
    # other batched searches (test_known with and without the known LM, test with
    # the train LM)
    for job in $lm_extra_jobs; do
      parse_job "$job"
      w=$(chosen_weight "$name" $lm)
      if [ $lm = known ]; then
        lm_decode "$name" "$search" "$bs" $lm "$w" test_known
        [ "$bs" = 1 ] || plain_decode "$name" "$search" "$bs" test_known
      elif [ "$bs" != 1 ]; then
        lm_decode "$name" "$search" "$bs" $lm "$w" "${test_sets%% *}"
      fi
    done
  done
  queue_run "$lm_decode_jobs" "the test sets at the chosen LM weights"
}

# --------------------------------------------------------- stage 13: streaming
chunk_dir() {  # chunk_dir MODEL SEARCH CHUNK: offline at a chunk (per-set dirs below)
  echo "$exp/asr_$1/chunk_${2}_c${3}_${inference_model%.pth}"
}
stream_dir() {  # stream_dir MODEL SEARCH CHUNK STREAMS: the parent of the per-set dirs
  echo "$exp/asr_$1/stream_${2}_c${3}_b${4}_${inference_model%.pth}"
}
stream_keys() {  # stream_keys SET: the key file of the streamed utterances
  echo "$exp/stream_keys_$1"
}
stream_decode() {  # stream_decode MODEL SEARCH CHUNK STREAMS SET: queue its streaming
  queue_decode "$(stream_dir "$1" "$2" "$3" "$4")/$5" "$1" "$2" "$5" "$4" \
    --streaming true --streaming_chunk_size "$3" --sim_chunk_length "$stream_piece" \
    --key_file "$(stream_keys "$5")"
}
stage_stream() {
  local job name search c s n
  queue_reset
  s=${test_sets%% *}
  # every k-th utterance (the sets are sorted by speaker): $stream_utts of each set
  for n in $test_sets; do
    [ -f "$data/$n/wav.scp" ] || continue
    awk -v total="$(wc -l < "$data/$n/wav.scp")" -v want="$stream_utts" \
      'BEGIN { k = int((total + want - 1) / want); if (k < 1) k = 1 }
       (NR - 1) % k == 0 { print $1 }' "$data/$n/wav.scp" > "$(stream_keys "$n")"
  done
  for job in $stream_jobs; do
    name=${job%%:*}
    search=${job#*:}
    for c in $stream_chunks; do
      # (a) the streams' hypotheses for all of test: offline, chunk-masked, batched
      queue_decode "$(chunk_dir "$name" "$search" "$c")/$s" "$name" "$search" "$s" 32 \
        --streaming_chunk_size "$c"
      # (b) timed: one stream at a time
      stream_decode "$name" "$search" "$c" 1 "$s"
    done
    # $stream_batch streams at once at chunk $stream_batch_chunk (timed)
    stream_decode "$name" "$search" "$stream_batch_chunk" "$stream_batch" "$s"
  done
  # one decoding at a time, $decode_threads torch threads: the times compare
  queue_run 1 "streaming $s (timed)"
  # (c) emission delays against the known word boundaries: audio time, not wall time
  [ -f "$data/test_real/wav.scp" ] || { log "no test_real data: no emission delays"; return 0; }
  for job in $stream_jobs; do
    name=${job%%:*}
    search=${job#*:}
    for c in $stream_chunks; do
      stream_decode "$name" "$search" "$c" 1 test_real
    done
  done
  queue_run "$lm_decode_jobs" "streaming test_real"
}

# ----------------------------------------------------------- stage 14: deploy
onnx_dir() {  # onnx_dir MODEL: the model exported to ONNX
  echo "$exp/asr_$1/onnx_${inference_model%.pth}"
}
runtime_dir() {  # runtime_dir MODEL TAG: the parent of the runtime's per-set dirs
  echo "$exp/asr_$1/runtime_${2}_${inference_model%.pth}"
}
# runtime_args TAG: the runtime's decode options of a tag (deploy_tags above)
runtime_args() {
  local tag=$1 search chunk bs
  case $tag in
    greedy_b*|beam_b*)
      search=${tag%%_b*}; bs=${tag##*_b}
      echo "--search $search --batch_size $bs" ;;
    stream_greedy_c*|stream_beam_c*)
      search=${tag#stream_}; search=${search%%_c*}; chunk=${tag##*_c}
      echo "--search $search --streaming --chunk_ms $((chunk * 40))" \
        "--piece_ms $((stream_piece * 1000 / 8000)) --batch_size 16" ;;
    *) die "unknown deploy tag $tag (greedy_bN, beam_bN, stream_greedy_cN, stream_beam_cN)" ;;
  esac
}
export_model() {  # export_model NAME DIR [FORMAT]: the model exported to ONNX
  local name=$1 out=$2 format=${3:-native}
  log "deploy: exporting $name ($format) to $out"
  "$python" -m espnet_multiblank.bin.export_onnx --overwrite --format "$format" \
    --asr_train_config "$exp/asr_$name/config.yaml" \
    --asr_model_file "$exp/asr_$name/$inference_model" \
    --output_dir "$out" > "$out.log" 2>&1 \
    || { tail -n 20 "$out.log" >&2; die "export of $name failed: $out.log"; }
}
# runtime_decode NAME TAG ARGS...: the runtime's decoding of the first test set into
# runtime_dir NAME TAG (written as .tmp, renamed when complete)
runtime_decode() {
  local name=$1 tag=$2 s=${test_sets%% *} out
  shift 2
  out=$(runtime_dir "$name" "$tag")/$s
  rm -rf "$out" "$out.tmp"
  mkdir -p "$(dirname "$out")"
  "$python" -m espnet_multiblank.runtime.decode --model_dir "$(onnx_dir "$name")" \
    --wav_scp "$data/$s/wav.scp" --output_dir "$out.tmp" --num_threads 1 "$@" \
    > "$out.tmp.log" 2>&1 \
    || { tail -n 20 "$out.tmp.log" >&2; die "runtime decoding failed: $out.tmp.log"; }
  mkdir -p "$out.tmp/1best_recog"
  mv "$out.tmp/text" "$out.tmp/1best_recog/text"
  mv "$out.tmp.log" "$out.tmp/decode.log"
  mv "$out.tmp" "$out"
  log "deploy: $name $tag: $(grep -o '"real_time_factor": [0-9.e-]*' "$out/decoding_stats.json")"
}
sherpa_dir() {  # sherpa_dir NAME: the model exported for sherpa-onnx
  echo "$exp/asr_$1/sherpa_onnx_${inference_model%.pth}"
}
sherpa_decode_dir() {  # sherpa_decode_dir NAME: sherpa-onnx's decodings (per set)
  echo "$exp/asr_$1/sherpa_greedy_${inference_model%.pth}"
}
stage_deploy() {
  local name tag s out m greedy
  s=${test_sets%% *}
  for name in $deploy_models; do
    export_model "$name" "$(onnx_dir "$name")"
    for tag in $deploy_tags; do
      # shellcheck disable=SC2046
      runtime_decode "$name" "$tag" $(runtime_args "$tag")
    done
  done
  # stage 9's models: sherpa-onnx, and the runtime and the plug-in beside it (one
  # utterance at a time, one thread each)
  queue_reset
  for m in $sherpa_models; do
    name=${m}_kaldi
    greedy=mb_greedy; [ "$m" = tdt ] && greedy=tdt_greedy
    export_model "$name" "$(sherpa_dir "$name")" sherpa_onnx
    export_model "$name" "$(onnx_dir "$name")"
    out=$(sherpa_decode_dir "$name")/$s
    rm -rf "$out"
    "$python" "$recipe/local/decode_sherpa.py" "$(sherpa_dir "$name")" \
      "$data/$s/wav.scp" "$out" || die "sherpa-onnx decoding of $name failed"
    log "deploy: $name sherpa-onnx: $(grep -o '"rtf": [0-9.e-]*' "$out/decoding_stats.json")"
    runtime_decode "$name" greedy_b1 --search greedy --batch_size 1
    runtime_decode "$name" nemo_b1 --search greedy --blank_decision nemo --batch_size 1
    queue_decode "$(decode_dir "$name" "$greedy")/$s" "$name" "$greedy" "$s" 1
  done
  queue_run 1 "the plug-in's greedy search on stage 9's models"
}

# ------------------------------------------------------------ stage 15: score
score_subset() {  # score_subset SET DECODE_DIR: the streamed utterances of SET only
  awk 'NR == FNR { keep[$1] = 1; next } $1 in keep' "$(stream_keys "$1")" \
    "$data/$1/text" > "$2/ref_text"
  "$python" "$recipe/local/score.py" "$2/ref_text" "$2/1best_recog/text" "$2"
}
emission_delay() {  # emission_delay DECODE_DIR: test_real word ends vs emission times
  "$python" "$recipe/local/emission_delay.py" "$data/test_real/text" \
    "$data/test_real/word_times" "$1"
}
stage_score() {
  local job name search s bs entry lm w tag m d
  for job in $decode_jobs; do
    parse_job "$job"
    for s in $test_sets; do
      [ -d "$(decode_dir "$name" "$tag")/$s" ] || continue
      score "$s" "$(decode_dir "$name" "$tag")/$s"
    done
  done
  s=${test_sets%% *}
  for job in $throughput_jobs; do
    IFS=: read -r name search bs entry <<< "$job"
    [ -d "$(throughput_dir "$name" "$search" "$bs" "$entry")/$s" ] || continue
    score "$s" "$(throughput_dir "$name" "$search" "$bs" "$entry")/$s"
  done
  for job in $dtype_jobs; do
    name=${job%%:*}
    search=${job#*:}
    for w in $dtypes; do
      [ -d "$(decode_dir "$name" "$search" "$w")/$s" ] || continue
      score "$s" "$(decode_dir "$name" "$search" "$w")/$s"
    done
  done
  for job in $stream_jobs; do
    name=${job%%:*}
    search=${job#*:}
    for c in $stream_chunks; do
      s=${test_sets%% *}
      [ -d "$(chunk_dir "$name" "$search" "$c")/$s" ] \
        && score "$s" "$(chunk_dir "$name" "$search" "$c")/$s"
      [ -d "$(stream_dir "$name" "$search" "$c" 1)/$s" ] \
        && score_subset "$s" "$(stream_dir "$name" "$search" "$c" 1)/$s"
      if [ -f "$data/test_real/word_times" ] \
          && [ -d "$(stream_dir "$name" "$search" "$c" 1)/test_real" ]; then
        score_subset test_real "$(stream_dir "$name" "$search" "$c" 1)/test_real"
        emission_delay "$(stream_dir "$name" "$search" "$c" 1)/test_real"
      fi
    done
    s=${test_sets%% *}
    c=$stream_batch_chunk
    [ -d "$(stream_dir "$name" "$search" "$c" "$stream_batch")/$s" ] \
      && score_subset "$s" "$(stream_dir "$name" "$search" "$c" "$stream_batch")/$s"
  done
  s=${test_sets%% *}
  for name in $deploy_models; do
    for tag in $deploy_tags; do
      [ -d "$(runtime_dir "$name" "$tag")/$s" ] && score "$s" "$(runtime_dir "$name" "$tag")/$s"
    done
  done
  for m in $sherpa_models; do
    name=${m}_kaldi
    for d in "$(sherpa_decode_dir "$name")" "$(runtime_dir "$name" greedy_b1)" \
        "$(runtime_dir "$name" nemo_b1)" "$(decode_dir "$name" mb_greedy)" \
        "$(decode_dir "$name" tdt_greedy)"; do
      [ -d "$d/$s" ] && score "$s" "$d/$s"
    done
  done
  for job in $lm_searches $lm_extra_jobs; do  # the LM decodings (scored in stage 12
    parse_job "$job"                           # already: again)
    for lm in train known; do
      for w in $(lm_candidates $lm); do
        for s in $(lm_dev $lm) $(lm_tests $lm); do
          [ -d "$(decode_dir "$name" "$tag" $lm "$w")/$s" ] || continue
          score "$s" "$(decode_dir "$name" "$tag" $lm "$w")/$s"
        done
      done
    done
  done
}

# ----------------------------------------------------------- stage 16: report
stage_report() {
  "$python" "$recipe/local/make_report.py" --exp "$exp" --data "$data" --wavdir "$wavdir" \
    --inference_model "${inference_model%.pth}" --decode_jobs "$decode_jobs" \
    --throughput_jobs "$throughput_jobs" --lm_searches "$lm_searches" \
    --lm_extra_jobs "$lm_extra_jobs" \
    --dtype_jobs "$dtype_jobs" --dtypes "$dtypes" \
    --stream_jobs "$stream_jobs" --stream_chunks "$stream_chunks" \
    --stream_batch "$stream_batch" --stream_batch_chunk "$stream_batch_chunk" \
    --stream_utts "$stream_utts" \
    --deploy_models "$deploy_models" --deploy_tags "$deploy_tags" \
    --sherpa_models "$sherpa_models" \
    --test_sets "$test_sets" --train_jobs "$train_jobs" $($smoke && echo --smoke)
  if ! $smoke; then
    cp "$exp/RESULTS.md" "$recipe/RESULTS.md"
    cp "$exp/valid_loss.png" "$recipe/valid_loss.png"
    cp "$exp/wer_vs_search_time.png" "$recipe/wer_vs_search_time.png"
  fi
  log "report: $exp/RESULTS.md"
  cat "$exp/RESULTS.md"
}

# the stage numbers of this script: a run dir whose markers were written by a run.sh
# with other numbers (its layout file says so) would skip the wrong stages
layout="16 stages: 6-9 models, 10 LMs, 11 decode, 12 LM decode, 13 streaming, 14 deploy, 15 score, 16 report"
# earlier numberings: their markers 1-8 mean the same, 9-12 (LMs to streaming) are
# this layout's 10-13, the later ones (deploy, score, report) are redone
layout_14="14 stages: 6-8 models, 9 LMs, 10 decode, 11 LM decode, 12 streaming, 13 score, 14 report"
layout_15="15 stages: 6-8 models, 9 LMs, 10 decode, 11 LM decode, 12 streaming, 13 deploy, 14 score, 15 report"
check_layout() {
  local old k
  old=$(cat "$done_dir/layout" 2>/dev/null || true)
  if [ "$old" = "$layout_14" ] || [ "$old" = "$layout_15" ]; then
    rm -f "$done_dir"/1[3-9]
    for k in 12 11 10 9; do
      if [ -e "$done_dir/$k" ]; then mv "$done_dir/$k" "$done_dir/$((k + 1))"; fi
    done
    log "stage markers renumbered for stage 9 (sherpa-onnx's models) and 14 (deploy)"
    old=$layout
  fi
  if [ -n "$old" ] && [ "$old" != "$layout" ]; then
    die "$done_dir holds the stage markers of another run.sh ($old): remove it to redo every stage, or use another --dir"
  fi
  echo "$layout" > "$done_dir/layout"
}

main() {
  log "dir=$dir smoke=$smoke stages $stage..$stop_stage"
  check_layout
  run_stage 1 tools stage_tools
  run_stage 2 synthesis stage_synth
  run_stage 3 data_dirs stage_data
  run_stage 4 token_list stage_tokens
  run_stage 5 collect_stats stage_stats
  run_trainings
  run_stage 10 train_lms stage_lms 11
  run_stage 11 decode stage_decode
  run_stage 12 lm_decode stage_lm_decode
  run_stage 13 streaming stage_stream
  run_stage 14 deploy stage_deploy
  run_stage 15 score stage_score
  run_stage 16 report stage_report
  log "all done ($SECONDS s)"
}

# one line: bash has parsed the whole file before running anything, so editing run.sh
# while it runs does not affect the run
main; exit $?
