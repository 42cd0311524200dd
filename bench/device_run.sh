#!/usr/bin/env bash
# One device call = one stage (the lease is short: each stage builds, checks and times many things).
#   bash bench/device_run.sh STAGE   (run from the repo root on the GPU machine, .whl carried)
# Stages: part1 (SmolLM2 first half + kernel check + gates + decode profile), part2 (SmolLM2 second
# half + real-model gates + serve concurrency + GPU pytest), bench (full bench table).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export BW24CHAT_CACHE_DIR=/root/bw24cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /root/m
SMOL=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
# SmolLM2's second half appended to the first (left in /root/m by an earlier call on this machine),
# checked, then CUDA = NumPy greedy and the real model's gates: $1 the stage that carries the first
# half, $2 the log name under $OUT
smollm2_second_half() {
  cat .carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-ab >> $SMOL
  have=$(sha256sum $SMOL | cut -c1-16); want=$(cut -c1-16 .carry/SmolLM2-135M-Instruct.Q4_1.gguf/sha256)
  echo "sha256 $have want $want"; [ "$have" = "$want" ] || { rm -f $SMOL; echo "the first half is gone (fresh machine): run $1 again"; exit 3; }
  timeout 300 python3 bench/device_smollm2.py $SMOL 2>&1 | tee $OUT/$2 | tail -30
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
case "$1" in
s23)
  # Everything prepared in the twenty-second and twenty-third sessions (~8 min).  Opt-in builds,
  # each bit-identical to the default by its tests (bits first):
  #   MV_ROWPTR=1 + MV_PINGPONG=1 + MV_NOCOPY=1  the window loop through per-row plane pointers,
  #                 without copying each window's chunks (pairs for the one-slot wide builds, one
  #                 slot more consumed in place for the o / down): bench/sass_count.py, instructions
  #                 per dp4a, NVFP4 gate|up 5.33 -> 4.53, qkv 5.37 -> 4.62, LM head 5.25 -> 4.55, o
  #                 5.52 -> 4.76, down 5.38 -> 4.81; Q4_K 5.3 -> 4.0-4.3; Q8_0 gate|up 6.23 -> 3.09:
  #                 predicted NVFP4 gate|up 26.1 -> 23-24 us in the step, LM head 41 -> 39, o / down
  #                 -0.5 / -1 us, decode NVFP4 +5-8 %, Q4_K +5-8 %, Q8_0 +0-2 % (not issue-bound)
  #   QX_ROTATE=1   the gate|up epilogue's quantizing warp rotates: gate|up -0.5..-1 us, +1-2 %
  #   MV_L2AHEAD_O=1 the o's first tile asked of L2 during attention: o 7.0 -> ~6 us, +1-2 %
  # The per-role profile (default / rp+pp+nc) shows the roles they touch; the first run of each
  # build compiles its kernels (~1 min): the profiles' timeouts allow it, the decode runs reuse them
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_matvec.py tests/gpu/test_runner_qx.py -k "((row_pointers or pingpong or in_place) and (NVFP4 or Q4_K)) or rotating or hand_off" 2>&1 | tail -2 | tee $OUT/pytest_s23.log
  grep -q " passed" $OUT/pytest_s23.log && ! grep -q "failed\|error" $OUT/pytest_s23.log || exit 3
  RP="BW24CHAT_MV_ROWPTR=1 BW24CHAT_MV_PINGPONG=1 BW24CHAT_MV_NOCOPY=1"; ALL="$RP BW24CHAT_QX_ROTATE=1 BW24CHAT_MV_L2AHEAD_O=1"
  for v in "X=0" "$RP"; do env $v timeout 150 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --profile --ctx 2048 2>&1 | grep " us" | grep "grid \[\|whole" | sed "s/^/[$v] /" | cut -c1-220; done | tee $OUT/profile_s23.log
  for v in "X=0" "$RP" "$ALL" "X=0" "$RP"; do env $v timeout 70 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q4_k --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | grep -v '"test"' | sed "s/^/[$v] /"; done | tee $OUT/bench_s23.log
  ;;
s23x)
  # the rest of s23's bits (row pointers, window pairs, slots in place: every format and m; QX_ROTATE's 54 QX
  # cases; attn_decode_tc's hoisted cp.async issue), then decode A/B of: rp+pp on Q8_0; MV_FILL_U=2
  # (two load slots for the 3-row qkv: predicted qkv 10.0 -> 8.5-9 us, +1-2 %); ATTN_ISSUE_HOIST
  # (the tile loop 818 -> 529 instructions: predicted attention at 8192 keys -1..-1.5 us per layer,
  # tg128@8192 +1-2 %, @512 unchanged)
  timeout 240 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_attention.py tests/gpu/test_matvec.py -k "row_pointers or pingpong or in_place or (qx_written and (2r or 0r)) or hoisted" 2>&1 | tail -2 | tee $OUT/pytest_s23x.log
  RP="BW24CHAT_MV_ROWPTR=1 BW24CHAT_MV_PINGPONG=1 BW24CHAT_MV_NOCOPY=1"
  for v in "X=0" "$RP" "BW24CHAT_MV_FILL_U=2" "BW24CHAT_ATTN_ISSUE_HOIST=1" "X=0" "$RP" "BW24CHAT_MV_FILL_U=2" "BW24CHAT_ATTN_ISSUE_HOIST=1"; do env $v timeout 70 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q8_0 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | grep -v '"test"' | sed "s/^/[$v] /"; done | tee $OUT/bench_s23x.log
  ;;
s22d)
  # three rows per warp where 64-row tiles leave SMs idle (cuda_linear._fill_rows; the qkv shape: 96
  # tiles of 64 rows on 132 SMs -> 128 of 48; BW24CHAT_MV_FILL=0 the old 4).  Predicted: qkv in the
  # step 10.5 -> ~9 us (H100), decode +1.5-2.5 %.  Bits first; then the decode A/B, the final bench
  # table and the gates (A8_STAT_CACHE and the fill are on by default in this build)
  timeout 100 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_matvec.py -k "three_rows" 2>&1 | tail -2 | tee $OUT/pytest_s22d.log
  grep -q " passed" $OUT/pytest_s22d.log && ! grep -q "failed\|error" $OUT/pytest_s22d.log || exit 3
  for v in 0 1 0 1; do BW24CHAT_MV_FILL=$v timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q4_k,q8_0 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | grep -v '"test"' | sed "s/^/fill=$v /"; done | tee $OUT/bench_s22d.log
  timeout 200 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench_final_s22d.json 2>&1 | grep -v '^{\|^}\|^  *"\|^\]' | tee $OUT/bench_final_s22d.log | tail -24
  timeout 150 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 > $OUT/check_s22d.log 2>&1; echo "check rc=$?"
  grep "FAIL\|argmax\|passed" $OUT/check_s22d.log | cut -c1-150 | tail -12
  ;;
s22c)
  # (1) A8_STAT_CACHE as the default (matvec.cu define 1; BW24CHAT_A8_STAT_CACHE=0 the old path): bits
  # again on the default build, decode A/B default / 0.  (2) The tensor-core decode attention's
  # cluster at 4 instead of 8 (BW24CHAT_ATTN_CLUSTER=4): at 512 keys 8 splits hold one 64-key tile
  # each, with two halves per block 4 splits hold the same 8 tiles side by side and the cluster
  # merge spans 4 blocks.  Predicted: 512 keys -0.5..-1 us per layer (+1-2 % decode), 8192 keys
  # slower (32 tiles in series per split); bits: the cluster merge tests at C = 4
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_matvec.py -k "stat_cache" 2>&1 | tail -2 | tee $OUT/pytest_s22c.log
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_attention.py -k "cluster_merge and bf16-1-" 2>&1 | tail -2 | tee -a $OUT/pytest_s22c.log
  timeout 120 python3 bench/attn_probe.py --kv bf16 --lengths 512,1024,2048,8192 --variants "default;BW24CHAT_ATTN_CLUSTER=4;BW24CHAT_ATTN_CLUSTER=2" 2>&1 | grep " us " | tee $OUT/probe_s22c.log
  for env in "BW24CHAT_A8_STAT_CACHE=0" "BW24CHAT_ATTN_CLUSTER=8" "BW24CHAT_ATTN_CLUSTER=4" "BW24CHAT_A8_STAT_CACHE=0" "BW24CHAT_ATTN_CLUSTER=8" "BW24CHAT_ATTN_CLUSTER=4"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q8_0 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s22c.log
  ;;
s22b)
  # where the integer-dot matvecs' tiles land: the persistent grid spreads 384 gate|up tiles (64 rows)
  # over 192 blocks on 132 SMs (60 SMs hold two blocks, 72 one), qkv's 96 tiles over 96 SMs (36 idle).
  # If an SM's issue or load slots, not the DRAM, set each tile's pace, the grid's shape matters:
  # one tile per block (MV_PERSIST=0: a second partial wave), 1 block per SM (MV_MAX_BLOCKS=132),
  # smaller tiles (MV_R=2 / 1: 32- / 16-row tiles).  Predicted: within 3 % of auto if the DRAM
  # sets the pace; 10-20 % apart if the SMs do (then a dynamic tile scheduler is the next step)
  timeout 60 python3 bench/decode_floor.py 2>&1 | tail -12 | tee $OUT/floor_s22b.log
  BW24CHAT_MV_VARIANTS="auto:;persist0:MV_PERSIST=0;max132:MV_MAX_BLOCKS=132;max96:MV_MAX_BLOCKS=96;r2:MV_R=2;r1:MV_R=1" timeout 240 python3 bench/matvec_variants.py --formats nvfp4,q8_0 2>&1 | tail -80 | tee $OUT/variants_s22b.log
  for env in "BW24CHAT_MV_PERSIST=1" "BW24CHAT_MV_MAX_BLOCKS=132"; do env $env timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --profile --ctx 2048 2>&1 | grep " us" | sed "s/^/$env /"; done | tee $OUT/profile_s22b.log
  for env in "BW24CHAT_MV_PERSIST=1" "BW24CHAT_MV_PERSIST=0" "BW24CHAT_MV_MAX_BLOCKS=132" "BW24CHAT_MV_PERSIST=1"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s22b.log
  ;;
s22a)
  # prepared in the twenty-first session (compiled for sm_90a / sm_120a in CI, registers checked:
  # no spills in the wide builds; never run): the integer-dot rmsnorm prologue from the statistic's
  # one batch of loads (matvec.cu A8_STAT_CACHE, BW24CHAT_A8_STAT_CACHE=1).  Predicted: qkv /
  # gate|up / LM head -0.7..-1 us each (one L2 round trip of x after pdl_wait instead of two),
  # NVFP4 / Q4_K / Q8_0 decode +2-3 %.  Bits first, then the per-role times, then the decode A/B
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_matvec.py -k "stat_cache" 2>&1 | tail -3 | tee $OUT/pytest_s22a.log
  grep -q " passed" $OUT/pytest_s22a.log && ! grep -q "failed\|error" $OUT/pytest_s22a.log || exit 3
  BW24CHAT_MV_VARIANTS="auto:;stat cache:A8_STAT_CACHE=1" timeout 150 python3 bench/matvec_variants.py --formats nvfp4,q4_k,q8_0 2>&1 | tail -32 | tee $OUT/variants_s22a.log
  for v in 0 1 0 1; do BW24CHAT_A8_STAT_CACHE=$v timeout 90 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q4_k,q8_0 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | grep -v '"test"' | sed "s/^/sc=$v /"; done | tee $OUT/bench_s22a.log
  ;;
s21e)
  # the final build (ATTN_QX on by default, the tensor-core decode's cluster merge unchanged):
  # SmolLM2 first half (carry [".whl", ".carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-aa"]; s21b
  # follows at once), the gates with the kernel check, then the full bench table
  cat .carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-aa > $SMOL && ls -la $SMOL | cut -c1-80
  timeout 220 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 > $OUT/check_s21e.log 2>&1; echo "check rc=$?"
  grep "FAIL\|argmax\|passed" $OUT/check_s21e.log | cut -c1-150 | tail -12
  timeout 330 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench_s21e.json 2>&1 | grep -v '^{\|^}\|^  *"\|^\]' | tee $OUT/bench_s21e.log | tail -30
  ;;
s21d)
  # the tensor-core decode's hybrid merge (attention.cu ATTN_HYBRID on attn_decode_tc, cuda_ops
  # ATTN_HYBRID_TC_TILES = 32, attn_decode_long_splits): rows over 2048 keys stream over one wave
  # of blocks (16 splits of 8 kv heads) with the workspace merge instead of a cluster of 8.
  # Predicted: 8192 keys 18.4-18.9 -> ~12-13 us per layer; NVFP4 tg128@8192 +6-8 %, @512 unchanged.
  # Bits first, then the probe (P = 0 is the old pure cluster), then the decode A/B in the step
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_attention.py tests/gpu/test_runner_qx.py -k "hybrid or any_m or cluster_merge or (decode_matches and bf16-1) or hand_off" 2>&1 | tail -3 | tee $OUT/pytest_s21d.log
  grep -q " passed" $OUT/pytest_s21d.log && ! grep -q "failed\|error" $OUT/pytest_s21d.log || exit 3
  timeout 120 python3 bench/attn_probe.py --kv bf16 --lengths 512,1024,2048,4096,8192 --variants "BW24CHAT_ATTN_HYBRID=0;default;BW24CHAT_ATTN_HYBRID=1;BW24CHAT_ATTN_HYBRID=2;BW24CHAT_ATTN_HYBRID=1,BW24CHAT_ATTN_SPLITS=8" 2>&1 | grep " us " | tee $OUT/probe_s21d.log
  for v in 0 4 0 4; do BW24CHAT_ATTN_HYBRID=$v timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,bf16 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | grep -v '"test"' | sed "s/^/P=$v /"; done | tee $OUT/bench_s21d.log
  ;;
s21c)
  # prepared in the twentieth session (compiled for sm_90a / sm_120a in CI, never run): the opt-in
  # attention -> o QX hand-off (attention.cu ATTN_QX, BW24CHAT_ATTN_QX=1).  Predicted: o's prologue
  # becomes a copy (~2 us -> ~1 us per layer, as the down projection's QX did), NVFP4 / Q8_0 decode
  # +1.5-2.5 %.  Bits first, then the decode A/B (off / on / off / on)
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_attention.py tests/gpu/test_runner_qx.py -k "qx" 2>&1 | tail -3 | tee $OUT/pytest_s21c.log
  grep -q " passed" $OUT/pytest_s21c.log && ! grep -q "failed\|error" $OUT/pytest_s21c.log || exit 3
  for v in 0 1 0 1; do BW24CHAT_ATTN_QX=$v timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q8_0 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | grep -v '"test"' | sed "s/^/qx=$v /"; done | tee $OUT/bench_s21c.log
  ;;
s21b)
  # SmolLM2 second half (carry [".whl", ".carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-ab",
  # ".carry/SmolLM2-135M-Instruct.Q4_1.gguf/sha256"]): CUDA = NumPy greedy 64 tokens under each
  # activation contract (NumpyBackend(act_bf16=...)), then its gates per cache type
  smollm2_second_half s21a smollm2_s21b.log
  ;;
