"""What bench learns about a server: its models, a guess of the backend, its context size, its extra routes.

Everything here is best effort and read-only: a route that fails is simply absent from the result.
"""

from __future__ import annotations

from typing import Any

import httpx

from .client import root_url

__all__ = ["discover_server"]

_OWNER_BACKEND = {
    "llamacpp": "llama.cpp",
    "vllm": "vllm",
    "sglang": "sglang",
    "tgi": "tgi",
    "library": "ollama",
    "ollama": "ollama",
    "bench-sim": "bench-sim",
    "openai": "openai",
    "system": "openai",
}


async def _get_json(client: httpx.AsyncClient, url: str) -> Any:
    try:
        r = await client.get(url, headers={"Accept": "application/json"}, timeout=10.0)
        if r.status_code == 200:
            return r.json()
    except (httpx.HTTPError, ValueError):
        pass
    return None


def _slot_count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


async def discover_server(client: httpx.AsyncClient, base: str) -> dict[str, Any]:
    """Probe ``/v1/models``, ``/props`` (llama.cpp), ``/version`` (vLLM), ``/get_model_info`` (SGLang).

    Returns ``{"models": [{"id", "owned_by", "context_size"}], "backend": str | None, "context_size": int | None,
    "routes": [names that answered], "version": str | None, "slots": int | None}``; ``slots`` is the number of
    requests the server decodes at once where it says so (llama.cpp ``/props`` ``total_slots``, else the length of
    its ``/slots`` list), else None.
    """
    root = root_url(base)
    info: dict[str, Any] = {"models": [], "backend": None, "context_size": None, "routes": [], "version": None,
                            "slots": None}
    models = await _get_json(client, f"{base}/models")
    ctx = None
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        info["routes"].append("models")
        for m in models["data"]:
            if not isinstance(m, dict):
                continue
            meta = m.get("meta") or {}
            c = m.get("max_model_len") or m.get("context_length") or (meta.get("n_ctx") if isinstance(meta, dict) else None)
            info["models"].append({"id": m.get("id"), "owned_by": m.get("owned_by"), "context_size": c})
            ctx = ctx or c
        owner = str((info["models"][0].get("owned_by") if info["models"] else "") or "").lower()
        info["backend"] = _OWNER_BACKEND.get(owner, owner or None)
    props = await _get_json(client, f"{root}/props")
    if isinstance(props, dict) and ("default_generation_settings" in props or "total_slots" in props):
        info["routes"].append("props")
        info["backend"] = info["backend"] or "llama.cpp"
        dgs = props.get("default_generation_settings") or {}
        n_ctx = dgs.get("n_ctx") if isinstance(dgs, dict) else None
        ctx = n_ctx or ctx
        info["slots"] = props.get("total_slots")
        info["version"] = props.get("build_info")
    if info["backend"] == "llama.cpp" and not _slot_count(info.get("slots")):
        slots = await _get_json(client, f"{root}/slots")
        if isinstance(slots, list) and slots and all(isinstance(x, dict) for x in slots):
            info["routes"].append("slots")
            info["slots"] = len(slots)
    info["slots"] = _slot_count(info.get("slots"))
    version = await _get_json(client, f"{root}/version")
    if isinstance(version, dict) and "version" in version:
        info["routes"].append("version")
        info["version"] = info["version"] or version.get("version")
    sgl = await _get_json(client, f"{root}/get_model_info")
    if isinstance(sgl, dict) and "model_path" in sgl:
        info["routes"].append("get_model_info")
        info["backend"] = info["backend"] or "sglang"
    info["context_size"] = int(ctx) if isinstance(ctx, (int, float)) else None
    return info
