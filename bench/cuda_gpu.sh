#!/bin/bash
# The CUDA backend on a GPU machine, in one call: tests, a memory check, the bench on random weights of the
# real shapes, and a profile of a decode step. Prints a table last.
#
# usage: bench/cuda_gpu.sh BIN SHARED OUT STEP...
#   BIN     folder with gemma4c, test_backend_ops, test_decoder (and test_vision, test_audio, test_unified,
#           test_server_engine where present: the towers end to end, the server's sizing) of a -DGEMMA4C_CUDA=ON build
#   SHARED  folder with fixtures/, configs/ and reference/numpy (../shared)
#   OUT     folder for logs
#   STEP    tests | sweep | memcheck | bench:MODEL[:PROMPTS[:CONTEXTS[:TYPE]]] | profile:MODEL[:TYPE] | ncu:MODEL[:TYPE]
#           MODEL is a config of SHARED/configs (e2b, e4b, 26b-a4b, 31b, 12b); PROMPTS/CONTEXTS comma lists
#           (default 512,4096 and 512,8192); TYPE the random weights' type (bf16 default, q4_0, q8_0, q4_k, q6_k,
#           mlx4, mlx8: gemma4c bench --type), e.g. bench:e2b:512:512:q4_0
# Decode figures are compared with SGLang's published H200 bf16 batch-1 times (../shared/docs/anchors.md 2):
# E2B 3.99 ms, E4B 5.64, 26B-A4B 5.60, 31B 12.3 (two GPUs).
set -u
BIN=$1 SHARED=$2 OUT=$3
shift 3
mkdir -p "$OUT" /tmp/g4-cuda-tests
export G4_SHARED_DIR=$SHARED G4_TMP=/tmp/g4-cuda-tests G4_BIN=$BIN/gemma4c
export G4_SOURCE_DIR=${G4_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
summary=$OUT/summary.txt
: >"$summary"

sglang() { case $1 in e2b) echo 3.99 ;; e4b) echo 5.64 ;; 26b-a4b) echo 5.60 ;; 31b) echo 12.3 ;; 12b) echo 9.02 ;; *) echo 0 ;; esac; }