s21a)
  # prepared in the twentieth session (which had H100s only): SmolLM2 first half (carry [".whl",
  # ".carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-aa"]); the H200 bench with both activation
  # contracts' prefill rows; the transformers reference (f32 activations and cache: 1e-3; the bf16
  # cache and bf16 activations for the record); the bf16 contract's gates for the record
  cat .carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-aa > $SMOL && ls -la $SMOL | cut -c1-80
  timeout 330 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench_s21a.json 2>&1 | grep -v '^{\|^}\|^  *"\|^\]' | tee $OUT/bench_s21a.log | tail -30
  timeout 150 python3 tools/device_reference.py /root/ref --big 2>&1 | tail -10 | tee $OUT/ref_s21a.log
  timeout 90 python3 -m bw24chat check --skip-kernels --activations bf16 --formats bf16,nvfp4 --kv bf16 2>&1 | grep "argmax\|passed" | cut -c1-160 | tee $OUT/check_bf16x_s21a.log
  ;;
s20c)
  # the float32 comparison with transformers (f32 activations and cache: 1e-3), the default
  # contract's figures beside it; the gates under f32 activations (the act_quant rounding change) and
  # on the portable path under the default
  timeout 200 python3 tools/device_reference.py /root/ref --big 2>&1 | tail -12 | tee $OUT/ref_s20c.log
  timeout 150 python3 -m bw24chat check --skip-kernels --activations f32 --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 2>&1 | grep "FAIL\|argmax\|passed" | cut -c1-160 | tee $OUT/check_f32_s20c.log
  BW24CHAT_PORTABLE=1 timeout 150 python3 -m bw24chat check --skip-kernels --formats bf16,q8_0,q4_k,nvfp4 --kv bf16,q8_0 2>&1 | grep "FAIL\|argmax\|passed" | cut -c1-160 | tee $OUT/check_portable_s20c.log
  ;;
s20b)
  # float32 activations stay the default (the bf16 contract fails the from-scratch prefill-vs-decode
  # gate on random models: s20a); the gates with the kernel check, then the full bench (each prefill
  # row also under the other contract)
  timeout 200 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 > $OUT/check_s20b.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s20b.log | tail -6; grep -c "^PASS" $OUT/check_s20b.log; grep "argmax" $OUT/check_s20b.log | cut -c1-150
  timeout 420 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench_s20b.json 2>&1 | grep -v '^{\|^}\|^  *"\|^\]' | tee $OUT/bench_s20b.log | tail -40
  ;;
s20a)
  # the bf16-activation contract (matmul inputs rounded to bf16 on both paths; x one plane in the
  # prefill GEMMs, W split where not bf16-exact): its bits and references, the f32 paths' regression
  # subset, then the gates with the kernel check in the new default, then prefill speed
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=line tests/gpu/test_bf16_activations.py 2>&1 | tail -12 | tee $OUT/pytest_s20a.log
  grep -q " passed" $OUT/pytest_s20a.log && ! grep -q "failed\|error" $OUT/pytest_s20a.log || exit 3
  timeout 200 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 > $OUT/check_s20a.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s20a.log | tail -8; grep -c "^PASS" $OUT/check_s20a.log
  grep "bf16-x\|argmax" $OUT/check_s20a.log | cut -c1-160
  timeout 150 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,nvfp4,q8_0,q4_k --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | tee $OUT/bench_s20a.log
  # gemm_wra's token tile under the contract for the W-split formats (x one plane, W_hi + W_lo registers): 128 (default) vs 256
  BW24CHAT_WRA_BT=256 timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0,q4_k --prefill-only 2>&1 | grep "pp512 \|pp2048 " | grep -v '"test"' | sed "s/^/bt256 /" | tee -a $OUT/bench_s20a.log
  ;;
s19f)
  # rope.cu: the position, norm weights, cos / sin and biases read before pdl_wait (one post-wait
  # round trip instead of two).  Predicted: rope 2.15 -> ~1.6 us per layer, decode +0.5-1 %.  Bits
  # first (the rope / QK-norm / cache-write tests compare with NumPy bit for bit); then decode A/B
  # against the previous rope.cu; and two BF16 matvec variants (XF_NR=8: the down's x in one batch;
  # qkv at 16 warps with the 8-warp statistic)
  timeout 120 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_ops_norm_rope.py 2>&1 | tail -3 | tee $OUT/pytest_s19f.log
  grep -q " passed" $OUT/pytest_s19f.log && ! grep -q "failed\|error" $OUT/pytest_s19f.log || exit 3
  cp kernels/rope.cu /root/new_rope.cu
  for build in new old new old; do
    [ $build = old ] && git show HEAD:kernels/rope.cu > kernels/rope.cu
    timeout 70 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,bf16 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192" | grep -v '"test"' | sed "s/^/$build /" | tee -a $OUT/bench_s19f.log
    cp /root/new_rope.cu kernels/rope.cu
  done
  BW24CHAT_MV_VARIANTS="auto:;xf8:XF_NR=8;nw16:MV_NW=16,MV_STAT8=1" timeout 60 python3 bench/matvec_variants.py --formats bf16 2>&1 | grep "^BF16" | tee $OUT/variants_s19f.log
  ;;
s19e)
  # the session's build (the float path's batched x prologue; gemm_i8_mma on the portable path;
  # WRA_FOLD removed): the gates with the kernel check for every weight format, then the bench table
  timeout 150 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 > $OUT/check_s19e.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s19e.log | tail -6; grep -c "^PASS" $OUT/check_s19e.log
  timeout 370 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench_s19e.json 2>&1 | grep -v '^{\|^}\|^  *"\|^\]' | tee $OUT/bench_s19e.log | tail -30
  ;;
s19d)
  # gemm_i8_mma (gemm.cu: the portable path's Q8_0 precise prefill on mma.sync s8, gemm_i8's
  # contract): bits (= gemm_i8 on sm_90a), the rows against the decode's (bench/prefill_decode_rows.py:
  # the mma row predicted 4.2e-5 -> ~5e-7), then the portable gates that failed in s19a / s19b
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py -k "i8 or one_buffer or integer_dot" 2>&1 | tail -3 | tee $OUT/pytest_s19d.log
  grep -q " passed" $OUT/pytest_s19d.log && ! grep -q "failed\|error" $OUT/pytest_s19d.log || exit 3
  timeout 90 python3 bench/prefill_decode_rows.py 2>&1 | grep "wg  \|mma" | tee $OUT/rows_s19d.log
  BW24CHAT_PORTABLE=1 timeout 150 python3 -m bw24chat check --skip-kernels --formats bf16,q8_0,q4_k,nvfp4 --kv bf16,q8_0 > $OUT/check_s19d.log 2>&1; echo "portable check rc=$?"
  grep "FAIL\|argmax\|passed" $OUT/check_s19d.log | cut -c1-150
  BW24CHAT_GEMM=mma BW24CHAT_GM_BUFS=1 BW24CHAT_PREFILL_STAGES=1 BW24CHAT_ATTN_TC_HALVES=1 BW24CHAT_ATTN_TC_STAGES=2 timeout 100 python3 -m bw24chat check --skip-kernels --formats q8_0 --kv bf16,q8_0 2>&1 | grep "FAIL\|argmax\|passed" | cut -c1-150 | tee -a $OUT/check_s19d.log
  # the portable Q8_0 prefill speed, the split (GEMM_I8=0) vs gemm_i8_mma, H200 (the sm_120a kernels' code path)
  for env in "BW24CHAT_GEMM_I8=0" "BW24CHAT_GEMM_I8=1"; do env BW24CHAT_GEMM=mma $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --prefill-only 2>&1 | grep "pp512 " | grep -v '"test"' | sed "s/^/mma $env /"; done | tee $OUT/bench_s19d.log
  ;;
s19c)
  # the portable path's Q8_0 gap (s19b: rel L2 prefill vs decode 5.4e-4 under BW24CHAT_GEMM=mma, 1.7e-4
  # on the default path): each prefill GEMM path's rows against the decode matvec's, per kernel
  timeout 90 python3 bench/prefill_decode_rows.py 2>&1 | tail -20 | tee $OUT/diag_s19c.log
  # the integer-dot prologue's share per shape (MV_ABLATE=1 skips stage_a8: timing only)
  BW24CHAT_MV_VARIANTS="auto:;ablate:MV_ABLATE=1" timeout 150 python3 bench/matvec_variants.py --formats q8_0,nvfp4 2>&1 | grep "^Q8_0\|^NVFP4" | tee $OUT/variants_s19c.log
  ;;
s19b)
  # the float path's x prologue in float4 batches (matvec.cu load_group / stage_float_x): one L2
  # round trip per batch where the scalar loops took 4 per 4096 inputs (statistic and staging
  # each), 6 for the down projection's 12288.  Predicted: BF16 qkv / gate|up -1.5..-3 us, down
  # -2..-3, o -0.5; BF16 tg128@512 224 -> 230-240.  Bits first.
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_matvec.py -k "BF16 or F32 or F16 or Q4_1 or Q5_1 or Q4_0 or float_path" 2>&1 | tail -3 | tee $OUT/pytest_s19b.log
  grep -q " passed" $OUT/pytest_s19b.log && ! grep -q "failed\|error" $OUT/pytest_s19b.log || exit 3
  cp kernels/matvec.cu /root/new_matvec.cu
  for build in new old; do
    [ $build = old ] && git show 5c3d4b6:kernels/matvec.cu > kernels/matvec.cu
    BW24CHAT_MV_VARIANTS="$build:;$build-nr1:XF_NR=1;$build-nr4:XF_NR=4" timeout 100 python3 bench/matvec_variants.py --formats bf16 2>&1 | grep "^BF16" | tee -a $OUT/variants_s19b.log
    cp /root/new_matvec.cu kernels/matvec.cu
  done
  for i in 1 2; do for build in new old; do
    [ $build = old ] && git show 5c3d4b6:kernels/matvec.cu > kernels/matvec.cu
    timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192" | grep -v '"test"' | sed "s/^/$build /" | tee -a $OUT/bench_s19b.log
    cp /root/new_matvec.cu kernels/matvec.cu
  done; done
  # the portable path's Q8_0 prefill-vs-decode failures in s19a (2 / 1 positions, margins 1.3e-3 to
  # 1.9e-3, rel L2 5.3e-4 against 1.8e-4 on the default path): which switch moves it
  for env in "BW24CHAT_X=0" "BW24CHAT_PORTABLE=1" "BW24CHAT_GEMM=mma" "BW24CHAT_GEMM=mma BW24CHAT_GM_BUFS=1 BW24CHAT_PREFILL_STAGES=1" "BW24CHAT_ATTN_TC_HALVES=1 BW24CHAT_ATTN_TC_STAGES=2"; do
    env $env timeout 60 python3 -m bw24chat check --skip-kernels --formats q8_0 --kv bf16 2>&1 | grep "argmax\|passed" | sed "s/^/$env: /" | tee -a $OUT/check_s19b.log
  done
  ;;
s19a)
  # prepared in the eighteenth session, never run on a GPU: the kernel variants the 99 KB GPUs
  # (sm_86 / sm_89 / sm_120) take, forced on the H200 — the portable gemm with one tile buffer
  # (GM_BUFS=1), the prefill attention with one K/V stage (PREFILL_STAGES=1): bits against the
  # default variants, then the whole portable path in that configuration through the gates
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py tests/gpu/test_attention.py -k "one_buffer or one_stage" 2>&1 | tail -3 | tee $OUT/pytest_s19a.log
  BW24CHAT_GEMM=mma BW24CHAT_GM_BUFS=1 BW24CHAT_PREFILL_STAGES=1 BW24CHAT_ATTN_TC_HALVES=1 BW24CHAT_ATTN_TC_STAGES=2 timeout 200 python3 -m bw24chat check --skip-kernels --formats bf16,q8_0,nvfp4 --kv bf16,q8_0 > $OUT/check_s19a.log 2>&1; echo "check rc=$?"
  grep -v "^  ok" $OUT/check_s19a.log | grep -v "^PASS" | tail -8
  # also prepared: Q8_0 on gemm_wra with the per-block fold (WRA_FOLD, opt-in BW24CHAT_WRA_FOLD=1):
  # bits / contract, then per GEMM and pp512 A/B.  Predicted: Q8_0 qkv / gate|up 1.2-1.35x faster
  # than the split's three wgmmas (s18a: 157.6 / 453.0 us), pp512 ~11.9k -> 13.5-14.5k
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py -k "wra_fold" 2>&1 | tail -3 | tee $OUT/pytest_s19a_fold.log
  if grep -q " passed" $OUT/pytest_s19a_fold.log && ! grep -q "failed\|error" $OUT/pytest_s19a_fold.log; then
  for env in "BW24CHAT_WRA_FOLD=0" "BW24CHAT_WRA_FOLD=1"; do env $env BW24CHAT_WRA=1 timeout 80 python3 bench/prefill_probe.py --formats q8_0 2>&1 | grep "a8=on" | sed "s/^/$env /"; done | tee $OUT/probe_s19a.log
  for env in "BW24CHAT_WRA_FOLD=0" "BW24CHAT_WRA_FOLD=1"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s19a.log
  fi
  # the two-half decode attention for speculative verify (m = K + 1 rows in one launch: the same
  # kernel, so the same bits as m = 1): 139 KB per block leaves one block per SM where the one-half
  # kernel had two, so m >= 3 rows take two waves.  Predicted: m = 4 / 8 at 512 keys up to ~2x the
  # one-half time; at 8192 keys closer.  Also two halves with clusters of 16 (128 blocks at m = 1).
  timeout 150 python3 bench/attn_probe.py --kv bf16 --lengths 512,8192 --rows 1,4,8 --variants "BW24CHAT_ATTN_TC_HALVES=1;BW24CHAT_ATTN_TC_HALVES=2;BW24CHAT_ATTN_TC_HALVES=2,BW24CHAT_ATTN_CLUSTER=16" 2>&1 | grep " m=" | tee $OUT/probe_s19a_rows.log
  # decode: is the two-half attention's BF16 / Q8_0 gain at 512 keys the shared-memory footprint
  # (one half with a 4-tile ring, 139 KB, one block per SM)?  And Q4_K's A/B, not measured in s18c
  for env in "BW24CHAT_ATTN_TC_HALVES=1" "BW24CHAT_ATTN_TC_HALVES=2"; do env $env timeout 120 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q4_k --decode-only 2>&1 | grep "tg128@512 \|tg128@8192" | grep -v '"test"' | sed "s/^/$env /"; done | tee -a $OUT/bench_s19a.log
  ;;
s18d)
  # the session's build (Q8_0 wide matrices on gemm_wra; attn_decode_tc with two halves over 4 tiles):
  # the gates with the kernel check for every weight format, then the bench table
  timeout 170 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 > $OUT/check_s18d.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s18d.log | tail -6; grep -c "^PASS" $OUT/check_s18d.log
  timeout 380 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench_s18d.json 2>&1 | grep -v '^{\|^}\|^  *"\|^\]' | tee $OUT/bench_s18d.log | tail -30
  ;;
