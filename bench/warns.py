"""The closed set of warnings bench gives: each kind names its cause and its cure (docs/warnings.md).

Every warning bench stores (``warnings`` of a run, a cell, an open-loop point) or prints as ``warning`` is made
here, from a :class:`Kind` of :data:`KINDS`::

    text = warning("requests-failed", "d0-s1-prose", failed=3, total=40, errors=counts({"http_5xx": 3}))
    # 'd0-s1-prose: 3 of 40 requests failed (http_5xx 3); ...'
    kind_of(text)   # -> "requests-failed"

A warning is a line of text (results.json keeps ``warnings: [str]``); :func:`kind_of` reads its kind back. With
``BENCH_STRICT_WARNINGS=1`` in the environment (the tests set it) a document holding a warning of no known kind is
refused when it is written (:func:`check_document`), so a new warning cannot bypass the set.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

__all__ = ["Kind", "KINDS", "warning", "counts", "in_cell", "kind_of", "unknown_warnings", "check_document"]


@dataclass(frozen=True)
class Kind:
    """One kind of warning: ``cause`` (what happened and what it does to the figures) and ``cure`` (what to do:
    a flag, a number, a server setting, or why nothing needs doing). Both are ``str.format`` templates over the
    fields the caller passes; the warning reads ``cause; cure``."""

    code: str
    cause: str
    cure: str

    def render(self, fields: Mapping[str, Any]) -> str:
        return f"{self.cause.format(**fields)}; {self.cure.format(**fields)}"

    @property
    def pattern(self) -> re.Pattern[str]:
        return _pattern(f"{self.cause}; {self.cure}")


_LAG = "timestamps lag by up to {p99:.1f} ms (p99 event-loop lag; max {max:.1f} ms): {what}"

KINDS: tuple[Kind, ...] = (
    # -- the client: is bench itself keeping up? --
    Kind("client-lag", _LAG, "use --workers {n}"),
    Kind("client-lag-busy-host", _LAG,
         "with {streams} stream(s) for {workers} reading process(es) more workers cannot help: the machine is busy "
         "(bench shares its cores with other work: run bench where it has a core of its own; a server on this host, "
         "once given fewer threads, leaves it one)"),
    Kind("reads-lagged",
         "bench's reads lagged {lag:.1f} ms (p99) behind arrival with {who}, over the {budget:.1f} ms "
         "budget (half the gap between events): events may be read together and slow the server",
         "rerun with --workers {n} (or --workers auto)"),
    Kind("client-cpu", "bench's client used {cpu:.0f} % of a CPU core while measuring: its timestamps may lag",
         "use --workers {n} (see benchmarks/results/fidelity.md)"),
    Kind("behind-schedule",
         "bench fell behind its schedule: {late} of {total} requests started over {over:g} ms late (dispatch lag "
         "p99 {lag:.1f} ms; sent {achieved} of {planned} req/s planned): {who} did not get the CPU in time",
         "send from more processes (--workers {n}, if the machine has the cores), or lower --rate"),
    Kind("concurrency-capped",
         "--max-concurrency {cap} held requests back: {late} of {total} waited over {over:g} ms for a slot (send "
         "lag p99 {lag:.1f} ms; sent {achieved} of {planned} req/s planned), so the point measured a lower rate "
         "than asked and its latencies from schedule hold that wait",
         "raise --max-concurrency (or leave it out) to measure the planned rate, or lower --rate to what the cap "
         "lets through"),
    # -- requests that failed or ended early --
    Kind("requests-failed", "{failed} of {total} requests failed ({errors})",
         "the figures are over the others; records.jsonl has each error, `bench probe URL` shows one request"),
    Kind("all-failed", "every request failed ({kinds}): the cell has no figures",
         "run `bench probe URL` to see one request's error"),
    Kind("stopped-early",
         "{n} request(s) stopped before {limit} (the server ended them early: an EOS, a stop string or its own "
         "limit): the figures hold shorter outputs than planned",
         "a server that honours ignore_eos / min_tokens runs them to the end; else check its own output limit "
         "(llama-server -n, vLLM --max-model-len)"),
    Kind("cut-in-flight",
         "{n} requests were still in flight {drain:g} s after the last send and were cut (counted as failures)",
         "raise --drain to wait for them"),
    Kind("interrupted-point",
         "interrupted: {ended} of {planned} planned requests ended ({cut} cut in flight): the figures are over "
         "those, with no steady-state window or schedule figures", "run the point again for full figures"),
    Kind("interrupted-setup",
         "interrupted before the first measured request (while the endpoint was being set up)",
         "nothing was measured: run again"),
    Kind("node-lost",
         "Ray node {node} ({ip}) was lost mid-run: {cut} of its requests in flight or not yet sent were cut, its "
         "{kept} finished in that wave kept; {left} actor(s) took the later waves",
         "check the node (ray status) and run again for a full run"),
    Kind("tool-calls-missing",
         "{missing} of {forced} request(s) forced to call a tool answered without a tool call",
         "does the server parse tool calls? vLLM: --enable-auto-tool-choice --tool-call-parser"),
    # -- what the numbers measure --
    Kind("overhead-dominates",
         "fixed overhead is {share:.0%} of TTFT: prompt tok/s here mostly measures overhead",
         "use a deeper prompt: --depths"),
    Kind("outside-server-timing",
         "{gap:.0f} ms of the {ttft:.0f} ms TTFT is outside the server's own prompt timing (tokenizing, queueing, "
         "or llama.cpp's host prompt cache)", "start llama-server with --cache-ram 0 to measure prefill alone"),
    Kind("prompt-size-miss", "server counted prompts up to {miss:.1f} % away from {target} tokens",
         "prompt sizes are estimates where the server has no /tokenize (results.json: run.tokenizer); a server "
         "with /tokenize (llama-server, vLLM, SGLang) sizes them exactly"),
    Kind("prefix-cached",
         "the server reports cached prompt tokens beyond the template header ({header}) in {n} request(s), up to "
         "{most}: prompts share a cached prefix, so prefill is partly not measured",
         "start the server with prefix caching off (vLLM --no-enable-prefix-caching, SGLang --disable-radix-cache, "
         "llama.cpp --cache-reuse 0)"),
    Kind("prefix-cache-hits",
         "the server served {rate:.0%} of prompt tokens{tokens} from its prefix cache in a run meant to defeat it: "
         "TTFT and prompt tok/s measure a warm cache",
         "start the server with prefix caching off (vLLM --no-enable-prefix-caching, SGLang --disable-radix-cache, "
         "llama.cpp --cache-reuse 0) or make the prompts unique"),
    Kind("no-usage", "the server sent no usage: output tokens are estimated",
         "a server that honours stream_options.include_usage counts them exactly (vLLM, SGLang, llama-server do)"),
    Kind("token-count-mismatch",
         "the server generated {server} tokens, bench counted {mine:.0f} ({diff:+.1f} %): likely {cause}",
         "run against a server no one else uses, or fix failures first (see errors)"),
    Kind("wide-ci",
         "the 95 % CI of median {metric} is +-{half:.1f} %, wider than target_ci = {target:g} after {waves} waves "
         "(waves spread {spread:.1f} %)", "{fix}"),
    Kind("slots-exceeded",
         "{streams} streams but the server has {slots} slots: {waiting} request(s) of each wave wait for a free "
         "slot, so per-stream decode and TTFT include queueing",
         "use at most {slots} streams (--streams) or give the server {streams} slots (llama-server -np {streams})"),
    Kind("queueing-seen",
         "{queued} of {requests} requests got their first token only after another request of their wave had "
         "finished (TTFT in steps of about {step:.0f} ms): the server seems to run about {slots} of the {streams} "
         "streams at once (slots) and queue the rest",
         "use at most {slots} streams (--streams) or raise the server's concurrency"),
    Kind("not-steady",
         "not in a steady state: TTFT and requests in flight kept rising over the window (the server is saturated "
         "at this load)", "lower --rate"),
    Kind("scraper-stopped",
         "the /metrics scraper stopped during the cell ({error}): its series cover the scrapes before that and the "
         "one at the cell's end", "check that the server's /metrics answers (`bench check URL` shows it)"),
    # -- the endpoint: what bench had to work around --
    Kind("fields-rejected",
         "server rejected min_tokens/ignore_eos ({error}): retrying without them, so output lengths are what the "
         "model produced", "no action needed: each cell reports its own output lengths"),
    Kind("thinking-fixed",
         "server rejected chat_template_kwargs ({error}): thinking cannot be disabled on it",
         "read the figures as with thinking on, or serve a chat template that takes enable_thinking"),
    Kind("no-calibration",
         "cannot calibrate prompt length (no usage.prompt_tokens): {error}",
         "prompt sizes assume 4 characters per token; a server with /tokenize or usage sizes them"),
    Kind("calibration-implausible",
         "the server counted {short} and {long} prompt tokens for two probes {chars} characters apart ({cpt}): "
         "its usage.prompt_tokens does not follow the prompt, so prompt sizes assume 4 characters per "
         "token", "input sizes and depths are rough here; a server with /tokenize or a counting usage sizes them"),
    Kind("prompt-sizes-estimated",
         "prompt lengths calibrated at {cpt:.2f} chars/token from two probes: an estimate (the server has no "
         "working /tokenize)", "a server with /tokenize (llama-server, vLLM, SGLang) sizes prompts exactly"),
    Kind("tokenize-failed", "/tokenize failed{when} ({error}): prompt lengths are now {how}",
         "depths are estimates from here on: check the server's /tokenize"),
    Kind("closing-probes-failed", "the closing overhead probes failed ({error}): drift not measured",
         "no action needed for this run's figures; a gate baseline without drift is checked less (docs/gate.md)"),
    Kind("resumed",
         "resumed run {run}: {kept} of its {total} cell(s) kept, {left} measured now",
         "no action needed: the kept cells were measured earlier, with the same flags on the same endpoint"),
    Kind("resumed-nothing-kept",
         "resumed run {run}: none of its {total} cell(s) had finished, so all are measured now (the finished "
         "requests of a cell cut short are not reused: a cell is measured whole)",
         "no action needed"),
    Kind("roofline-no-size", "roofline: the server reports no model size",
         "add --model-params N --weight-bits B for the limits"),
    Kind("roofline-size-mismatch",
         "roofline: the flags give {flags:.3g}B parameters per token, the server reports {server:.3g}B "
         "(n_params): the limits use the flags", "check --model-params (for an MoE, {moe})"),
    Kind("prefill-not-measured", "prefill not measured: {reason}", "{fix}"),
    Kind("insecure-tls",
         "--insecure: the server's TLS certificate is not verified, so anyone on the network path can read the API "
         "key and the answers", "give --ca-bundle FILE to trust a private CA instead"),
    Kind("api-key-unset",
         "--api-key-env {name}: that environment variable is not set (or is empty), so no API key is sent",
         "export {name}=<key> in this shell, or name the variable that holds the key (a server that needs none: "
         "leave --api-key-env out)"),
    # -- comparisons (gate, compare, ab) --
    Kind("step-summary-unwritable", "cannot append the report to $GITHUB_STEP_SUMMARY ({error})",
         "the verdicts and the exit code stand; point GITHUB_STEP_SUMMARY at a writable file"),
    Kind("not-comparable", "--force: compared although the runs differ ({difference})",
         "the verdicts compare unlike runs: measure both with the same profile, model and server, to their end"),
    Kind("cell-not-covered", "cell {cell} is only in {which}: no rule can check it",
         "add the cell to the baseline (measure it again with the candidate's profile)"),
    Kind("host-load-changed",
         "other work on this host kept {base:.2f} cores busy during the baseline and {cand:.2f} during this run, "
         "beside a server on this host: its speed moves with such load, so the verdicts may be the machine's, not "
         "the change's ({then})",
         "run the baseline and the gate on an otherwise quiet machine, or compare live with bench ab (waves "
         "alternated)"),
    Kind("gpu-clock-moved",
         "{where}: {what} clock p50 {base:.0f} MHz in the baseline, {cand:.0f} MHz in the candidate ({pct:+.1f} %, "
         "beyond {limit:g} %): the GPUs ran at other clocks, so a speed difference may be theirs, not the change's",
         "check power limit, clock cap and temperature (docs/gpu-telemetry.md)"),
    Kind("gpu-throttle-moved",
         "{where}: throttled (power cap, thermal or hardware slowdown) in {cand:.0%} of the candidate's samples "
         "against {base:.0%} of the baseline's (beyond {limit:.0%}): a speed difference may be the GPUs', not the "
         "change's", "check power limit, cooling and clocks (docs/gpu-telemetry.md)"),
)

_BY_CODE = {k.code: k for k in KINDS}


def warning(code: str, cell: str | None = None, /, **fields: Any) -> str:
    """The text of a warning of kind ``code``, its templates filled from ``fields``; ``cell`` (a cell or point id)
    goes in front as ``cell: ``. Raises KeyError on a code that is not in :data:`KINDS`."""
    text = _BY_CODE[code].render(fields)
    return f"{cell}: {text}" if cell else text


def counts(by_kind: Mapping[str, int]) -> str:
    """Counts by kind as words for a warning, most first: ``cancelled 3, http_5xx 1`` (never a Python dict's
    ``{'cancelled': 3}``)."""
    return ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0])))


@cache
def _pattern(template: str) -> re.Pattern[str]:
    parts = []
    for literal, field, _spec, _conv in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(".*?")
    return re.compile(r"(?:[^\s:]+: )?" + "".join(parts), re.DOTALL)


def in_cell(cell: str, text: str) -> str:
    """A warning made without its cell (:func:`bench.session.loop_lag.lag_warning`'s) put under ``cell``."""
    return f"{cell}: {text}"


def kind_of(text: str) -> str | None:
    """The code of the kind a warning's text is of (the first whose templates match it whole), else None."""
    for k in KINDS:
        if k.pattern.fullmatch(text):
            return k.code
    return None


def unknown_warnings(texts: Iterable[str]) -> list[str]:
    """The texts that are of no kind in :data:`KINDS` (empty when every one is)."""
    return [t for t in texts if kind_of(t) is None]


def _document_warnings(doc: Mapping[str, Any]) -> list[str]:
    out = [str(w) for w in doc.get("warnings") or []]
    for key in ("cells", "points"):
        for part in doc.get(key) or []:
            if isinstance(part, Mapping):
                out += [str(w) for w in part.get("warnings") or []]
    return out


def check_document(doc: Mapping[str, Any]) -> None:
    """With ``BENCH_STRICT_WARNINGS=1``: raise ValueError when the document (results, capacity) holds a warning of
    no known kind. Without it: nothing (a user's run is never refused for its wording)."""
    if os.environ.get("BENCH_STRICT_WARNINGS") != "1":
        return
    bad = unknown_warnings(_document_warnings(doc))
    if bad:
        raise ValueError(f"warning(s) of no kind in bench.warns.KINDS: {bad}")
