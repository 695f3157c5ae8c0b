# Sourced by seed_spread.sh and compare_procs.sh (not run): decode one model on
# $test_set with the plug-in's entry point (one torch thread) and score it, unless
# OUT/score.json exists; outputs under OUT.tmp, renamed when complete.
# Uses the caller's $python, $dir (the base run dir), $test_set, $recipe and log().
#
#   decode_scored OUT DECODE_CONF BATCH EXP_DIR MODEL_FILE WHAT  (WHAT: for the log)
decode_scored() {
  local out=$1 conf=$2 batch=$3 exp_dir=$4 model_file=$5 what=$6
  [ -f "$out/score.json" ] && return 0
  rm -rf "$out" "$out.tmp"
  mkdir -p "$out.tmp"
  log "decoding $test_set with $what"
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$python" -m espnet_multiblank.bin.asr_inference \
    --ngpu 0 --config "$conf" --batch_size "$batch" \
    --data_path_and_name_and_type "$dir/data/$test_set/wav.scp,speech,sound" \
    --key_file "$dir/data/$test_set/wav.scp" \
    --asr_train_config "$exp_dir/config.yaml" \
    --asr_model_file "$exp_dir/$model_file" \
    --output_dir "$out.tmp" > "$out.tmp.log" 2>&1 \
    || { tail -n 30 "$out.tmp.log" >&2; log "ERROR: decoding failed"; exit 1; }
  mv "$out.tmp.log" "$out.tmp/decode.log"
  "$python" "$recipe/local/score.py" "$dir/data/$test_set/text" \
    "$out.tmp/1best_recog/text" "$out.tmp"
  mv "$out.tmp" "$out"
}