s18c)
  # decode A/B in one call, interleaved: attn_decode_tc one half (3 tiles) vs the new default, two
  # halves over 4 tiles (s18b: NVFP4 tg128@8192 358.8 / 362.0 vs 372.4; predicted +3 % @8192,
  # +-1 % @512); Q8_0 prefill with gemm_wra on its wide matrices (the new default) vs every matrix
  # (s18a's probe: o 111 -> 95 us, down 312 -> 268, yet pp512 equal); the Q8_0 gates under the default
  for i in 1 2; do for env in "BW24CHAT_ATTN_TC_HALVES=1" "BW24CHAT_ATTN_TC_HALVES=2"; do env $env timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192" | grep -v '"test"' | sed "s/^/$env /"; done; done | tee $OUT/bench_s18c.log
  for env in "BW24CHAT_ATTN_TC_HALVES=1" "BW24CHAT_ATTN_TC_HALVES=2"; do env $env timeout 120 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192" | grep -v '"test"' | sed "s/^/$env /"; done | tee -a $OUT/bench_s18c.log
  for env in "BW24CHAT_WRA=auto" "BW24CHAT_WRA=1"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --prefill-only 2>&1 | grep "pp512 \|pp2048" | grep -v '"test"' | sed "s/^/$env /"; done | tee -a $OUT/bench_s18c.log
  timeout 120 python3 -m bw24chat check --skip-kernels --formats q8_0 --kv bf16,f32 > $OUT/check_s18c.log 2>&1; echo "check rc=$?"
  grep -v "^  ok" $OUT/check_s18c.log | tail -8
  ;;
s18b)
  # attn_decode_tc with two four-warp halves per block (TC_HALVES=2, BW24CHAT_ATTN_TC_HALVES): two key
  # tiles' MMA / softmax chains side by side per block.  Predicted: L=8192 21.7 -> ~13-14 us per layer
  # in the step (16 tiles per split become 8 steps), 512 unchanged (+-0.3); NVFP4 tg128@8192 +10 %,
  # BF16 @8192 +4-5 %, @512 +-1 %.  Bits first (every decode test), then the probe, then decode A/B.
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_attention.py -k "decode" 2>&1 | tail -3 | tee $OUT/pytest_s18b.log
  grep -q " passed" $OUT/pytest_s18b.log && ! grep -q "failed\|error" $OUT/pytest_s18b.log || exit 3
  timeout 150 python3 bench/attn_probe.py --kv bf16 --lengths 512,2048,8192 --variants "default;BW24CHAT_ATTN_TC_HALVES=2;BW24CHAT_ATTN_TC_HALVES=2,BW24CHAT_ATTN_TC_STAGES=4;BW24CHAT_ATTN_TC_HALVES=2,BW24CHAT_ATTN_MIN_PER=2;BW24CHAT_ATTN_TC_HALVES=1,BW24CHAT_ATTN_CLUSTER=16" 2>&1 | grep -v "^$" | tee $OUT/probe_s18b.log
  for env in "BW24CHAT_ATTN_TC_HALVES=1" "BW24CHAT_ATTN_TC_HALVES=2" "BW24CHAT_ATTN_TC_HALVES=2 BW24CHAT_ATTN_TC_STAGES=4" "BW24CHAT_ATTN_TC_HALVES=1"; do env $env timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --decode-only 2>&1 | grep "tg128" | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s18b.log
  for env in "BW24CHAT_ATTN_TC_HALVES=1" "BW24CHAT_ATTN_TC_HALVES=2"; do env $env timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --decode-only 2>&1 | grep "tg128" | grep -v '"test"' | sed "s/^/$env /"; done | tee -a $OUT/bench_s18b.log
  ;;
s18a)
  # prepared in the seventeenth session, never run: gemm_wra on Q8_0 (opt-in BW24CHAT_WRA=1|wide;
  # codes at an 80-byte pitch, W = q d split into W_hi / W_lo registers, 3 wgmmas per k16 step: the
  # bf16 split's contract, bit-identical to pass + gemm_wgp with BW24CHAT_GEMM_I8=0).  Bits first.
  # Predicted: Q8_0 precise pp512 ~11.3-11.8k (Q4_K gained 14 % the same way) vs gemm_i8's 10.7k
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py -k "wra" 2>&1 | tail -3 | tee $OUT/pytest_s18a.log
  if grep -q " passed" $OUT/pytest_s18a.log && ! grep -q "failed\|error" $OUT/pytest_s18a.log; then
  for env in "BW24CHAT_WRA=auto" "BW24CHAT_WRA=1" "BW24CHAT_WRA=1 BW24CHAT_WRA_BT=128"; do env $env timeout 80 python3 bench/prefill_probe.py --formats q8_0 2>&1 | grep "a8=on" | sed "s/^/$env /"; done | tee $OUT/probe_s18a.log
  for env in "BW24CHAT_WRA=auto" "BW24CHAT_WRA=wide" "BW24CHAT_WRA=1"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s18a.log
  fi
  # the decode step per role (in-graph us per launch), for the decode work of this session
  timeout 200 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,nvfp4 --profile > $OUT/profile_s18a.log 2>&1; echo "profile rc=$?"
  grep -v "^{" $OUT/profile_s18a.log | grep -v "^ *$" | cut -c1-150 | tail -60
  ;;
s17e)
  # the session's build (gemm_wra for the wide NVFP4 and Q4_K matrices): every GEMM test, the gates
  # with the kernel check for every weight format, the Qwen3-8B-shape gates for the two formats
  # gemm_wra serves, then the bench table
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py 2>&1 | tail -3 | tee $OUT/pytest_s17e.log
  timeout 150 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 > $OUT/check_s17e.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s17e.log | tail -6
  timeout 120 python3 -m bw24chat check --skip-kernels --synthetic qwen3-8b --formats q4_k,nvfp4 --kv bf16 > $OUT/check8b_s17e.log 2>&1; echo "check 8b rc=$?"
  grep -v "^  ok" $OUT/check8b_s17e.log | tail -14
  timeout 360 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench_s17e.json 2>&1 | grep -v '^{\|^}\|^  *"\|^\]' | tee $OUT/bench_s17e.log | tail -30
  ;;
s17d)
  # gemm_wra restructured (tile kt + 1 decoded while tile kt's wgmmas run, wait_group 0 per tile:
  # no C7513 in any build) and extended to Q4_K (W_hi and W_lo registers, 3 wgmmas per k16).
  # Bits (exit on failure), per-shape times for both formats on every shape, prefill A/B.
  # Predicted: NVFP4 as s17c or better; Q4_K precise gate|up well under the pass's (hi + lo planes)
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py -k "wra or rows_do_not_depend or integer_dot" 2>&1 | tail -3 | tee $OUT/pytest_s17d.log
  grep -q " passed" $OUT/pytest_s17d.log && ! grep -q "failed\|error" $OUT/pytest_s17d.log || exit 3
  for env in "BW24CHAT_WRA=0" "BW24CHAT_WRA=1"; do env $env timeout 80 python3 bench/prefill_probe.py --formats nvfp4,q4_k 2>&1 | grep "a8=on" | sed "s/^/$env /"; done | tee $OUT/probe_s17d.log
  for env in "BW24CHAT_WRA=0" "BW24CHAT_WRA=auto" "BW24CHAT_WRA=wide" "BW24CHAT_WRA=1"; do env $env timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q4_k --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s17d.log
  ;;
s17c)
  # gemm_wra adopted for the wide NVFP4 matrices (qkv, gate|up; o / down stay on the pass): every
  # GEMM test, the gates with the kernel check (new row: a wide NVFP4 GEMM), the Qwen3-8B-shape
  # NVFP4 gates (wra inside a model), prefill A/B.  Predicted pp512 NVFP4 ~16k (s17b's per-shape
  # best: ~730 us of GEMM per layer vs 814 on the pass), ~89 % of BF16
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py 2>&1 | tail -3 | tee $OUT/pytest_s17c.log
  timeout 200 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 > $OUT/check_s17c.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s17c.log | tail -6; grep -i "nvfp4 6" $OUT/check_s17c.log
  timeout 120 python3 -m bw24chat check --skip-kernels --synthetic qwen3-8b --formats nvfp4 --kv bf16 > $OUT/check8b_s17c.log 2>&1; echo "check 8b rc=$?"
  tail -12 $OUT/check8b_s17c.log
  for env in "BW24CHAT_WRA=0" "X=1"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s17c.log
  timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | tee -a $OUT/bench_s17c.log
  ;;
s17b)
  # gemm_wra after s17a (bits passed, but slower than the pass + gemm_wgp: gate|up 414 vs 407 us,
  # down 249 vs 197): ~470 -> ~300 instructions per k tile (addresses hoisted, x tiles read whole
  # from padded planes, the scale as bf16 bits x 2^120 folded into the code table).  Bits, per-shape
  # time, Nsight Compute (tensor pipe, stalls) against BF16 gemm_wgp, prefill A/B
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py -k "wra or integer_dot or rows_do_not_depend or NVFP4" 2>&1 | tail -3 | tee $OUT/pytest_s17b.log
  grep -q " passed" $OUT/pytest_s17b.log && ! grep -q "failed\|error" $OUT/pytest_s17b.log || exit 3
  for env in "BW24CHAT_WRA=0" "X=1" "BW24CHAT_WRA_BT=128"; do env $env timeout 60 python3 bench/prefill_probe.py --formats nvfp4 2>&1 | grep "NVFP4  a8=on" | sed "s/^/$env /"; done | tee $OUT/probe_s17b.log
  timeout 60 python3 bench/prefill_probe.py --formats bf16 2>&1 | grep "BF16" | grep -v "a8=on" | tee -a $OUT/probe_s17b.log
  command -v ncu >/dev/null || export PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ | head -1)
  timeout 150 ncu --clock-control none --kernel-name regex:"gemm_wgp|gemm_wra" --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats python3 bench/ncu_gemm.py --formats nvfp4,bf16 --shapes "gate|up,down" > $OUT/ncu_s17b.txt 2>&1
  grep -E "gemm_wgp|gemm_wra|Duration|Issue Slots Busy|Issued Warp|No Eligible|Stall|Tensor|Executed Ipc A" $OUT/ncu_s17b.txt | grep -v "^ *-" | head -90
  for env in "BW24CHAT_WRA=0" "X=1"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s17b.log
  ;;
s17a)
  # gemm_wra (NVFP4 codes decoded into wgmma's register operand A: no dequantization pass).  Bits
  # first (exit on failure), then per-shape GEMM time and prefill A/B in one call.  Predicted: the
  # NVFP4 precise GEMMs at ~BF16's (gate|up ~330 us vs 476 with the pass), NVFP4 pp512 ~15k -> 16.5-17.5k
  # (>= 93 % of BF16 precise); fast mode unclear (wait_group 0 per tile: its decode not hidden)
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py -k "wra or integer_dot or rows_do_not_depend or tile_widths or NVFP4" 2>&1 | tail -4 | tee $OUT/pytest_s17a.log
  grep -q " passed" $OUT/pytest_s17a.log && ! grep -q "failed\|error" $OUT/pytest_s17a.log || exit 3
  for env in "BW24CHAT_WRA=0" "X=1" "BW24CHAT_WRA_BT=128" "BW24CHAT_WRA_BT=256"; do env $env timeout 60 python3 bench/prefill_probe.py --formats nvfp4 2>&1 | grep -i "graph\|gemm" | grep -v "a8=off" | sed "s/^/$env /"; done | tee $OUT/probe_s17a.log
  for env in "BW24CHAT_WRA=0" "X=1"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s17a.log
  timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | tee -a $OUT/bench_s17a.log
  timeout 150 python3 -m bw24chat check --skip-kernels --formats nvfp4 --kv bf16,f32 > $OUT/check_s17a.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s17a.log | tail -8
  ;;
s16f)
  # the final build (precise K-quants on the staged dequantization pass by default): the GEMM tests
  # (every path, the in-pipeline cross-check included), the K-quant gates, Q4_K prefill
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py tests/gpu/test_dequant_embed.py 2>&1 | tail -3 | tee $OUT/pytest_s16f.log
  timeout 150 python3 -m bw24chat check --skip-kernels --formats q4_k,q5_k,q6_k --kv bf16,f32 > $OUT/check_s16f.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s16f.log | tail -8
  timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights q4_k,nvfp4,bf16 --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | tee $OUT/bench_s16f.log
  ;;
s16e)
  # precise Q4_K / Q8_0 on the staged dequantization pass (W hi + lo planes) vs their defaults
  # (Q4_K: decoded in gemm_wgp's pipeline; Q8_0: gemm_i8).  Predicted: Q4_K gate|up ~610 us on the
  # pass vs 702 in the pipeline (s16a), pp512 9.1k -> ~10k; Q8_0 ~ its gemm_i8 10.7k
  for env in "X=1" "BW24CHAT_WGP_DEQ=0" "BW24CHAT_WGP_DEQ=0 BW24CHAT_GEMM_I8=0"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights q4_k,q8_0 --prefill-only 2>&1 | grep "pp512 \|pp2048" | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s16e.log
  ;;
s16d)
  # the session's build (warp-staged dequantization pass in line; DequantAhead removed): the gates
  # with the kernel check for every weight format, then the bench table
  timeout 200 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 > $OUT/check_s16d.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s16d.log | tail -8
  timeout 340 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench_s16d.json 2>&1 | grep -v '^{\|^}\|^  *"\|^\]' | tee $OUT/bench_s16d.log | tail -30
  ;;
s16c)
  # (historical: DequantAhead's switches are gone since 28092f5, DEQ_STAGE since the review commit)
  # the dequantization pass with warp-staged coalesced stores (DEQ_STAGE, every sector written
  # whole by one instruction) and the hi-only build (DEQ_LO=0: 48 registers, fits beside gemm_wgp),
  # alone and run ahead.  s16b: DEQ_U 1-8 flat (1.5-1.9 TB/s: not bytes in flight); ahead +7.6 %
  # NVFP4 pp512.  Predicted: staged stores 1.8 -> 2.8-3.5 TB/s if half-written sectors bound it;
  # NVFP4 pp512 -> 15-16k with it ahead.  Bits first, then the prefill gates on the new path.
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py tests/gpu/test_dequant_embed.py -k "dequant_ahead or wgp_equals or in_pipeline or dequant" 2>&1 | tail -3 | tee $OUT/pytest_s16c.log
  grep -q " passed" $OUT/pytest_s16c.log && ! grep -q "failed\|error" $OUT/pytest_s16c.log || exit 3
  for st in 0 1; do BW24CHAT_DEQ_STAGE=$st timeout 60 python3 bench/prefill_probe.py --formats nvfp4,q4_k --dequant-only 2>&1 | sed "s/^/stage=$st /"; done | tee $OUT/probe_s16c.log
  for env in "BW24CHAT_DEQ_AHEAD=0 BW24CHAT_DEQ_STAGE=0" "BW24CHAT_DEQ_AHEAD=0" "BW24CHAT_DEQ_STAGE=0" "X=1"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q4_k --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s16c.log
  timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | tee -a $OUT/bench_s16c.log
  timeout 150 python3 -m bw24chat check --skip-kernels --formats nvfp4,q4_k,f16 --kv bf16 > $OUT/check_s16c.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s16c.log | tail -8
  ;;