for step in "$@"; do
    case $step in
    tests)
        echo "== op tests (every op, CPU and CUDA)"
        "$BIN/test_backend_ops" >"$OUT/ops.log" 2>&1
        echo "ops rc=$? $(tail -1 "$OUT/ops.log")" | tee -a "$summary"
        grep -v "^$" "$OUT/ops.log" | tail -5
        echo "== fixtures on the GPU (dense-ple, dense-keqv, moe: logits, hidden states, 24 greedy tokens)"
        "$BIN/test_decoder" >"$OUT/decoder.log" 2>&1
        echo "decoder rc=$? $(tail -1 "$OUT/decoder.log")" | tee -a "$summary"
        grep -E "logits|KV|failed" "$OUT/decoder.log" | head -30
        for t in test_vision test_audio test_unified test_server_engine; do # the towers: image / WAV to logits on the
            # default device; the server's default --parallel sized by the card's memory
            [ -x "$BIN/$t" ] || continue
            "$BIN/$t" >"$OUT/$t.log" 2>&1
            echo "$t rc=$? $(tail -1 "$OUT/$t.log")" | tee -a "$summary"
            grep -E "error|failed" "$OUT/$t.log" | head -8
        done
        # GGUF types without CUDA kernels, held as Q8_0 (tests/test_cuda_transcode.sh: the tool end to end)
        bash "$G4_SOURCE_DIR/tests/test_cuda_transcode.sh" >"$OUT/transcode.log" 2>&1
        echo "test_cuda_transcode rc=$? $(grep -c '^ok' "$OUT/transcode.log") ok" | tee -a "$summary"
        grep -E "^FAIL|skipped" "$OUT/transcode.log" | head -8
        ;;
    sweep)
        # random configurations against the numpy reference on the GPU (tests/data/*_sweep.py); the text sweep with
        # an f32 KV cache: its tolerances are float32's (the bf16 cache is checked by test_decoder's KV16 cases).
        # Shards of different seeds run side by side (G4_SWEEP_JOBS, 8): the cases are small and start-up bound.
        py=${G4_PYTHON:-python3}
        jobs=${G4_SWEEP_JOBS:-8}
        for spec in config_sweep:${G4_SWEEP_CASES:-160}:--kv=f32 audio_sweep:${G4_AUDIO_SWEEP_CASES:-48}: \
                    vision_sweep:${G4_VSWEEP_CASES:-32}:; do
            IFS=: read -r name cases extra <<<"$spec"
            echo "== $name on the GPU: $cases cases in $jobs shards (seeds 7000..)"
            for ((j = 0; j < jobs; j++)); do
                "$py" "$G4_SOURCE_DIR/tests/data/$name.py" --bin "$BIN/gemma4c" --device cuda ${extra/=/ } \
                    --reference "$SHARED/reference/numpy" --tmp "/tmp/g4-cuda-tests/$name.$j" \
                    --cases $(((cases + jobs - 1) / jobs)) --seed $((7000 + j)) --control >"$OUT/$name.$j.log" 2>&1 &
            done
            wait
            cat "$OUT/$name".*.log >"$OUT/$name.log"
            rm -f "$OUT/$name".*.log
            echo "$name $(grep -c '^ok' "$OUT/$name.log") ok, $(grep -c '^FAIL' "$OUT/$name.log") failed" |
                tee -a "$summary"
            grep -E "^FAIL|Error" "$OUT/$name.log" | head -8
        done
        ;;
    memcheck)
        echo "== compute-sanitizer memcheck: the CUDA op tests and a fixture model run"
        compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_backend_ops" >"$OUT/memcheck_ops.log" 2>&1
        echo "memcheck ops rc=$? $(grep -E "ERROR SUMMARY" "$OUT/memcheck_ops.log" | tail -1)" | tee -a "$summary"
        compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/gemma4c" bench -m "$SHARED/fixtures/moe" -p 40 -c 20 \
            -n 6 -r 1 --device "${G4_DEVICE:-cuda}" >"$OUT/memcheck_moe.log" 2>&1
        echo "memcheck moe rc=$? $(grep -E "ERROR SUMMARY" "$OUT/memcheck_moe.log" | tail -1)" | tee -a "$summary"
        compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/gemma4c" bench -m "$SHARED/fixtures/dense-ple" -p 40 \
            -c 20 -n 6 -r 1 --device "${G4_DEVICE:-cuda}" >"$OUT/memcheck_ple.log" 2>&1
        echo "memcheck dense-ple rc=$? $(grep -E "ERROR SUMMARY" "$OUT/memcheck_ple.log" | tail -1)" | tee -a "$summary"
        grep -B2 -A12 "Invalid\|ERROR:" "$OUT"/memcheck_*.log | head -40
        ;;
    bench:*)
        IFS=: read -r _ model prompts contexts type <<<"$step"
        prompts=${prompts:-512,4096} contexts=${contexts:-512,8192} type=${type:-bf16}
        log=$OUT/bench_${model}_$type.log
        echo "== bench $model (random $type weights, batch 1)"
        "$BIN/gemma4c" bench --random "$SHARED/configs/gemma-4-$model.json" --type "$type" -p "$prompts" -c "$contexts" \
            -n 64 -r 2 --device "${G4_DEVICE:-cuda}" >"$log" 2>&1
        cat "$log"
        ref=$(sglang "$model")
        awk -v m="$model/$type" -v ref="$ref" '
            /^prefill/ { printf "%-13s prefill %6s tok: %9s tok/s  TTFT %s ms\n", m, $2, $4, $10 }
            /^decode at context/ { ms = $5; pct = ""; for (i = 1; i <= NF; i++) if ($i == "of") pct = $(i - 1);
                printf "%-13s decode ctx %6s: %7s ms/token  %s GB/s  %s of copy bw  %sx SGLang (%s ms)\n",
                       m, substr($4, 1, length($4) - 1), ms, $(NF - 5), pct, (ref > 0 ? sprintf("%.2f", ref / ms) : "-"), ref }' "$log" | tee -a "$summary"
        ;;
    profile:*)
        IFS=: read -r _ model type <<<"$step"
        type=${type:-bf16}
        echo "== kernel times of 64 decode steps of $model, $type (eager, CUDA events; G4_CUDA_PROFILE=1)"
        G4_CUDA_PROFILE=1 "$BIN/gemma4c" bench --random "$SHARED/configs/gemma-4-$model.json" --type "$type" -p 1 -c 1 \
            -n 64 -r 1 --device "${G4_DEVICE:-cuda}" 2>&1 | grep -v fill_random | cut -c1-160 \
            | tee "$OUT/profile_${model}_$type.txt" | head -22
        ;;
    ncu:*)
        IFS=: read -r _ model type <<<"$step"
        type=${type:-bf16}
        echo "== ncu: decode kernels of $model, $type"
        ncu --clock-control none --kernel-name regex:'gemv_kernel|attention_kernel|post_norm_add|attn_prep|moe_' \
            --launch-skip 260 --launch-count 16 --section SpeedOfLight --section Occupancy --section WarpStateStats \
            --section LaunchStats --csv --page details \
            "$BIN/gemma4c" bench --random "$SHARED/configs/gemma-4-$model.json" --type "$type" -p 1 -c 256 -n 4 -r 1 \
            --device cuda >"$OUT/ncu_$model.csv" 2>"$OUT/ncu_$model.err"
        echo "ncu rc=$? $(wc -l <"$OUT/ncu_$model.csv") lines" | tee -a "$summary"
        awk -F'","' '$13 ~ /^(Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Grid Size|Stall Long Scoreboard|Warp Cycles Per Issued Instruction|Dynamic Shared Memory Per Block)$/ {
            v = $15; gsub(/"/, "", v); print $1 "|" $5 " | " $13 " = " v " " $14 }' "$OUT/ncu_$model.csv" \
            | sed -E 's/\(gemv_args\)|\(attn_args\)|\(moe_args\)//' | cut -c1-140 | head -120
        ;;
    *) echo "unknown step $step" ;;
    esac
done
echo "== summary"
cat "$summary"
