"""What bench learns about a server: its models, a guess of the backend, its context size, its extra routes.

Everything here is best effort and read-only: a route that fails is simply absent from the result.
"""

from __future__ import annotations

from typing import Any

import httpx

from .client import root_url

__all__ = ["discover_server", "server_extras", "slots_summary", "sglang_summary"]

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


async def discover_server(client: httpx.AsyncClient, base: str) -> dict[str, Any]:
    """Probe ``/v1/models``, ``/props`` (llama.cpp), ``/version`` (vLLM), ``/get_model_info`` (SGLang).

    Returns ``{"models": [{"id", "owned_by", "context_size"}], "backend": str | None, "context_size": int | None,
    "routes": [names that answered], "version": str | None}``.
    """
    root = root_url(base)
    info: dict[str, Any] = {"models": [], "backend": None, "context_size": None, "routes": [], "version": None}
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
    version = await _get_json(client, f"{root}/version")
    if isinstance(version, dict) and "version" in version:
        info["routes"].append("version")
        info["version"] = info["version"] or version.get("version")
    sgl = await _get_json(client, f"{root}/get_model_info")
    if isinstance(sgl, dict) and "model_path" in sgl:
        info["routes"].append("get_model_info")
        info["backend"] = info["backend"] or "sglang"
    info["context_size"] = int(ctx) if isinstance(ctx, (int, float)) else None
    info.update(await server_extras(client, root))
    return info


def slots_summary(slots: Any) -> dict[str, Any] | None:
    """What llama.cpp's ``GET /slots`` says (a list of slots), or None for anything else: ``slots`` (count),
    ``slot_ctx`` (context per slot), ``slots_processing`` (busy now), ``speculative`` (a draft model or other
    speculative decoding is set up for the slot)."""
    if not isinstance(slots, list) or not slots or not all(isinstance(x, dict) for x in slots):
        return None
    busy = sum(1 for x in slots if x.get("is_processing") or x.get("state") == 1)
    out: dict[str, Any] = {"slots": len(slots), "slot_ctx": slots[0].get("n_ctx"), "slots_processing": busy}
    if isinstance(slots[0].get("speculative"), bool):
        out["speculative"] = slots[0]["speculative"]
    return out


def sglang_summary(d: Any) -> dict[str, Any] | None:
    """What SGLang's ``GET /get_server_info`` says, or None for anything else: ``prefix_cache`` (radix cache on),
    ``speculative`` (the algorithm or None), ``max_running_requests``, ``metrics_enabled``, ``context_length`` and
    ``spec_accept_length`` (the scheduler's running average, present with speculative decoding)."""
    if not isinstance(d, dict) or not ("disable_radix_cache" in d or "internal_states" in d):
        return None
    out: dict[str, Any] = {
        "prefix_cache": (not d["disable_radix_cache"]) if isinstance(d.get("disable_radix_cache"), bool) else None,
        "speculative": d.get("speculative_algorithm"),
        "max_running_requests": d.get("max_running_requests"),
        "metrics_enabled": d.get("enable_metrics"),
        "context_length": d.get("context_length"),
    }
    states = d.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        acc = states[0].get("avg_spec_accept_length")
        if isinstance(acc, (int, float)):
            out["spec_accept_length"] = float(acc)
    return out


async def server_extras(client: httpx.AsyncClient, root: str) -> dict[str, Any]:
    """llama.cpp ``/slots`` and SGLang ``/get_server_info``: what they add to the server description
    (``{"slots_info": {...}}`` and/or ``{"sglang_info": {...}}``; keys defined by :func:`slots_summary` and
    :func:`sglang_summary`); empty when neither answers."""
    out: dict[str, Any] = {}
    slots = slots_summary(await _get_json(client, f"{root}/slots"))
    if slots is not None:
        out["slots_info"] = slots
    sgl = sglang_summary(await _get_json(client, f"{root}/get_server_info"))
    if sgl is not None:
        out["sglang_info"] = sgl
    return out