s16b)
  # (historical: DEQ_U and DequantAhead measured and removed, commits ca8218a / 28092f5)
  # the dequantization pass: 1-8 chunks in flight per thread (DEQ_U), and run ahead on a side
  # stream under the GEMMs (DequantAhead).  Bits first (exit on failure).  Predicted: DEQ_U 4 ->
  # ~2.5-3 TB/s if bytes in flight bound it; ahead: NVFP4 pp512 13.2k -> 15.5-17.5k (the pass
  # hidden under tensor-bound GEMMs; BF16 precise ~18k the ceiling), Q4_K fast 17.2k -> ~21k
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py tests/gpu/test_dequant_embed.py -k "dequant_ahead or wgp_equals or in_pipeline or dequant" 2>&1 | tail -4 | tee $OUT/pytest_s16b.log
  grep -q " passed" $OUT/pytest_s16b.log && ! grep -q "failed\|error" $OUT/pytest_s16b.log || exit 3
  for u in 1 2 4 8; do BW24CHAT_DEQ_U=$u timeout 60 python3 bench/prefill_probe.py --formats nvfp4,q4_k 2>&1 | grep "dequant pass" | sed "s/^/U=$u /"; done | tee $OUT/probe_s16b.log
  for env in "BW24CHAT_DEQ_AHEAD=0 BW24CHAT_DEQ_U=1" "BW24CHAT_DEQ_AHEAD=0" "X=1" "BW24CHAT_STREAM_PRIO=1" "BW24CHAT_STREAM_PRIO=1 BW24CHAT_DEQ_AHEAD_BLOCKS=2" "BW24CHAT_STREAM_PRIO=1 BW24CHAT_WGP_DEQ=0"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q4_k --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | sed "s/^/$env /"; done | tee $OUT/bench_s16b.log
  timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --prefill-only 2>&1 | grep "pp512\|pp2048" | grep -v '"test"' | tee -a $OUT/bench_s16b.log
  ;;
s16a)
  # s15a's gates (the FMA decode's cluster/hybrid merge with q8_0 / f32 / fp8 caches; every decode
  # attention test), then where NVFP4 prefill loses to BF16: the dequantization pass alone per shape
  # (predicted ~1.8-2 TB/s: 36 layers x ~494 MB per 512-token chunk would explain the ~10 ms gap
  # between BF16 pp512 28.4 ms and NVFP4 38.7 ms only below ~2 TB/s)
  timeout 300 python3 -m bw24chat check --formats nvfp4,q8_0 --kv q8_0,f32,fp8 > $OUT/check_s16a.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s16a.log | tail -14
  timeout 120 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_attention.py 2>&1 | tail -4 | tee $OUT/pytest_s16a.log
  timeout 150 python3 bench/prefill_probe.py --formats nvfp4,q4_k,bf16 2>&1 | grep -v "a8=off" | tee $OUT/probe_s16a.log
  ;;
s15b)
  # (historical: WGP_PRODUCER measured slower and removed, commit 216c6d3)
  # the producer warpgroup for gemm_wgp's in-pipeline decoding (WGP_PRODUCER): bits against the
  # dequant pass (exit on failure), then prefill A/B in one call.  Predicted: NVFP4 precise pp512
  # 13.2k -> 15.5-17k (the decode off the wgmma-issuing warps; BF16 precise 18.0k is the ceiling
  # with two wgmmas per k16 step), fast 16.5k -> 20k+; Q4_K / Q8_0 precise (three wgmmas) +5-15 %
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py -k "in_pipeline and (NVFP4 or Q4_K or Q8_0)" 2>&1 | tail -4 | tee $OUT/pytest_s15b.log
  grep -q " passed" $OUT/pytest_s15b.log && ! grep -q "failed\|error" $OUT/pytest_s15b.log || exit 3
  for env in "BW24CHAT_WGP_PRODUCER=0" "BW24CHAT_WGP_PRODUCER=1" "BW24CHAT_WGP_PRODUCER=1 BW24CHAT_WG_BN=128"; do env $env timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q4_k --prefill-only 2>&1 | grep "pp512\|pp2048\|^ *nvfp4\|^ *q4_k\|NVFP4\|Q4_K" | sed "s/^/$env /"; done | tee $OUT/bench_s15b.log
  timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --prefill-only 2>&1 | grep "pp512\|BF16" | tee -a $OUT/bench_s15b.log
  ;;
s15a)
  # prepared in the fourteenth session: first the gates under the FMA decode's new default merge
  # (cluster 16 up to 64 tiles, workspace beyond: s14f, not yet gated) for the quantized / f32
  # caches, then why BF16 decode did not gain from the cluster merge (s14e: 212.6 / 191.3 vs
  # 213.2 / 189.2) while NVFP4 gained 8.5 %: the per-role profile of both, workspace vs cluster.
  # Predicted: attention -3 us per layer in both profiles; if BF16's step does not shrink, its
  # matvec after attention (o, tensor-core matvec, launched without PDL) absorbs it
  timeout 300 python3 -m bw24chat check --formats nvfp4,q8_0 --kv q8_0,f32,fp8 > $OUT/check_s15a.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s15a.log | tail -14
  timeout 120 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_attention.py 2>&1 | tail -4 | tee $OUT/pytest_s15a.log
  for env in "BW24CHAT_ATTN_CLUSTER=0" "X=0"; do echo "== $env"; env $env timeout 90 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,nvfp4 --profile 2>&1 | grep -v '^{\|^}' | grep -v '^  *"' | head -70; done | tee $OUT/profile_s15a.log
  ;;
s14f)
  # (s14f adopted C = 16, P = 4 on sm_90)  the FMA decode kernel (q8_0 / fp8 / f32 caches) with the cluster merge up to C * P tiles and the
  # workspace merge beyond (ATTN_HYBRID): bits, then NVFP4 decode with a q8_0 cache, workspace vs
  # C = 8, P = 8 vs C = 16, P = 4.  Predicted (s14c probe: 10.8 -> 7.4 us per layer at 512 keys,
  # unchanged at 8192): +4-5 % at 512, +-0 at 8192
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_attention.py -k "hybrid or cluster_merge" 2>&1 | tail -4 | tee $OUT/pytest_s14f.log
  grep -q " passed" $OUT/pytest_s14f.log && ! grep -q "failed\|error" $OUT/pytest_s14f.log || exit 3
  for env in "BW24CHAT_ATTN_CLUSTER=0" "BW24CHAT_ATTN_CLUSTER=8" "BW24CHAT_ATTN_CLUSTER=16 BW24CHAT_ATTN_HYBRID=4"; do env $env timeout 70 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --kv-cache q8_0 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s14f.log
  ;;
s14d)
  # the session's build (tensor-core decode merge in a cluster of 8; Q4_K / Q8_0 wide matrices at 4
  # rows x 16 warps): the matvec tests s14b did not reach (its new wide test compared the packed
  # swiglu output wrongly: s14c showed every geometry equal on the stored rows), then the bench table
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_matvec.py -k "wide_matrices or sixteen or qx or steady" 2>&1 | tail -4 | tee $OUT/pytest_s14d.log
  grep -q " passed" $OUT/pytest_s14d.log && ! grep -q "failed\|error" $OUT/pytest_s14d.log || exit 3
  timeout 400 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench_s14d.json 2>&1 | grep -v '^{\|^}\|^  *"\|^\]' | tee $OUT/bench_s14d.log | tail -30
  ;;
s14e)
  # the gates with kernels, every weight format, bf16 cache (the decode kernels that changed), then
  # the transformers reference (Qwen3-8B shape included)
  timeout 330 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 > $OUT/check_s14e.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s14e.log | tail -14
  timeout 250 python3 tools/device_reference.py /root/ref --big 2>&1 | tail -14 | tee $OUT/ref_s14e.log
  for env in "BW24CHAT_ATTN_CLUSTER=0" "X=0"; do env $env timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s14e.log
  ;;
s14c)
  # s14b stopped at the new test_wide_matrices_default_geometry_is_m_invariant[NVFP4]: which knob of
  # the m = 1 wide geometry breaks m = 1 vs m = 3 bits (or the reference), per format; then s14b's rest
  timeout 120 python3 bench/wide_bits.py 2>&1 | tail -24 | tee $OUT/wide_bits_s14c.log
  timeout 120 python3 bench/attn_probe.py --kv q8_0,f32 --lengths 512,2048,8192 --variants "default;BW24CHAT_ATTN_CLUSTER=8;BW24CHAT_ATTN_CLUSTER=16" 2>&1 | grep "L=" | tee $OUT/attn_s14c.log
  timeout 60 python3 bench/attn_probe.py --kv bf16 --heads 32,4 --lengths 512,2048,8192 --variants "BW24CHAT_ATTN_CLUSTER=0;default;BW24CHAT_ATTN_CLUSTER=16" 2>&1 | grep "L=" | tee -a $OUT/attn_s14c.log
  for env in "X=0" "BW24CHAT_A8_WIDE_R4=NVFP4"; do env $env timeout 90 python3 -m bw24chat bench --synthetic qwen3-8b --weights q4_k,q8_0 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s14c.log
  ;;
s14b)
  # adopted: the tensor-core decode's split merge in a cluster of 8 (s14a: NVFP4 476.7 / 372.9 vs
  # 439.2 / 335.7), Q4_K / Q8_0 wide matrices at 4 rows x 16 warps (QX); the FMA decode kernel got the
  # cluster merge too (opt-in).  Bits first (exit on failure), then the FMA kernel and a 4-kv-head
  # shape by probe (predicted: the FMA kernel gains about the same ~3 us at 512 keys; 32,4 prefers
  # C = 16 at 8192), then Q4_K / Q8_0 decode A/B against the old geometry, then their gates
  timeout 300 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_attention.py tests/gpu/test_matvec.py -k "decode or wide_matrices or sixteen or qx or m_invariant" 2>&1 | tail -4 | tee $OUT/pytest_s14b.log
  grep -q " passed" $OUT/pytest_s14b.log && ! grep -q "failed\|error" $OUT/pytest_s14b.log || exit 3
  timeout 120 python3 bench/attn_probe.py --kv q8_0,f32 --lengths 512,2048,8192 --variants "default;BW24CHAT_ATTN_CLUSTER=8;BW24CHAT_ATTN_CLUSTER=16" 2>&1 | grep "L=" | tee $OUT/attn_s14b.log
  timeout 60 python3 bench/attn_probe.py --kv bf16 --heads 32,4 --lengths 512,2048,8192 --variants "BW24CHAT_ATTN_CLUSTER=0;default;BW24CHAT_ATTN_CLUSTER=16" 2>&1 | grep "L=" | tee -a $OUT/attn_s14b.log
  for env in "X=0" "BW24CHAT_A8_WIDE_R4=NVFP4"; do env $env timeout 90 python3 -m bw24chat bench --synthetic qwen3-8b --weights q4_k,q8_0 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s14b.log
  timeout 200 python3 -m bw24chat check --formats q4_k,q8_0 --kv bf16,q8_0 > $OUT/check_s14b.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s14b.log | tail -12
  ;;
s14a)
  # prepared in the thirteenth session: the decode merge by finer ablation (ATTN_ABLATE bits: 1 no
  # merge, 8 the last block stops after its arrival, 16 no fences, 24 both).  s13e: the merge is ~4.8
  # of 7.8 us at 512 keys, ~6.7 of 19 at 8192; s13f (commit 59a1d17, removed): one fence per block
  # and prefetched partials changed nothing.  Which part is it: the fence + arrival chain (8 ~ 1),
  # the merge body (8 ~ default), or the fences (16)?
  timeout 120 python3 bench/attn_probe.py --kv bf16 --lengths 512,2048,8192 --variants "default;BW24CHAT_ATTN_ABLATE=1;BW24CHAT_ATTN_ABLATE=8;BW24CHAT_ATTN_ABLATE=16;BW24CHAT_ATTN_ABLATE=24" 2>&1 | tail -16 | tee $OUT/attn_s14a.log
  # the split merge in a thread-block cluster (ATTN_CLUSTER, prepared: compiled for sm_90a / sm_120a,
  # never run): bits against the workspace merge with the same split count, then us per layer
  # (predicted: most of the ablated merge's 4.8 / 5.9 / 6.8 us at 512 / 2048 / 8192 keys), then decode
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_attention.py -k cluster_merge 2>&1 | tail -4 | tee $OUT/pytest_s14a.log
  grep -q " passed" $OUT/pytest_s14a.log && ! grep -q "failed\|error" $OUT/pytest_s14a.log || exit 3
  timeout 120 python3 bench/attn_probe.py --kv bf16 --lengths 512,2048,8192 --variants "BW24CHAT_ATTN_SPLITS=16;BW24CHAT_ATTN_CLUSTER=16;BW24CHAT_ATTN_SPLITS=8;BW24CHAT_ATTN_CLUSTER=8" 2>&1 | tail -14 | tee -a $OUT/attn_s14a.log
  for env in "X=0" "BW24CHAT_ATTN_CLUSTER=16" "BW24CHAT_ATTN_CLUSTER=8"; do env $env timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s14a.log
  # Q4_K / Q8_0 with the QX hand-off too: their gate|up in 64-row tiles (16 warps x 4 rows, the 8-warp
  # statistic) so that it writes the down projection's codes (s11a: Q4_K gate|up 20.9 us at 8 or 16
  # warps; 4 rows 21.0 vs 20.8).  Predicted +1-2 % decode (NVFP4's QX gain), if the tiles cost nothing
  for env in "X=0" "BW24CHAT_A8_WIDE_R4=NVFP4,Q4_K,Q8_0 BW24CHAT_MV_NW=16 BW24CHAT_MV_STAT8=1"; do env $env timeout 90 python3 -m bw24chat bench --synthetic qwen3-8b --weights q4_k,q8_0 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee -a $OUT/bench_s14a.log
  ;;
s13e)
  # decode attention by ablation (ATTN_ABLATE, timing only): what the cross-split merge (1), the tile
  # arithmetic (2) and the K/V loads (4) each cost on the critical path; MIN_PER=256: one split, no
  # merge.  Predicted: merge ~2-3 us at every length, arithmetic ~0.5 us per tile of a split
  timeout 200 python3 bench/attn_probe.py --kv bf16 --lengths 512,2048,8192 --variants "default;BW24CHAT_ATTN_ABLATE=1;BW24CHAT_ATTN_ABLATE=2;BW24CHAT_ATTN_ABLATE=4;BW24CHAT_ATTN_ABLATE=6;BW24CHAT_ATTN_ABLATE=7;BW24CHAT_ATTN_MIN_PER=256" 2>&1 | tee $OUT/attn_s13e.log | tail -40
  command -v ncu >/dev/null || export PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ | head -1)
  timeout 120 ncu --clock-control none --kernel-name regex:attn_decode_tc --section WarpStateStats --section SchedulerStats --print-details all python3 bench/attn_probe.py --kv bf16 --lengths 512,8192 --variants default --ncu > $OUT/ncu_attn_s13e.txt 2>&1
  grep -E "attn_decode_tc \(|Stall|stall|Warp Cycles Per Issued" $OUT/ncu_attn_s13e.txt | head -60
  ;;
