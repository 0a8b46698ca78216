"""``bench probe``: the body of one probe request and the honest reading of its prefill figure.

Every probe starts with a unique prefix (:func:`bench.prompts.unique_prefix` of a fresh id), as ``bench run``'s
requests do, so a second probe is not served from the server's prefix cache and its prefill figure measures prompt
processing. A unique prefix cannot keep a chat template's fixed header (the first ~20 tokens of every chat prompt
on llama.cpp) out of the cache, so on llama.cpp a unique probe also sends ``"cache_prompt": false`` and the whole
prompt is processed (``cached_tokens`` 0). With ``same_prompt`` the prompt is sent as given; the server may then serve it from its cache, so the
probe reports the cached tokens and marks prefill as not measured (``prefill_measured: false``, and
``prefill_tok_s`` is withheld). Pure; the CLI sends the request and prints.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from bench.client.images import ImageSet
from bench.config.plan import BodyOptions, request_body
from bench.config.profile import Profile
from bench.config.tools import load_tools, tool_choice_value
from bench.prompts import unique_prefix
from bench.warns import warning

__all__ = ["PROBE_PROMPT", "PROBE_COMPLETION_PROMPT", "ProbeWorkload", "probe_body", "probe_report",
           "probe_workload"]


@dataclass(frozen=True)
class ProbeWorkload:
    """What a probe carries besides its prompt: images, tools and the thinking switch (None: not sent)."""

    images: ImageSet | None = None
    opts: BodyOptions = BodyOptions(force_length=False, template_kwargs=False)


def probe_workload(endpoint_kind: str, overrides: dict[str, Any], thinking: str | None) -> ProbeWorkload:
    """The probe's workload from the workload flags (``bench.cli.common.workload_overrides``), checked as a
    profile's are. Raises ConfigError naming the flag."""
    p = Profile(name="probe", endpoint=endpoint_kind).with_overrides(**overrides)
    tools = load_tools(p.tools)
    opts = BodyOptions(endpoint_kind, force_length=False, template_kwargs=thinking is not None,
                       thinking=thinking == "on", tools=tools, tool_choice=tool_choice_value(p.tool_choice, tools))
    w, _, h = p.image_size.partition("x")
    images = ImageSet(p.images, int(w), int(h), p.image_format, p.image_source) if p.images else None
    return ProbeWorkload(images, opts)

PROBE_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
PROBE_COMPLETION_PROMPT = "The lighthouse keeper climbed the stairs at dusk, and as the lamp came alive he saw"


def probe_body(endpoint_kind: str, prompt_text: str | None, max_tokens: int, *, same_prompt: bool = False,
               probe_id: str | None = None, backend: str | None = None,
               work: ProbeWorkload | None = None) -> dict[str, Any]:
    """The JSON body of a probe (without ``model``/``stream``, which the client adds).

    ``endpoint_kind`` is ``chat`` (one user message) or ``completions``; ``prompt_text`` defaults to
    :data:`PROBE_PROMPT` / :data:`PROBE_COMPLETION_PROMPT`. Unless ``same_prompt``, the text starts with
    ``unique_prefix(probe_id, 0)`` (``probe_id`` defaults to a fresh random id) and, for ``backend``
    ``"llama.cpp"`` (``bench.server.info.discover_server``), ``cache_prompt`` is false.
    """
    default = PROBE_PROMPT if endpoint_kind == "chat" else PROBE_COMPLETION_PROMPT
    text = prompt_text or default
    probe_id = probe_id or uuid.uuid4().hex[:8]
    if not same_prompt:
        text = unique_prefix(probe_id, 0) + text
    work = work or ProbeWorkload()
    urls = work.images.urls(probe_id) if work.images is not None else []
    body = request_body(replace(work.opts, endpoint=endpoint_kind), text, max_tokens, image_urls=urls)
    if not same_prompt and backend == "llama.cpp":
        body["cache_prompt"] = False  # llama.cpp's own field: not even the template header from the cache
    return body


def probe_report(metrics: dict[str, Any], *, same_prompt: bool,
                 default_prompt: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The probe's metrics (``RequestMetrics.to_dict()``) with the prefill verdict, and warnings to print.

    Adds ``same_prompt``, ``unique_prefix`` and ``prefill_measured``. Prefill is not measured when the prompt was
    the same as before (``same_prompt``: any earlier probe may have filled the cache) or when the server reports
    more than half of the prompt as cached; then ``prefill_tok_s`` is set to None, ``prefill_not_measured`` says
    why and a warning names the cached tokens. ``cached_tokens`` is always present (0 when the server says none).
    A prefill figure from TTFT (``prefill_source`` "ttft", not the server's own) follows ``bench run``'s rule:
    withheld for the short default prompt (``default_prompt``: as run's depth 0; no warning, it is the default) or
    any prompt under :data:`SHORT_PROMPT_TOKENS`,
    else kept with ``prefill_lower_bound`` true (TTFT holds the request's overhead and the first decode step).
    ``prefill_note`` says either in words, printed as the table's "prefill from".
    """
    d = dict(metrics)
    cached = int(d.get("cached_tokens") or 0)
    prompt = d.get("prompt_tokens") or 0
    d["cached_tokens"] = cached
    d["same_prompt"] = same_prompt
    d["unique_prefix"] = not same_prompt
    reason = fix = None
    if same_prompt:
        reason = (f"--same-prompt: the prompt may be served from the server's prefix cache "
                  f"({cached} of {prompt} prompt tokens reported cached)")
        fix = "drop --same-prompt to give the probe a unique prefix"
    elif prompt and cached * 2 > prompt:
        reason = f"{cached} of {prompt} prompt tokens were served from the server's prefix cache"
        fix = "a longer --prompt puts more uncached tokens behind the unique prefix"
    d["prefill_measured"] = reason is None
    warnings = []
    if reason is not None:
        d["prefill_not_measured"] = reason
        d["prefill_tok_s"] = None
        warnings.append(warning("prefill-not-measured", reason=reason, fix=fix))
    elif d.get("prefill_source") == "ttft" and d.get("prefill_tok_s") is not None:
        _ttft_prefill(d, prompt, default_prompt)
    return d, warnings


SHORT_PROMPT_TOKENS = 256
"""A TTFT-derived prefill figure of a prompt shorter than this is withheld: its TTFT is mostly the request's
overhead and the first decode step (15 tokens read 493 tok/s against the sim's 5,000)."""


def _ttft_prefill(d: dict[str, Any], prompt: int, default_prompt: bool) -> None:
    """A prefill figure from TTFT: withheld for the default prompt or any prompt under :data:`SHORT_PROMPT_TOKENS`,
    else marked a lower bound (:func:`probe_report`)."""
    if default_prompt or prompt < SHORT_PROMPT_TOKENS:
        which = "the default prompt" if default_prompt else "the prompt"
        d["prefill_measured"] = False
        d["prefill_tok_s"] = None
        d["prefill_not_measured"] = (f"{which} ({prompt} tokens) is too short: its TTFT is mostly the "
                                     "request's overhead and the first decode step, not prefill (bench run shows "
                                     "no prompt tok/s at depth 0 either)")
        d["prefill_note"] = (f"ttft: not shown, {which} is too short"
                             + (" (give --prompt)" if default_prompt else f" (under {SHORT_PROMPT_TOKENS} tokens)"))
    else:
        d["prefill_lower_bound"] = True
        d["prefill_note"] = "ttft: a lower bound (overhead and first decode step included)"
