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

from bench.client import root_url
from bench.redaction import redact_obj

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


def _slot_count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


async def discover_server(client: httpx.AsyncClient, base: str) -> dict[str, Any]:
    """Probe ``/v1/models``, ``/props`` (llama.cpp), ``/version`` (vLLM), ``/get_model_info`` (SGLang).

    Returns ``{"models": [{"id", "owned_by", "context_size"}], "backend": str | None, "context_size": int | None,
    "routes": [names that answered], "version": str | None}``, plus ``"model_meta"`` when the server describes its
    model (llama.cpp's ``/v1/models`` ``meta``: ``n_params``, ``size`` in bytes, ``n_embd``, ``n_vocab``,
    ``n_ctx_train``; read by :mod:`bench.measure.roofline`); ``slots`` is the number of requests the server decodes at once
    where it says so (llama.cpp ``/props`` ``total_slots``, else the length of its ``/slots`` list), else None.
    """
    root = root_url(base)
    info: dict[str, Any] = {"models": [], "backend": None, "context_size": None, "routes": [], "version": None,
                            "slots": None}
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
    if info["backend"] == "llama.cpp" and not _slot_count(info.get("slots")):
        slots = await _get_json(client, f"{root}/slots")
        if isinstance(slots, list) and slots and all(isinstance(x, dict) for x in slots):
            info["routes"].append("slots")
            info["slots"] = len(slots)
    info["slots"] = _slot_count(info.get("slots"))
    if isinstance(version, dict) and "version" in version:
        info["routes"].append("version")
        info["version"] = info["version"] or version.get("version")
    if isinstance(sgl, dict) and "model_path" in sgl:
        info["routes"].append("get_model_info")
        info["backend"] = info["backend"] or "sglang"
    info["context_size"] = _positive_int(ctx)
    info.update(await server_extras(client, root))
    return dict(redact_obj(info))


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