s13d)
  # the session's final build (I8_SCF32 and QX_HANDOFF=2 the defaults): the whole bench table, then
  # the gates with kernels for the two formats whose kernels changed (Q8_0 prefill, NVFP4 decode)
  timeout 330 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench_s13d.json 2>&1 | grep -v '^{\|^}\|^  *"\|^\]' | tee $OUT/bench_s13d.log | tail -40
  timeout 220 python3 -m bw24chat check --formats nvfp4,q8_0 --kv bf16,f32 > $OUT/check_s13d.log 2>&1; echo "check rc=$?"
  grep -v "^PASS\|^  ok" $OUT/check_s13d.log | tail -16
  ;;
s13c)
  # qx_out's hand-off (QX_HANDOFF, prepared this session): the words of every mode, then decode A/B.
  # s11d: gate|up 23.6 us in the step with the two block barriers per tile, 19.4-19.6 without QX.
  # Predicted: mode 1 -0.5..-1 us per gate|up, mode 2 -1..-3 (no warp but warp 0 waits per tile)
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider -rf --tb=short tests/gpu/test_matvec.py -k qx 2>&1 | tail -4 | tee $OUT/pytest_s13c.log
  grep -q " passed" $OUT/pytest_s13c.log && ! grep -q "failed\|error" $OUT/pytest_s13c.log || exit 3
  for h in 0 1 2 0 2; do BW24CHAT_QX_HANDOFF=$h timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q4_k --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/QX_HANDOFF=$h /"; done | tee $OUT/bench_s13c.log
  BW24CHAT_QX_HANDOFF=2 timeout 90 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --profile 2>&1 | grep -v '^{\|^}' | grep -v '^  *"' | head -16 | tee $OUT/profile_s13c.log
  ;;
s13a)
  # prepared in the twelfth session: Nsight Compute on the precise prefill GEMMs at T = 512 (BF16
  # gemm_wgp, Q8_0 gemm_i8), the second launch of each.  Predicted (NOTES, twelfth session): L2 ->
  # SM traffic near its limit (x re-read once per column block), tensor pipes well below peak;
  # gemm_i8 additionally issue-bound in its fold (ALU ~2.5x its IGMMA time)
  command -v ncu >/dev/null || export PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ | head -1)
  timeout 240 ncu --clock-control none --kernel-name regex:"gemm_wgp|gemm_i8" --launch-skip-before-match 0 --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats python3 bench/ncu_gemm.py --formats bf16,q8_0 > $OUT/ncu_s13a.txt 2>&1
  grep -E "gemm_wgp|gemm_i8|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Issued Warp|No Eligible|Stall|Max Bandwidth|L2 Hit Rate|Mem Pipes Busy" $OUT/ncu_s13a.txt | head -120
  # gemm_i8 with its scales converted to f32 once per tile (I8_SCF32, prepared: 11 % fewer loop
  # instructions in the SASS, the same bits): bits, then pp512 / pp2048 against the default
  timeout 100 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py -k gemm_i8 2>&1 | tail -3
  for env in "BW24CHAT_I8_SCF32=0" "BW24CHAT_I8_SCF32=1"; do env $env timeout 120 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --prefill-only 2>&1 | grep " pp" | sed "s/^/$env /"; done | tee $OUT/bench_s13a.log
  # decode attention at 512 and 8192 keys (7.8 / 19 us per layer against ~0.5 / 8 us of bytes): where
  # the latency chain and the split merge's global round trip spend their cycles
  timeout 150 ncu --clock-control none --kernel-name regex:attn_decode_tc --section SpeedOfLight --section WarpStateStats --section SchedulerStats python3 bench/attn_probe.py --kv bf16 --lengths 512,8192 --ncu > $OUT/ncu_attn_s13a.txt 2>&1
  grep -E "attn_decode_tc|Duration|DRAM Throughput|Issued Warp|No Eligible|Stall|Active Warps" $OUT/ncu_attn_s13a.txt | head -40
  ;;
s12d)
  # gemm_i8 adopted as the Q8_0 precise prefill (stage size fixed): its bits, the tests that pin
  # the other kernels' bits with it off, pp with it on / off, and the Q8_0 gates with kernels
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py -k "gemm_i8 or tile_widths or same_bits or in_pipeline or equals_register or matches_reference" 2>&1 | grep -v "^rng seed" | tail -6 | tee $OUT/pytest_s12d.log
  for env in "BW24CHAT_GEMM_I8=0" "BW24CHAT_GEMM_I8=1"; do env $env timeout 120 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --prefill-only 2>&1 | grep " pp" | sed "s/^/$env /"; done | tee $OUT/bench_s12d.log
  timeout 200 python3 -m bw24chat check --formats q8_0 --kv bf16,f32 2>&1 | grep -v "^PASS\|^  ok" | tail -8 | tee $OUT/check_s12d.log
  ;;
s12a)
  # prepared in the eleventh session (compiled for sm_90a / sm_120a, never run): gemm_i8, the Q8_0
  # precise prefill on the int8 wgmma over the raw code bytes (BW24CHAT_GEMM_I8=1).  Bits / reference
  # first, then pp512 / pp2048 against the bf16-split path in one call, then the model gates with it
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/gpu/test_gemm.py -k "gemm_i8" 2>&1 | tail -15 | tee $OUT/pytest_s12a.log
  for env in "BW24CHAT_GEMM_I8=0" "BW24CHAT_GEMM_I8=1"; do env $env timeout 120 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --prefill-only 2>&1 | grep " pp" | sed "s/^/$env /"; done | tee $OUT/bench_s12a.log
  BW24CHAT_GEMM_I8=1 timeout 150 python3 -m bw24chat check --skip-kernels --formats q8_0 --kv bf16,f32 2>&1 | grep -v "^PASS\|^  ok" | tail -8 | tee $OUT/check_s12a.log
  ;;
s11f)
  # the QX hand-off by block barriers alone (the last-warp version lost in s11e and is gone): bits, decode
  timeout 120 python3 -m pytest -q -p no:cacheprovider -rf --tb=line tests/gpu/test_matvec.py -k "qx or sixteen" 2>&1 | tail -3 | tee $OUT/pytest_s11f.log
  for env in "BW24CHAT_QX=0" "BW24CHAT_QX=1"; do env $env timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s11f.log
  ;;
s11e)
  # qx_out's hand-off by the tile's last warp (QX_SYNC=1, no block barriers) against block barriers
  # (s11d's profile: gate|up 23.6 us in the step with the barriers, 19.6 back to back without QX)
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=line tests/gpu/test_matvec.py -k qx 2>&1 | tail -4 | tee $OUT/pytest_s11e.log
  for env in "BW24CHAT_QX=0" "BW24CHAT_QX_SYNC=0" "BW24CHAT_QX_SYNC=1"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s11e.log
  timeout 90 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --profile 2>&1 | grep -v '^{\|^}' | grep -v '^  *"' | head -14 | tee $OUT/profile_s11e.log
  timeout 150 python3 -m bw24chat check --skip-kernels --formats nvfp4 --kv bf16,f32 2>&1 | grep -v "^PASS\|^  ok" | tail -8 | tee $OUT/check_s11e.log
  ;;
s11c)
  # the QX pair test again (s11b: 2 of 27 failed, which assertion unknown), with every matvec test and
  # the whole kernel check + model gates (bf16 / f32 caches) beside them on the final geometry
  (timeout 300 python3 -m pytest -q -p no:cacheprovider -rf --tb=line tests/gpu/test_matvec.py > /tmp/pt_c1.log 2>&1; echo "test_matvec: $(tail -1 /tmp/pt_c1.log)" > /tmp/rc1) &
  timeout 400 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16,f32 > $OUT/check.log 2>&1; echo "check rc=$?"
  wait; grep -v "^PASS\|^  ok" $OUT/check.log | tail -24; cat /tmp/rc1 | tee $OUT/pytest_s11c.log; grep -h "^FAILED\|^/.*Error\|assert" /tmp/pt_c1.log | cut -c1-300 | head -20 | tee -a $OUT/pytest_s11c.log
  ;;
s11d)
  # the QX pair test (s11c: its failures were the test's own NVFP4 widths, F not a multiple of 64);
  # then the bench table (every row) and the decode profile, alone on the GPU
  timeout 100 python3 -m pytest -q -p no:cacheprovider -rf --tb=line tests/gpu/test_matvec.py -k qx 2>&1 | tail -4 | tee $OUT/pytest_s11d.log
  timeout 330 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^{\|^}' | grep -v '^  *"' | tee $OUT/bench.log
  timeout 90 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --profile 2>&1 | grep -v '^{\|^}' | grep -v '^  *"' | tail -40 | tee $OUT/profile.log
  ;;
s11b)
  # the s11a geometry adopted (NVFP4 rmsnorm matvecs at 16 warps with the 8-warp statistic, Q8_0 /
  # Q4_K down at 16 warps, BF16 all SIMT); QX: gate|up's swiglu epilogue writes the down matvec's x
  # codes (NVFP4).  Bits first (QX pairs, 16-warp tests, the BF16 SIMT geometry), then the decode
  # A/B of QX and every format's decode, then the gates with QX on
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "qx or sixteen or BF16" 2>&1 | tail -4 | tee $OUT/pytest_s11b.log
  for env in "BW24CHAT_QX=0" "BW24CHAT_QX=1"; do env $env timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s11b.log
  timeout 150 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k --decode-only 2>&1 | grep "tg128@[0-9]* " | tee -a $OUT/bench_s11b.log
  timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --profile 2>&1 | grep -v '^ \|^{\|^}' | tail -22 | tee $OUT/profile_s11b.log
  timeout 150 python3 -m bw24chat check --skip-kernels --formats nvfp4,bf16 --kv bf16,f32 2>&1 | grep -v "^PASS\|^  ok" | tail -14 | tee $OUT/check_s11b.log
  ;;
s10f)
  # the tenth session's last device minutes: s11a trimmed (NVFP4 only)
  timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k "sixteen" 2>&1 | tail -3 | tee $OUT/pytest_s10f.log
  BW24CHAT_MV_VARIANTS="auto:;nw16:MV_NW=16;nw16 u4:MV_NW=16,MV_U=4" timeout 60 python3 bench/matvec_variants.py --formats nvfp4 2>&1 | grep -A6 "best per shape" | tee $OUT/mv_s10f.log
  for env in "X=1" "BW24CHAT_MV_NW=16"; do env $env timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s10f.log
  ;;
s11a)
  # prepared in the tenth session: blocks of 16 warps (MV_NW) -- adopted for NVFP4 o / down (s10f) --
  # for the other formats' o / down, and with the 8-warp rmsnorm statistic (MV_STAT8) for qkv,
  # gate|up and the LM head of every format.  Bits first, then per-shape variants, then decode A/B
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "sixteen" 2>&1 | tail -3 | tee $OUT/pytest_s11a.log
  BW24CHAT_MV_VARIANTS="auto:;nw16:MV_NW=16;nw16 stat8:MV_NW=16,MV_STAT8=1" timeout 240 python3 bench/matvec_variants.py --formats nvfp4,q8_0,q4_k 2>&1 | grep -A16 "best per shape" | tee $OUT/mv_s11a.log
  BW24CHAT_MV_VARIANTS="auto:;nw16 stat8:MV_NW=16,MV_STAT8=1,MATVEC=simt;simt:MATVEC=simt" timeout 100 python3 bench/matvec_variants.py --formats bf16 2>&1 | grep -A6 "best per shape" | tee -a $OUT/mv_s11a.log
  for env in "X=1" "BW24CHAT_MV_NW=16" "BW24CHAT_MV_NW=16 BW24CHAT_MV_STAT8=1"; do env $env timeout 150 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q4_k,q8_0 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s11a.log
  ;;
s10c)
  # (device time was short: this and s10d stand for the stages planned before, which never ran)
  # SmolLM2 first half (carry [".whl", ".carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-aa"]);
  # the grid-wide sampler: its GPU tests, then the probe; the kernel check and every model gate
  # (bf16 / f32 caches) with the GPU test files beside it; then the timing ablations of the
  # integer-dot matvec and BF16 at 4 rows per warp (alone on the GPU)
  cat .carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-aa > $SMOL && ls -la $SMOL | cut -c1-80
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_sampling.py 2>&1 | tail -6 | tee $OUT/pytest_s10c.log
  timeout 60 python3 bench/sampler_probe.py 2>&1 | tee $OUT/sampler_s10c.log
  (timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py > /tmp/pt_f1.log 2>&1; echo "test_matvec: $(tail -1 /tmp/pt_f1.log)" > /tmp/rf1) &
  timeout 330 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16,f32 > $OUT/check.log 2>&1; echo "check rc=$?"
  wait; grep -v "^PASS\|^  ok" $OUT/check.log | tail -24; cat /tmp/rf1 | tee -a $OUT/pytest_s10c.log; grep -h "^FAILED" /tmp/pt_f1.log | cut -c1-200 | head | tee -a $OUT/pytest_s10c.log
  BW24CHAT_MV_VARIANTS="auto:;no prologue:MV_ABLATE=1;no dot:MV_ABLATE=2;loads only:MV_ABLATE=3" timeout 80 python3 bench/matvec_variants.py --formats nvfp4 2>&1 | grep -A6 "best per shape" | tee $OUT/mv_ablate_s10c.log
  BW24CHAT_MV_VARIANTS="auto:;simt r4 u1:MATVEC=simt,MV_R=4,MV_U=1,MV_MINB=2,MV_STEADY=1" timeout 70 python3 bench/matvec_variants.py --formats bf16 2>&1 | grep -A6 "best per shape" | tee $OUT/mv_s10c.log
  ;;
s10d)
  # SmolLM2 first half again (the s10c machine went back; carry [".whl", ".carry/.../part-aa"]); the
  # BF16 geometry's tests; the bench table
  cat .carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-aa > $SMOL && ls -la $SMOL | cut -c1-80
  # BF16 wide matrices at 4 rows per warp, 1 slot (adopted from s10c): the bit / contract tests under that geometry
  BW24CHAT_MATVEC=simt BW24CHAT_MV_R=4 BW24CHAT_MV_U=1 BW24CHAT_MV_MINB=2 BW24CHAT_MV_STEADY=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "BF16 or F32 or steady" 2>&1 | tail -2 | tee $OUT/pytest_s10d.log
  timeout 330 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  ;;
s10e)
  # SmolLM2 second half (carry [".whl", ".carry/.../part-ab", ".carry/.../sha256"]): CUDA and NumPy
  # greedy 64 tokens on chat prompts, the gates on the real model per cache type
  smollm2_second_half s10d smollm2.log
  ;;
