"""What bench learns about a server: its models, a guess of the backend, its context size, its extra routes.

Everything here is best effort and read-only: a route that fails, answers garbage or does not answer within the
client's setup timeout (``ClientSettings.setup_timeout_s``) is simply absent from the result. The optional routes
are asked at the same time, so a server that never answers costs one setup timeout, not four. What the server said
is redacted of the API key (:func:`bench.redaction.redact_obj`) before it is returned.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx

from .client import root_url
from .redaction import redact_obj

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
_META_KEYS = ("n_params", "size", "n_embd", "n_vocab", "n_ctx_train")


async def _get_json(client: httpx.AsyncClient, url: str) -> Any:
    try:
        r = await client.get(url, headers={"Accept": "application/json"})
        if r.status_code == 200:
            return r.json()
    except (httpx.HTTPError, ValueError, RecursionError):
        pass
    return None


def _positive_int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None
    return int(v)


async def discover_server(client: httpx.AsyncClient, base: str) -> dict[str, Any]:
    """Probe ``/v1/models``, ``/props`` (llama.cpp), ``/version`` (vLLM), ``/get_model_info`` (SGLang).

    Returns ``{"models": [{"id", "owned_by", "context_size"}], "backend": str | None, "context_size": int | None,
    "routes": [names that answered], "version": str | None}``, plus ``"model_meta"`` when the server describes its
    model (llama.cpp's ``/v1/models`` ``meta``: ``n_params``, ``size`` in bytes, ``n_embd``, ``n_vocab``,
    ``n_ctx_train``; read by :mod:`bench.roofline`).
    """
    root = root_url(base)
    info: dict[str, Any] = {"models": [], "backend": None, "context_size": None, "routes": [], "version": None}
    models, props, version, sgl = await asyncio.gather(
        _get_json(client, f"{base}/models"), _get_json(client, f"{root}/props"),
        _get_json(client, f"{root}/version"), _get_json(client, f"{root}/get_model_info"))
    ctx = None
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        info["routes"].append("models")
        for m in models["data"]:
            if not isinstance(m, dict):
                continue
            meta = m.get("meta") or {}
            c = m.get("max_model_len") or m.get("context_length") or (meta.get("n_ctx") if isinstance(meta, dict) else None)
            info["models"].append({"id": m.get("id"), "owned_by": m.get("owned_by"), "context_size": c})
            if isinstance(meta, dict) and "model_meta" not in info:
                mm = {k: meta[k] for k in _META_KEYS if isinstance(meta.get(k), (int, float))}
                if mm:
                    info["model_meta"] = mm
            ctx = ctx or c
        owner = str((info["models"][0].get("owned_by") if info["models"] else "") or "").lower()
        info["backend"] = _OWNER_BACKEND.get(owner, owner or None)
    if isinstance(props, dict) and ("default_generation_settings" in props or "total_slots" in props):
        info["routes"].append("props")
        info["backend"] = info["backend"] or "llama.cpp"
        dgs = props.get("default_generation_settings") or {}
        n_ctx = dgs.get("n_ctx") if isinstance(dgs, dict) else None
        ctx = n_ctx or ctx
        info["slots"] = props.get("total_slots")
        info["version"] = props.get("build_info")
    if isinstance(version, dict) and "version" in version:
        info["routes"].append("version")
        info["version"] = info["version"] or version.get("version")
    if isinstance(sgl, dict) and "model_path" in sgl:
        info["routes"].append("get_model_info")
        info["backend"] = info["backend"] or "sglang"
    info["context_size"] = _positive_int(ctx)
    return dict(redact_obj(info))