s10a)
  # prepared in the ninth session (every build compiled for sm_90a / sm_120a in CI; not run):
  # 1. MV_CPA: the matvec weight window as a per-thread cp.async ring in shared memory (no registers
  #    held by loads in flight: ncu showed the wide matrices register-limited with the weight loads the
  #    top stall) -- bits against the register window, then per-shape variants for every format it serves
  # 2. BF16 SIMT at 4 rows per warp; 3. the sampler alone, and SAMPLE_FIXP
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "cp_async_ring" 2>&1 | tail -3 | tee $OUT/pytest_s10a.log
  # 4. ATTN_STACK: decode attention with Q / P hi and lo parts stacked as MMA rows (half the MMAs)
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention.py -k "decode and stack" 2>&1 | tail -3 | tee -a $OUT/pytest_s10a.log
  timeout 150 python3 bench/attn_probe.py --lengths 512,2048,8192 --variants "default;BW24CHAT_ATTN_STACK=1;BW24CHAT_ATTN_STACK=1,BW24CHAT_ATTN_SPLITS=33" 2>&1 | tee $OUT/attn_s10a.log
  BW24CHAT_MV_VARIANTS="auto:;cpa u4:MV_CPA=1,MV_U=4,MV_STEADY=1;cpa u6:MV_CPA=1,MV_U=6,MV_STEADY=1;cpa u4 minb2:MV_CPA=1,MV_U=4,MV_MINB=2,MV_STEADY=1;cpa r4 u4:MV_CPA=1,MV_U=4,MV_R=4,MV_MINB=2,MV_STEADY=1;cpa r4 u3 minb3:MV_CPA=1,MV_U=3,MV_R=4,MV_MINB=3,MV_STEADY=1" timeout 300 python3 bench/matvec_variants.py --formats nvfp4,q8_0,q4_k 2>&1 | grep -A16 "best per shape" | tee $OUT/mv_cpa_s10a.log
  BW24CHAT_MV_VARIANTS="auto:;simt r4 u2:MATVEC=simt,MV_R=4,MV_U=2,MV_MINB=2,MV_STEADY=1;simt r4 u1:MATVEC=simt,MV_R=4,MV_U=1,MV_MINB=2,MV_STEADY=1;simt cpa u4:MATVEC=simt,MV_CPA=1,MV_U=4,MV_STEADY=1;simt cpa r4 u4:MATVEC=simt,MV_CPA=1,MV_U=4,MV_R=4,MV_MINB=2,MV_STEADY=1" timeout 150 python3 bench/matvec_variants.py --formats bf16 2>&1 | grep -A6 "best per shape" | tee $OUT/mv_s10a.log
  BW24CHAT_MATVEC=simt BW24CHAT_MV_R=4 BW24CHAT_MV_U=2 BW24CHAT_MV_MINB=2 BW24CHAT_MV_STEADY=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "BF16 or F32 or steady" 2>&1 | tail -2 | tee -a $OUT/pytest_s10a.log
  # the sampler alone (sampled decode rows run 0.15-0.2 ms per token slower than greedy)
  timeout 100 python3 bench/sampler_probe.py 2>&1 | tee $OUT/sampler_s10a.log
  BW24CHAT_SAMPLE_FIXP=1 timeout 100 python3 bench/sampler_probe.py 2>&1 | sed "s/^/FIXP=1 /" | tee -a $OUT/sampler_s10a.log
  BW24CHAT_SAMPLE_FIXP=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_sampling.py 2>&1 | tail -2 | tee -a $OUT/sampler_s10a.log
  ;;
s9j)
  # NVFP4 wide matrices at 4 rows per warp (adopted from s9i): the matvec bit / contract tests with
  # that geometry forced on every format; Q4_K / Q8_0 with it (variants, decode A/B); decode
  BW24CHAT_MV_VARIANTS="auto:;r4 u1:MV_MINB=2,MV_U=1,MV_R=4,MV_STEADY=1" timeout 150 python3 bench/matvec_variants.py --formats q4_k,q8_0 2>&1 | grep -A12 "best per shape" | tee $OUT/mv_s9j.log
  BW24CHAT_MV_R=4 BW24CHAT_MV_U=1 BW24CHAT_MV_MINB=2 BW24CHAT_MV_STEADY=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "NVFP4 or Q4_K or Q8_0 or integer_dot or steady" > /tmp/pt_r4.log 2>&1; echo "matvec R4: $(tail -1 /tmp/pt_r4.log)" | tee $OUT/pytest_s9j.log
  grep -h "^FAILED\|^E  " /tmp/pt_r4.log | cut -c1-200 | head | tee -a $OUT/pytest_s9j.log
  for env in "X=1" "BW24CHAT_A8_WIDE_R4=NVFP4,Q4_K,Q8_0"; do env $env timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q4_k,q8_0 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s9j.log
  ;;
s9i)
  # NVFP4 matvec occupancy / rows-per-warp variants (ncu, s9h: register-limited at 6 warps per scheduler,
  # 32 % of stalls on global loads): 4 blocks per SM at 1 slot (64 registers), 4 rows per warp at 2 blocks
  BW24CHAT_MV_VARIANTS="auto:;minb4 u1:MV_MINB=4,MV_U=1,MV_STEADY=1;minb2 r4:MV_MINB=2,MV_U=2,MV_R=4,MV_STEADY=1;minb2 r4 u1:MV_MINB=2,MV_U=1,MV_R=4,MV_STEADY=1" timeout 200 python3 bench/matvec_variants.py --formats nvfp4 2>&1 | tee $OUT/mv_s9i.log | grep -A6 "best per shape"
  ;;
s9h)
  # Nsight Compute on the new NVFP4 / Q4_K integer-dot matvecs (where the remaining time goes: issue,
  # stalls, occupancy, DRAM throughput), one eager launch each
  command -v ncu >/dev/null || export PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ | head -1)
  timeout 200 ncu --clock-control none --kernel-name regex:matvec --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis python3 bench/ncu_matvec.py --formats nvfp4,q4_k --shapes "qkv,gate|up" > $OUT/ncu_s9h.txt 2>&1
  grep -E "matvec|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Issued Warp|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Stall" $OUT/ncu_s9h.txt | head -80
  ;;
s9f)
  # ninth session, final call: every gate and kernel check on the final kernels with the matvec GPU
  # tests in parallel (no timings taken then), then the bench table alone, then the forced portable
  # path on the changed formats
  (timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py > /tmp/pt_mvf.log 2>&1; echo "test_matvec: $(tail -1 /tmp/pt_mvf.log)" > /tmp/rf1) &
  timeout 330 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16,f32 > $OUT/check.log 2>&1; echo "check rc=$?"
  wait; grep -v "^PASS\|^  ok" $OUT/check.log | tail -24; cat /tmp/rf1 | tee $OUT/pytest_s9f.log; grep -h "^FAILED" /tmp/pt_mvf.log | cut -c1-200 | head | tee -a $OUT/pytest_s9f.log
  timeout 200 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  BW24CHAT_PORTABLE=1 timeout 50 python3 -m bw24chat check --skip-kernels --formats q4_k,nvfp4 --kv bf16 2>&1 | tee $OUT/check_portable.log | grep -v "^PASS\|^  ok" | tail -6
  ;;
s9g)
  # the bench table alone (if s9f ran out of time)
  timeout 420 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  ;;
s9c)
  # Q4_K with both code levels in one integer dot (A8_JOIN): bits / contract tests under it, then
  # the NVFP4 / Q4_K kernel variants and decode A/B; the NVFP4 gemm / dequant tests again (s9b's log was clobbered)
  (BW24CHAT_A8_JOIN=1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "Q4_K or integer_dot or steady" > /tmp/pt_mvj.log 2>&1; echo "matvec A8_JOIN=1: $(tail -1 /tmp/pt_mvj.log)" > /tmp/r1) &
  (timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm.py -k "NVFP4 or tile_widths" > /tmp/pt_gm.log 2>&1; echo "gemm: $(tail -1 /tmp/pt_gm.log)" > /tmp/r2) &
  (timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_dequant_embed.py > /tmp/pt_dq.log 2>&1; echo "dequant: $(tail -1 /tmp/pt_dq.log)" > /tmp/r3) &
  wait; cat /tmp/r1 /tmp/r2 /tmp/r3 | tee $OUT/pytest_s9c.log; grep -h "^FAILED\|^E  " /tmp/pt_mvj.log /tmp/pt_gm.log /tmp/pt_dq.log | cut -c1-240 | head -24 | tee -a $OUT/pytest_s9c.log
  timeout 200 python3 bench/matvec_variants.py --formats nvfp4,q4_k 2>&1 | tee $OUT/mv_s9c.log | grep -A12 "best per shape"
  for env in "X=1" "BW24CHAT_A8_JOIN=1"; do env $env timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights q4_k,nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s9c.log
  ;;
s9b)
  # NVFP4 selector-word layout + one integer-dot chain per half (matvec), repacked scale bytes:
  # the GPU tests that touch NVFP4 (and the fixed gemm_wg tile-width test), in parallel; then the
  # kernel variants; then decode; then the gates on the NVFP4 model
  (timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "NVFP4 or integer_dot or steady" > /tmp/pt_mv.log 2>&1; echo "matvec: $(tail -1 /tmp/pt_mv.log)") > $OUT/pytest_s9b.log &
  (timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm.py -k "NVFP4 or tile_widths" > /tmp/pt_gm.log 2>&1; echo "gemm: $(tail -1 /tmp/pt_gm.log)") >> $OUT/pytest_s9b.log &
  (timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_dequant_embed.py > /tmp/pt_dq.log 2>&1; echo "dequant: $(tail -1 /tmp/pt_dq.log)") >> $OUT/pytest_s9b.log &
  wait; cat $OUT/pytest_s9b.log; grep -h "^FAILED\|^E  " /tmp/pt_mv.log /tmp/pt_gm.log /tmp/pt_dq.log | cut -c1-240 | head -24 | tee -a $OUT/pytest_s9b.log
  timeout 150 python3 bench/matvec_variants.py --formats nvfp4 2>&1 | tee $OUT/mv_s9b.log | grep -A8 "best per shape"
  timeout 120 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | tee $OUT/bench_s9b.log
  timeout 150 python3 -m bw24chat check --formats nvfp4 --kv bf16 2>&1 | tee $OUT/check_s9b.log | grep -v "^PASS\|^  ok" | tail -12
  ;;
s9a)
  # ninth session, first call: every GPU test file (several have not run since the sixth session), the
  # files in parallel (compiles are CPU-bound: 16 cores), each under its own timeout; then decode
  # attention alone with deeper cp.async pipelines and more splits; then where the decode step goes
  for f in tests/gpu/test_*.py; do (timeout 330 python3 -m pytest -q -p no:cacheprovider $f > /tmp/pt_$(basename $f .py).log 2>&1; echo "$f rc=$?: $(tail -1 /tmp/pt_$(basename $f .py).log)") & done > $OUT/pytest_gpu_all.log; wait
  cat $OUT/pytest_gpu_all.log; grep -h "^FAILED\|^ERROR" /tmp/pt_*.log | cut -c1-200 | head -30 | tee -a $OUT/pytest_gpu_all.log
  timeout 150 python3 bench/attn_probe.py --lengths 512,2048,8192 --variants "default;BW24CHAT_ATTN_TC_STAGES=4;BW24CHAT_ATTN_TC_STAGES=6;BW24CHAT_ATTN_SPLITS=33;BW24CHAT_ATTN_SPLITS=33,BW24CHAT_ATTN_TC_STAGES=4;BW24CHAT_ATTN_SPLITS=8" 2>&1 | tee $OUT/attn_s9a.log
  timeout 120 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --profile 2>&1 | grep -v '^ \|^{\|^}' | tail -30 | tee $OUT/profile_nvfp4.log
  ;;
s8g)
  # the register-staged GEMMs (portable mma.sync = the sm_120a path, and gemm_wg) on the integer-dot x planes:
  # the same bits as gemm_wgp; then the forced portable path's gates
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm.py -k "integer_dot or wgp_equals or act_quant" 2>&1 | grep -E "^(FAILED|E +AssertionError)|passed|failed" | cut -c1-250 | head -20 | tee $OUT/pytest_s8g.log
  BW24CHAT_PORTABLE=1 timeout 120 python3 -m bw24chat check --skip-kernels --formats bf16,q8_0,q4_k,nvfp4 --kv bf16 2>&1 | tee $OUT/check_portable.log | grep -v "^PASS\|^  ok" | tail -8
  ;;
s8e)
  # final call 1: the in-pipeline dequant's bits (where it differs, if it does), then every gate and kernel check,
  # then the matvec GPU tests under the final dispatch (BF16 o on SIMT, steady windows for NVFP4 / BF16)
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm.py -k "in_pipeline or (wgp_equals and Q8_0)" 2>&1 | grep -E "^(FAILED|E +AssertionError)|passed|failed" | cut -c1-300 | head -30 | tee $OUT/pytest_deq.log
  cp $OUT/pytest_deq.log /root/pytest_deq.log
  grep -q "failed" $OUT/pytest_deq.log && export BW24CHAT_WGP_DEQ=0 && echo "IN-PIPELINE DEQUANT FAILED: the dequant pass from here on"
  timeout 330 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16,f32 2>&1 | tee $OUT/check.log | grep -v "^PASS\|^  ok" | tail -30
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py 2>&1 | tail -2 | tee $OUT/pytest_matvec.log
  ;;
s8f)
  # final call 2: the bench table
  grep -q "failed" /root/pytest_deq.log 2>/dev/null && export BW24CHAT_WGP_DEQ=0 && echo "(in-pipeline dequant off)"
  timeout 560 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  ;;
s8d)
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm.py -k "in_pipeline or (wgp_equals and Q8_0)" 2>&1 | grep -E "^(FAILED|E +AssertionError)|passed|failed" | cut -c1-300 | head -40 | tee $OUT/pytest_s8d.log
  ;;
s8c)
  # quantized weights decoded inside gemm_wgp's pipeline (WGP_DEQ): bits vs the dequant pass, prefill A/B; decode
  # with the steady windows adopted for NVFP4 / BF16 (and BF16 o on SIMT)
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_gemm.py -k "in_pipeline or wgp_equals or integer_dot" 2>&1 | tail -3 | tee $OUT/pytest_s8c.log
  timeout 200 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,nvfp4,q8_0,q4_k --prefill-only 2>&1 | grep "pp[0-9]" | tee $OUT/bench_s8c_pf.log
  BW24CHAT_WGP_DEQ=0 timeout 150 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q8_0,q4_k --prefill-only 2>&1 | grep "pp[0-9]" | sed "s/^/DEQ=0 /" | tee -a $OUT/bench_s8c_pf.log
  timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | tee $OUT/bench_s8c_dec.log
  ;;
s8b)
  # eighth session, first call: the integer-dot prologue through shared memory (cp.async, one L2 round trip per
  # row) and per-tile L2 prefetch — correctness, then per-kernel A/B, then decode A/B; then the s8a tests
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k "integer_dot or Q8_0 or Q4_K or NVFP4 or steady" 2>&1 | tail -2 | tee $OUT/pytest_s8b.log
  timeout 150 python3 bench/matvec_variants.py --formats q8_0,q4_k,nvfp4 2>&1 | tee $OUT/mv_s8b.log | grep -A20 "best per shape"
  for env in "X=1" "BW24CHAT_A8_SMEM=0" "BW24CHAT_MV_L2PF=1"; do env $env timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0,q4_k,nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s8b.log
  BW24CHAT_MV_STEADY=1 timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k "BF16 or NVFP4" 2>&1 | tail -1 | tee -a $OUT/pytest_s8b.log
  BW24CHAT_MATVEC=simt BW24CHAT_MV_STEADY=1 timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k "BF16" 2>&1 | tail -1 | tee -a $OUT/pytest_s8b.log
  ;;
s8a)
  # next session, first call: GPU tests of the builds measured faster in s7c but not adopted yet — steady windows
  # for NVFP4 (with NV_PM) and BF16, and BF16 on the SIMT kernel (o: 13.4 vs tc 13.9 us)
  timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k steady_windows 2>&1 | tail -1 | tee $OUT/pytest_s8a.log
  BW24CHAT_MV_STEADY=1 timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k "BF16 or NVFP4" 2>&1 | tail -1 | tee -a $OUT/pytest_s8a.log
  BW24CHAT_MATVEC=simt BW24CHAT_MV_STEADY=1 timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k "BF16" 2>&1 | tail -1 | tee -a $OUT/pytest_s8a.log
  ;;
s7c)
  # NVFP4 sign-split weight bytes (NV_PM), BF16 steady windows, and where a Q8_0 decode step goes now
  timeout 80 python3 bench/matvec_variants.py --formats nvfp4,bf16 2>&1 | tee $OUT/mv_s7c.log | grep -A12 "best per shape"
  BW24CHAT_NV_PM=1 timeout 70 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k NVFP4 2>&1 | tail -1 | sed "s/^/NV_PM=1 /" | tee $OUT/pytest_s7c.log
  BW24CHAT_MV_STEADY=1 timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k "BF16 or F16 or F32" 2>&1 | tail -1 | sed "s/^/MV_STEADY=1 /" | tee -a $OUT/pytest_s7c.log
  timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --profile 2>&1 | grep -v '^{' | tee $OUT/profile.log | tail -40
  BW24CHAT_NV_PM=1 timeout 40 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/NV_PM=1 /" | tee $OUT/bench_s7c.log
  BW24CHAT_PDL=0 timeout 40 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/PDL=0 /" | tee -a $OUT/bench_s7c.log
  ;;
fin7a)
  # seventh session, final call 1: steady-state windows adopted for Q8_0 / Q4_K (per-shape check), the full bench table
  timeout 90 python3 bench/matvec_variants.py --formats q8_0,q4_k 2>&1 | tee $OUT/mv_fin.log | grep -A12 "best per shape"
  timeout 400 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  ;;
fin7b)
  # seventh session, final call 2: every gate and kernel check, then the matvec GPU tests
  timeout 250 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16,f32 2>&1 | tee $OUT/check.log | grep -v "^PASS\|^  ok" | tail -30
  timeout 250 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py tests/gpu/test_ops_norm_rope.py 2>&1 | tail -4 | tee $OUT/pytest_fin.log
  ;;
s7b)
  # the integer-dot prologue in one L2 round trip (float4, registers), the o projection prefetched into L2 during attention
  timeout 120 python3 bench/matvec_variants.py --formats q8_0,q4_k,nvfp4 2>&1 | tee $OUT/mv_pro.log | grep -A20 "best per shape"
  for env in "X=1" "BW24CHAT_L2_PREFETCH=0"; do env $env timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0,q4_k,nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_s7b.log
  timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --decode-only 2>&1 | grep "tg128@[0-9]* " | tee -a $OUT/bench_s7b.log
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_ops_norm_rope.py tests/gpu/test_matvec.py -k "integer_dot or Q8_0 or Q4_K or NVFP4 or fused_norm_rope" 2>&1 | tail -4 | tee $OUT/pytest_s7b.log
  ;;
s7a)
  # seventh session: the integer-dot matvec on int8 tensor cores (matvec_imma) — tests, variants, decode
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py 2>&1 | grep -v "^\.\|^$" | tail -12 | tee $OUT/pytest_matvec.log
  grep -q " failed\| error" $OUT/pytest_matvec.log && echo "IMMA TESTS FAILED"
  timeout 200 python3 bench/matvec_variants.py --formats q8_0,q4_k,nvfp4 2>&1 | tee $OUT/mv_imma.log | grep -A40 "best per shape"
  timeout 150 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0,q4_k,nvfp4 --decode-only 2>&1 | grep "tg128@[0-9]* " | tee $OUT/bench_s7a.log
  ;;
s6g)
  # Q8_0 / Q4_K integer-dot matvec: 4 rows per warp (x reads shared by more rows), branch-free steady-state windows (MV_STEADY)
  timeout 120 python3 bench/matvec_variants.py --formats q8_0 2>&1 | tee $OUT/mv_r4.log | tail -40
  BW24CHAT_MV_STEADY=1 timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py 2>&1 | tail -2 | tee $OUT/pytest_steady.log
  BW24CHAT_MV_R=4 BW24CHAT_MV_MINB=1 timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k "integer_dot and (Q8_0 or Q4_K)" 2>&1 | tail -2 | tee $OUT/pytest_r4.log
  timeout 90 python3 bench/matvec_variants.py --formats q4_k 2>&1 | tee -a $OUT/mv_r4.log | tail -40
  ;;
s6f)
  # tensor-core decode attention at one block per SM per (row, kv head); Q8_0 matvec stall reasons for the next session
  timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_attention.py -k decode 2>&1 | grep -v "^\.\|^$" | tail -8 | tee $OUT/pytest_attn.log
  timeout 50 python3 bench/attn_probe.py --kv bf16 --lengths 512,2048,8192 --variants "default" 2>&1 | tee $OUT/attn_probe7.log
  timeout 150 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0,bf16 --decode-only 2>&1 | grep "tg128@[0-9]* " | tee $OUT/bench_s6f.log
  command -v ncu >/dev/null || export PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ | head -1)
  timeout 90 ncu --clock-control none --kernel-name regex:matvec --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis python3 bench/ncu_matvec.py --formats q8_0 --shapes qkv,o,down > $OUT/ncu_q8.txt 2>&1
  grep -E "launched|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall|stall|Eligible|L2 Hit|Mem Busy|Max Bandwidth" $OUT/ncu_q8.txt | head -90
  ;;
fin6a)
  # sixth session, final call 1: decode attention tests, attention variants, the full bench table
  timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_attention.py -k decode 2>&1 | grep -v "^\.\|^$" | tail -8 | tee $OUT/pytest_attn.log
  grep -q " failed\| error" $OUT/pytest_attn.log && export BW24CHAT_ATTN_TC=0 && echo "TC ATTENTION FAILED: FMA kernel from here on"
  timeout 60 python3 bench/attn_probe.py --kv bf16 --lengths 512,2048,8192 --variants "BW24CHAT_ATTN_TC=0;default;BW24CHAT_ATTN_SPLITS=16" 2>&1 | tee $OUT/attn_probe6.log
  timeout 330 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  BW24CHAT_ATTN_SPLITS=16 timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/splits16 /" | tee $OUT/bench_s16.log
  ;;
fin6b)
  # sixth session, final call 2: every gate and kernel check, the transformers reference
  timeout 240 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 --kv bf16,f32 2>&1 | tee $OUT/check.log | grep -v "^PASS\|^  ok" | tail -30
  timeout 170 python3 tools/device_reference.py /root/ref --big 2>&1 | tee $OUT/reference.log | tail -10
  ;;
s6e)
  # tensor-core decode attention with independent MMA chains
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_attention.py -k decode 2>&1 | grep -v "^\.\|^$" | tail -15 | tee $OUT/pytest_attn.log
  timeout 120 python3 bench/attn_probe.py --kv bf16 --lengths 1,512,2048,8192 --variants "default;BW24CHAT_ATTN_SPLITS=1;BW24CHAT_ATTN_SPLITS=16;BW24CHAT_ATTN_SPLITS=64" 2>&1 | tee $OUT/attn_probe5.log
  for env in "X=1" "BW24CHAT_ATTN_SPLITS=16"; do env $env timeout 150 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_attn.log
  ;;
s6d)
  # tensor-core decode attention with its first stages fetched before pdl_wait: correctness, the
  # merge's share (one split per head), decode step A/B
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_attention.py -k decode 2>&1 | grep -v "^\.\|^$" | tail -15 | tee $OUT/pytest_attn.log
  timeout 120 python3 bench/attn_probe.py --kv bf16 --lengths 512,2048,8192 --variants "default;BW24CHAT_ATTN_SPLITS=1;BW24CHAT_ATTN_SPLITS=2;BW24CHAT_ATTN_SPLITS=4;BW24CHAT_ATTN_SPLITS=16" 2>&1 | tee $OUT/attn_probe4.log
  for env in "BW24CHAT_ATTN_TC=0" "X=1" "BW24CHAT_ATTN_SPLITS=16"; do env $env timeout 150 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --decode-only 2>&1 | grep "tg128@[0-9]* " | sed "s/^/$env /"; done | tee $OUT/bench_attn.log
  ;;
s6c)
  # decode attention on tensor cores: correctness, then variants, then the decode step A/B
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_attention.py 2>&1 | grep -v "^\.\|^$" | tail -15 | tee $OUT/pytest_attn.log
  timeout 150 python3 bench/attn_probe.py --kv bf16 --lengths 1,512,2048,8192 --variants "BW24CHAT_ATTN_TC=0;default;BW24CHAT_ATTN_SPLITS=16;BW24CHAT_ATTN_SPLITS=8;BW24CHAT_ATTN_MIN_PER=2" 2>&1 | tee $OUT/attn_probe3.log
  for env in "BW24CHAT_ATTN_TC=0" "X=1"; do env $env timeout 150 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --decode-only 2>&1 | grep "tg128" | sed "s/^/$env /"; done | tee $OUT/bench_attn.log
  ;;
s6b)
  # decode attention: per-tile cost without splits, and Nsight Compute stall reasons
  timeout 120 python3 bench/attn_probe.py --kv bf16 --lengths 512,2048,8192 --variants "BW24CHAT_ATTN_SPLITS=1;BW24CHAT_ATTN_SPLITS=2;BW24CHAT_ATTN_SPLITS=4;default" 2>&1 | tee $OUT/attn_probe2.log
  command -v ncu >/dev/null || export PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ | head -1)
  timeout 200 ncu --clock-control none --kernel-name regex:attn_decode --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats python3 bench/attn_probe.py --ncu --kv bf16 --lengths 1,512,8192 --variants "default;BW24CHAT_ATTN_SPLITS=1" > $OUT/ncu_attn.txt 2>&1
  grep -E "launched|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Stall|stall|Eligible|Issued Warp|No Eligible|Dynamic Shared" $OUT/ncu_attn.txt | head -120
  ;;
s6a)
  # sixth session, first call: the review commit's untested pieces, then where decode attention time goes
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm.py tests/gpu/test_matvec.py -k "act_quant or rows_split" 2>&1 | tail -3 | tee $OUT/pytest_s6a.log
  timeout 150 python3 bench/attn_probe.py --kv bf16,q8_0 2>&1 | tee $OUT/attn_probe.log
  timeout 200 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0 --profile 2>&1 | grep -v '^{' | tee $OUT/profile.log
  ;;
wg)
  # the wgmma prefill GEMM: correctness first (both kernels); if gemm_wg fails, the rest runs mma
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm.py 2>&1 | grep -v "^\.\|^$" | tail -15 | tee $OUT/pytest_gemm.log
  grep -q " failed\| error" $OUT/pytest_gemm.log && export BW24CHAT_GEMM=mma && echo "WG FAILED: mma from here on"
  timeout 300 python3 bench/gemm_variants.py --check --formats "${GFORMATS:-bf16,q8_0,nvfp4}" 2>&1 | tee $OUT/gemm_variants.log | tail -60
  python3 -m bw24chat check --skip-kernels --formats bf16,q8_0 --kv bf16,f32 2>&1 | tee $OUT/check.log | grep -v "^PASS" | tail -12
  ;;
wgp)
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm.py 2>&1 | grep -v "^\.\|^$" | tail -15 | tee $OUT/pytest_gemm.log
  grep -q " failed\| error" $OUT/pytest_gemm.log && export BW24CHAT_WGP=0 && echo "WGP FAILED: register-staged wg from here on"
  timeout 300 python3 bench/gemm_variants.py --check --formats "${GFORMATS:-bf16,q8_0,nvfp4}" --variants "${GVARIANTS:-mma,wg n128,wgp n128 s3,wgp n128 s4,wgp n256 s3,wgp n256 s4}" 2>&1 | tee $OUT/gemm_variants.log | tail -12
  python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  ;;
wgp2)
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm.py 2>&1 | grep -v "^\.\|^$" | tail -8 | tee $OUT/pytest_gemm.log
  grep -q " failed\| error" $OUT/pytest_gemm.log && export BW24CHAT_WGP=0 && echo "WGP FAILED: register-staged wg from here on"
  timeout 150 python3 bench/gemm_variants.py --formats q8_0,nvfp4 --variants "mma,wg n128,wgp auto" 2>&1 | tee $OUT/gemm_variants.log | tail -9
  timeout 60 python3 bench/gemm_variants.py --formats bf16 --variants "wgp auto" 2>&1 | tee -a $OUT/gemm_variants.log | tail -3
  python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  timeout 200 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 2>&1 | tee $OUT/check.log | grep -v "^PASS\|^  ok" | tail -25
  ;;
pf)
  # where the quantized prefill time goes: default, PDL off, register-staged wg (prefill rows only)
  for env in "X=1" "BW24CHAT_PDL=0" "BW24CHAT_WGP=0"; do env $env python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q8_0 --prefill-only 2>&1 | grep "pp" | sed "s/^/$env /"; done | tee $OUT/pf.log
  timeout 120 python3 bench/gemm_variants.py --formats nvfp4 --variants "wg n128,wgp auto" 2>&1 | tail -3
  for f in tests/gpu/test_*.py; do [ $f = tests/gpu/test_gemm.py ] || timeout 150 python3 -m pytest -q -p no:cacheprovider $f 2>&1 | tail -2 | sed "s|^|$f: |"; done | tee $OUT/pytest_gpu.log
  ;;
last2)
  timeout 90 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 2>&1 | tee $OUT/check.log | grep -v "^PASS\|^  ok" | tail -8
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm.py 2>&1 | tail -2 | tee $OUT/pytest_gemm.log
  timeout 150 python3 tools/device_reference.py /root/ref --big 2>&1 | tee $OUT/reference.log | tail -8
  timeout 50 python3 -m bw24chat bench --synthetic qwen3-8b --weights q4_k --prefill-only 2>&1 | grep "pp" | grep -v test | tee $OUT/bench_q4k.log
  BW24CHAT_PORTABLE=1 timeout 60 python3 -m bw24chat check --skip-kernels --formats bf16,nvfp4 --kv bf16 2>&1 | tee $OUT/check_portable.log | tail -3
  ;;
part1)
  cat .carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-aa > $SMOL
  python3 -m bw24chat check 2>&1 | tee $OUT/check.log | grep -v "^  ok" | tail -60
  python3 -m bw24chat check --skip-kernels --synthetic smollm2-135m --formats q8_0,nvfp4 --kv f32,fp8,bf16,q8_0 2>&1 | tee $OUT/check_smol_shape.log | tail -30
  python3 -m bw24chat bench --synthetic qwen3-8b --weights "${WEIGHTS:-bf16,nvfp4}" --profile 2>&1 | grep -v '^{' | tee $OUT/profile.log
  ;;
part2)
  cat .carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-ab >> $SMOL
  sha256sum $SMOL | cut -c1-16
  python3 bench/device_smollm2.py $SMOL 2>&1 | tee $OUT/smollm2.log | tail -30
  python3 bench/serve_concurrency.py -m $SMOL --device cuda --streams 8 --max-tokens 128 2>&1 | tee $OUT/serve.log | tail -12
  for f in tests/gpu/test_*.py; do BW24CHAT_TEST_MODEL=$SMOL timeout 300 python3 -m pytest -q -x -p no:cacheprovider $f 2>&1 | tail -4; done | tee $OUT/pytest_gpu.log
  ;;
iter)
  for f in tests/gpu/test_matvec.py tests/gpu/test_attention.py tests/gpu/test_dequant_embed.py tests/gpu/test_gemm.py; do timeout 300 python3 -m pytest -q -p no:cacheprovider $f 2>&1 | grep -v "^\.\|^$" | tail -12; done | tee $OUT/pytest_gpu.log
  python3 -m bw24chat check --formats "${FORMATS:-bf16,q8_0,q4_k,q6_k,nvfp4,q4_1}" 2>&1 | tee $OUT/check.log | grep -v "^PASS" | tail -30
  python3 -m bw24chat bench --synthetic qwen3-8b --weights "${PWEIGHTS:-bf16,nvfp4,q4_k}" --profile 2>&1 | grep -v '^{' | tee $OUT/profile.log
  python3 -m bw24chat bench --synthetic qwen3-8b --weights "${WEIGHTS:-bf16,q8_0,q4_k,nvfp4}" --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  ;;
final)
  python3 -m bw24chat check --formats "${FORMATS:-bf16,q8_0,q4_k,nvfp4}" 2>&1 | tee $OUT/check.log | grep -v "^PASS" | tail -30
  grep "step over prefill" $OUT/check.log | head -20
  (timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention.py -k "decode"; timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "BF16 or Q8_0 or F32 or F16") 2>&1 | grep -v "^\.\|^$" | tail -8 | tee $OUT/pytest_gpu.log
  python3 -m bw24chat bench --synthetic qwen3-8b --weights "${WEIGHTS:-bf16,q8_0,q4_k,nvfp4}" --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --profile 2>&1 | grep -v '^{' | tee $OUT/profile.log
  python3 tools/device_reference.py /root/ref --big --long 2>&1 | tee $OUT/reference.log | tail -12
  ;;
tc)
  # NVFP4 on tensor cores: correctness first; if it fails, everything after runs the SIMT kernel
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "NVFP4" 2>&1 | tail -15 | tee $OUT/pytest_tc.log
  grep -q " failed" $OUT/pytest_tc.log && export BW24CHAT_MATVEC=simt && echo "TC FAILED: SIMT from here on"
  (timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "BF16 or Q8_0 or F16 or F32"; timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention.py -k "decode") 2>&1 | grep -v "^\.\|^$" | tail -6 | tee $OUT/pytest_gpu.log
  python3 -m bw24chat check --formats "${FORMATS:-bf16,q8_0,q4_k,nvfp4}" 2>&1 | tee $OUT/check.log | grep -v "^PASS" | tail -25
  grep "step over prefill" $OUT/check.log | head -16
  python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,nvfp4 --profile 2>&1 | grep -v '^{' | tee $OUT/profile.log | grep "matvec\|attn\|whole"
  BW24CHAT_MATVEC=simt python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --profile 2>&1 | grep -v '^{' | tee $OUT/profile_simt.log | grep "matvec\|whole"
  python3 -m bw24chat bench --synthetic qwen3-8b --weights "${WEIGHTS:-bf16,q8_0,q4_k,nvfp4}" --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  timeout 240 python3 tools/device_reference.py /root/ref --big --long 2>&1 | tee $OUT/reference.log | tail -12
  ;;
v1)
  cat .carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-aa > $SMOL
  timeout 200 python3 bench/matvec_variants.py --formats nvfp4,bf16 2>&1 | tee $OUT/variants.log | tail -14
  python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --profile 2>&1 | grep -v '^{' | tee $OUT/profile.log | grep "matvec\|whole" | head -7
  ;;
v2)
  cat .carry/SmolLM2-135M-Instruct.Q4_1.gguf/part-ab >> $SMOL
  sha256sum $SMOL | cut -c1-16
  python3 bench/device_smollm2.py $SMOL 2>&1 | tee $OUT/smollm2.log | tail -26
  python3 -m bw24chat check --skip-kernels --formats nvfp4,q4_k --kv bf16,f32 2>&1 | tee $OUT/check.log | tail -4
  ;;
fin)
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matvec.py -k "NVFP4" 2>&1 | tail -3 | tee $OUT/pytest_tc.log
  python3 -m bw24chat check --formats nvfp4 2>&1 | tee $OUT/check.log | grep -v "^PASS" | tail -8
  python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4 --profile 2>&1 | grep -v '^{' | tee $OUT/profile.log | grep "matvec\|attn\|whole" | head -8
  ;;
last)
  python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  timeout 60 python3 bench/matvec_variants.py --formats q4_k 2>&1 | tee $OUT/variants.log | tail -6
  ;;
pdl)
  # programmatic dependent launch: correctness under it first, then decode with it off / on
  BW24CHAT_PDL=1 timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k "swiglu or add_epilogue" 2>&1 | tail -2
  BW24CHAT_PDL=1 timeout 80 python3 -m bw24chat check --skip-kernels --formats bf16,nvfp4 --kv bf16,f32 2>&1 | tee $OUT/check.log | tail -3
  for pdl in 0 1; do BW24CHAT_PDL=$pdl python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,nvfp4 --decode-only --json $OUT/bench_pdl$pdl.json 2>&1 | grep "tg128" | sed "s/^/pdl=$pdl /" | tee -a $OUT/bench.log; done
  ;;
bench)
  python3 -m bw24chat bench --synthetic qwen3-8b --weights "${WEIGHTS:-bf16,q8_0,q4_k,nvfp4}" --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  ;;
floor)
  # what decode-sized kernels can reach (launch + streaming floors), then where matvec time goes (ncu)
  timeout 150 python3 bench/decode_floor.py 2>&1 | tee $OUT/floor.log
  command -v ncu >/dev/null || export PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ | head -1)
  NCU="ncu --clock-control none --kernel-name regex:matvec --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis"
  timeout 240 $NCU python3 bench/ncu_matvec.py --formats nvfp4,bf16 > $OUT/ncu_matvec.txt 2>&1
  grep -E "launched|matvec|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Stall|stall|Eligible" $OUT/ncu_matvec.txt | head -150
  ;;
mv)
  # persistent matvec kernels with a rolling load window: correctness, variants, decode, ncu
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py 2>&1 | tail -4 | tee $OUT/pytest_mv.log
  timeout 260 python3 bench/matvec_variants.py --formats ${MVF:-nvfp4,bf16,q8_0} 2>&1 | tee $OUT/variants.log | grep -A40 "best per shape"
  python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --decode-only --json $OUT/bench.json 2>&1 | grep "tg128" | tee $OUT/bench.log
  command -v ncu >/dev/null || export PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ | head -1)
  timeout 120 ncu --clock-control none --kernel-name regex:matvec --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats python3 bench/ncu_matvec.py --formats nvfp4,bf16 --shapes qkv,gate\|up,down > $OUT/ncu_mv.txt 2>&1
  grep -E "^  matvec|DRAM Throughput|Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued" $OUT/ncu_mv.txt | head -60
  ;;
mv2)
  # BF16 / F16 decode on tensor cores (matvec_tc): correctness, variants, gates, decode, profile
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py 2>&1 | tail -4 | tee $OUT/pytest_mv.log
  timeout 150 python3 bench/matvec_variants.py --formats ${MVF:-bf16,q8_0} 2>&1 | tee $OUT/variants.log | grep -A40 "best per shape"
  timeout 200 python3 -m bw24chat check --skip-kernels --formats bf16,f16 --kv bf16,f32 2>&1 | tee $OUT/check.log | grep -v "^PASS" | tail -12
  python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --decode-only --json $OUT/bench.json 2>&1 | grep "tg128" | grep -v '"test"' | tee $OUT/bench.log
  python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --profile 2>&1 | grep -v '^{' | tee $OUT/profile.log | tail -22
  ;;
x3)
  # BF16: SIMT at 3 blocks/SM vs tensor cores; NVFP4 16-warp tiles; PDL with the matvecs' late trigger
  timeout 200 python3 bench/matvec_variants.py --formats bf16,nvfp4 2>&1 | tee $OUT/variants.log | grep -A12 "best per shape"
  BW24CHAT_PDL=1 timeout 100 python3 -m bw24chat check --skip-kernels --formats bf16,nvfp4 --kv bf16,f32 2>&1 | tee $OUT/check_pdl.log | tail -2
  for env in "BW24CHAT_MATVEC=simt BW24CHAT_MV_MINB=3" "BW24CHAT_TC_NW=8" "BW24CHAT_PDL=1 BW24CHAT_MATVEC=simt BW24CHAT_MV_MINB=3"; do
    env $env python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | sed "s/^/$env: /" | tee -a $OUT/bench.log; done
  for pdl in 0 1; do BW24CHAT_PDL=$pdl python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q4_k,q8_0 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | sed "s/^/pdl=$pdl /" | tee -a $OUT/bench.log; done
  ;;
final2)
  # the session's final configuration: correctness first, then the bench table, reference, experiments
  timeout 130 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py -k "BF16 or F16 or NVFP4 or persistent or F32" 2>&1 | tail -2 | tee $OUT/pytest_mv.log
  timeout 150 python3 -m bw24chat check --formats bf16,q8_0,q4_k,nvfp4 2>&1 | tee $OUT/check.log | grep -v "^PASS" | tail -14
  timeout 200 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --json $OUT/bench.json 2>&1 | grep -v '^ \|^{\|^}' | tee $OUT/bench.log
  timeout 170 python3 tools/device_reference.py /root/ref --big 2>&1 | tee $OUT/reference.log | tail -8
  for pdl in 1 notc; do BW24CHAT_PDL=$pdl timeout 60 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,nvfp4 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | sed "s/^/pdl=$pdl /" | tee -a $OUT/bench_x.log; done
  for mp in 2 4; do BW24CHAT_ATTN_MIN_PER=$mp timeout 45 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16 --decode-only 2>&1 | grep "tg128@512 \|tg128@8192 " | sed "s/^/attn_min_per=$mp /" | tee -a $OUT/bench_x.log; done
  ;;
a8)
  # integer-dot (A8) decode: correctness, kernel variants against the float paths, decode + prefill
  timeout 230 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py tests/gpu/test_gemm.py -k "integer_dot or act_quant or (m_invariant and (Q8_0 or Q4_K or NVFP4 or Q6_K)) or (matches_reference and (Q8_0 or NVFP4 or Q4_K))" 2>&1 | tail -6 | tee $OUT/pytest.log
  timeout 150 python3 bench/matvec_variants.py --formats ${MVF:-q8_0,q4_k,nvfp4} 2>&1 | tee $OUT/variants.log | grep -A20 "best per shape"
  timeout 120 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0,q4_k,nvfp4 --decode-only 2>&1 | grep "tg128" | grep -v '"test"' | tee $OUT/bench.log
  timeout 60 env BW24CHAT_A8=none python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q8_0 --decode-only 2>&1 | grep "tg128@" | grep -v '"test"' | sed "s/^/a8=none /" | tee -a $OUT/bench.log
  timeout 100 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0,nvfp4,q4_k --prefill-only 2>&1 | grep "pp" | grep -v '"test"' | tee -a $OUT/bench.log
  ;;
a8b)
  # prefill cost of the integer-dot contract (probe), its gates, and prefill A8 on/off in one run
  timeout 120 python3 bench/prefill_probe.py --formats q8_0,nvfp4 2>&1 | tee $OUT/probe.log
  timeout 240 python3 -m bw24chat check --formats q8_0,q4_k,nvfp4 --kv bf16,f32 2>&1 | tee $OUT/check.log | grep -v "^PASS" | tail -30
  for a8 in "" none; do BW24CHAT_A8=$a8 timeout 80 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q8_0 --prefill-only 2>&1 | grep "pp512" | grep -v '"test"' | sed "s/^/a8=${a8:-on} /" | tee -a $OUT/bench.log; done
  ;;
a8c)
  # where prefill and decode part under the integer-dot contract; K-quant gates; prefill launches
  timeout 150 python3 tools/diag_prefill_decode.py q8_0,nvfp4,q4_k 2>&1 | tee $OUT/diag.log
  timeout 100 python3 -m bw24chat check --skip-kernels --formats q5_k,q6_k --kv bf16,f32 2>&1 | tee $OUT/check.log | grep -v "^PASS" | tail -12
  timeout 200 python3 -m bw24chat bench --synthetic qwen3-8b --weights bf16,q8_0,q4_k,nvfp4 --prefill-only 2>&1 | grep "pp" | grep -v '"test"' | tee -a $OUT/bench.log
  ;;
diag)
  for env in "X=1" "BW24CHAT_PDL=0" "BW24CHAT_A8=none" "BW24CHAT_MV_U=2 BW24CHAT_MV_MINB=2"; do echo "== $env"; env $env timeout 60 python3 tools/diag_prefill_decode.py q8_0,nvfp4 --n 48 2>&1 | grep -v "^  layer 0"; done
  echo "== eager"; timeout 60 python3 tools/diag_prefill_decode.py q8_0,nvfp4 --n 48 --eager 2>&1 | grep -v "^  layer 0"
  ;;
diag2)
  timeout 100 python3 tools/diag_prefill_decode.py q8_0,nvfp4,q4_k --n 16 2>&1 | grep -v "layer"
  ;;
a16)
  # the two-level integer-dot contract: kernels, gates, matvec variants
  timeout 250 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matvec.py tests/gpu/test_gemm.py -k "integer_dot or act_quant or (m_invariant and (Q8_0 or Q4_K or Q6_K or NVFP4 or Q4_1)) or (matches_reference and (Q8_0 or Q4_K or NVFP4 or BF16)) or swiglu_epilogue or persistent" 2>&1 | tail -4 | tee $OUT/pytest.log
  timeout 200 python3 -m bw24chat check --formats bf16,q8_0,q4_k,q6_k,nvfp4 --kv bf16,f32 2>&1 | tee $OUT/check.log | grep -v "^PASS" | tail -12
  timeout 120 python3 bench/matvec_variants.py --formats q8_0,q4_k,nvfp4 2>&1 | tee $OUT/variants.log | grep -A16 "best per shape"
  ;;
fin5)
  # the session's final configuration: NVFP4 gates under the integer dot, decode and prefill rows
  timeout 45 python3 -m bw24chat check --skip-kernels --formats nvfp4 --kv f32 2>&1 | tee $OUT/check_nvfp4.log | grep -v "^PASS" | tail -4
  timeout 110 python3 -m bw24chat bench --synthetic qwen3-8b --weights q8_0,q4_k,nvfp4 --decode-only --json $OUT/bench_dec.json 2>&1 | grep "tg128@\|copy" | grep -v '"test"' | tee $OUT/bench.log
  timeout 70 python3 -m bw24chat bench --synthetic qwen3-8b --weights nvfp4,q8_0 --prefill-only 2>&1 | grep "pp512" | grep -v '"test"' | tee -a $OUT/bench.log
  ;;
esac
