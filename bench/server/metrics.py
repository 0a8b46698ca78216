"""What the server saw during a cell: its Prometheus ``/metrics`` page scraped before, during and after the cell.

Pages are parsed with ``prometheus_client``'s text parser; :mod:`bench.server.metric_names` says which series carry what.
Per cell (docs/server-metrics.md defines every key):

* counters -> deltas over the cell (prompt and generation tokens, requests, preemptions, prefix-cache hits and
  queries -> hit rate, speculative drafts, drafted and accepted tokens -> acceptance rate, mean accepted length).
  A counter that goes down between two scrapes was reset (server restart): the count after the reset is added.
  Label sets (engines, finish reasons, cache sources) are summed.
* gauges -> one value per scrape (the series is kept) and its max and mean (KV-cache use %, running, waiting).
* histograms -> bucket deltas -> the server's own TTFT, inter-token, queue and end-to-end percentiles.

Use::

    scraper = await detect_metrics(client, root)   # None: no /metrics page bench understands
    await scraper.begin()                          # before the cell's measured waves
    ...
    cell["server_metrics"] = await scraper.end()   # after them

:func:`cross_checks` compares a summary with bench's own cell summary (pure; warnings name cause and fix).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.client import root_url
from bench.server.info import sglang_summary, slots_summary
from bench.server.metric_names import (
    BACKENDS,
    COUNTER_KEYS,
    HISTOGRAM_KEYS,
    QUERIES_ARE_PROMPT_PLUS_HITS,
    Series,
    backend_of_names,
)
from bench.warns import warning

__all__ = ["Page", "Snapshot", "parse_page", "summarize_snapshots", "MetricsScraper", "detect_metrics",
           "page_from", "available_keys", "spec_from_timings", "table_fields", "TABLE_FIELDS", "cross_checks", "cross_check_notes", "TOKEN_MISMATCH_WARN_PCT", "PREFIX_HIT_WARN_RATE", "histogram_quantile",
           "histogram_bucket", "counters_beside"]

TOKEN_MISMATCH_WARN_PCT = 1.0
PREFIX_HIT_WARN_RATE = 0.05
SERIES_MAX_POINTS = 600  # gauge points kept per cell (1 s interval: 10 minutes); the summaries use every scrape

LabelKey = tuple[tuple[str, str], ...]
# series name (no final _total) -> [(labels, value)]
Page = dict[str, list[tuple[LabelKey, float]]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape: ``t_s`` on ``time.monotonic()`` and the parsed page."""

    t_s: float
    page: Page


def _base(name: str) -> str:
    return name[:-6] if name.endswith("_total") else name


def parse_page(text: str) -> Page:
    """Parse a Prometheus text page into ``{name without _total: [(labels, value)]}``; ``*_created`` dropped.

    Raises ValueError when the text is not the Prometheus text format.
    """
    page: Page = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            v = float(s.value)
            if math.isnan(v):
                continue
            page.setdefault(_base(s.name), []).append((tuple(sorted(s.labels.items())), v))
    return page


def _first(page: Page, table: dict[str, tuple[Series, ...]], key: str) -> Series | None:
    for s in table.get(key, ()):
        probe = s.name + ("_bucket" if s.kind == "histogram" else "_sum" if s.kind == "hist_sum"
                          else "_count" if s.kind == "hist_count" else "")
        if probe in page:
            return s
    return None


def _sample_name(s: Series) -> str:
    return s.name + {"hist_sum": "_sum", "hist_count": "_count"}.get(s.kind, "")


def _counter_delta(snaps: Sequence[Snapshot], name: str) -> float:
    """Sum over label sets of each series' rise across the scrapes; a drop is a reset (the new value counts)."""
    total = 0.0
    prev: dict[LabelKey, float] = {}
    for i, snap in enumerate(snaps):
        for labels, v in snap.page.get(name, ()):
            if labels in prev:
                p = prev[labels]
                total += v - p if v >= p else v
            elif i > 0:
                total += v  # a label set that appeared during the cell started from 0
            prev[labels] = v
    return total


def _gauge_at(page: Page, s: Series) -> float | None:
    vals = [v for _, v in page.get(s.name, ())]
    if not vals:
        return None
    return (max(vals) if s.agg == "max" else sum(vals)) * s.scale


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (0..1) from cumulative ``(upper bound, count)`` buckets, linear within a bucket.

    A quantile that falls in the ``+Inf`` bucket is the last finite bound (the histogram says no more).
    """
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lo_b, lo_c = 0.0, 0.0
    for b, c in buckets:
        if c >= rank:
            if math.isinf(b):
                return lo_b
            if c == lo_c:
                return b
            return lo_b + (b - lo_b) * (rank - lo_c) / (c - lo_c)
        lo_b, lo_c = (b if not math.isinf(b) else lo_b), c
    return lo_b


def _histogram_delta(snaps: Sequence[Snapshot], base: str) -> dict[str, Any] | None:
    """Bucket, sum and count deltas over the cell, label sets other than ``le`` summed."""
    last = snaps[-1].page
    if base + "_bucket" not in last:
        return None
    by_le: dict[float, float] = {}
    les = {dict(lab).get("le", "+Inf") for lab, _ in last.get(base + "_bucket", ())}
    for le in les:
        sub = [Snapshot(s.t_s, {"b": [(lab, v) for lab, v in s.page.get(base + "_bucket", ())
                                     if dict(lab).get("le") == le]}) for s in snaps]
        by_le[float(le)] = _counter_delta(sub, "b")
    count = _counter_delta(snaps, base + "_count")
    ssum = _counter_delta(snaps, base + "_sum")
    buckets = sorted(by_le.items())
    return {"count": count, "sum": ssum, "buckets": buckets}


def histogram_bucket(q: float, buckets: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """The ``(lower, upper)`` bounds of the bucket that holds the ``q`` quantile (upper inf for the ``+Inf`` bucket):
    what the server's histogram knows of that quantile; None when it is empty."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    lo = 0.0
    for b, c in buckets:
        if c >= q * total:
            return lo, b
        lo = b
    return None


def _hist_summary(key: str, h: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {f"server_{key}_count": int(round(h["count"]))}
    if h["count"] > 0:
        mean = h["sum"] / h["count"]
        out[f"server_{key}_ms_mean"] = round(mean * 1000, 3)
        for q in (50, 90, 99):
            v = histogram_quantile(q / 100, h["buckets"])
            if v is not None:  # Markov: a duration's q quantile is at most mean / (1 - q), whatever the buckets
                out[f"server_{key}_ms_p{q}"] = round(min(v, max(mean, 0.0) / (1 - q / 100)) * 1000, 3)
        b = histogram_bucket(0.5, h["buckets"])
        if b is not None and not math.isinf(b[1]):
            out[f"server_{key}_ms_p50_bucket"] = [round(b[0] * 1000, 3), round(b[1] * 1000, 3)]
    return out


def _gauges(snaps: Sequence[Snapshot], table: dict[str, tuple[Series, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    series: dict[str, list[list[float]]] = {}
    t0 = snaps[0].t_s
    for key in table:
        s = table[key][0] if table[key][0].kind == "gauge" else None
        if s is None:
            continue
        pts: list[tuple[float, float]] = []
        for snap in snaps:
            chosen = _first(snap.page, table, key)
            v = _gauge_at(snap.page, chosen) if chosen is not None else None
            if v is not None:
                pts.append((snap.t_s - t0, v))
        if not pts:
            continue
        name = key.removesuffix("_gauge")
        vals = [v for _, v in pts]
        out[f"{name}_max"] = round(max(vals), 4)
        out[f"{name}_mean"] = round(sum(vals) / len(vals), 4)
        series[name] = [[round(t, 3), round(v, 4)] for t, v in pts[-SERIES_MAX_POINTS:]]
    out["gauge_series"] = series
    return out


def _ratios(out: dict[str, Any]) -> None:
    q, h = out.get("prefix_cache_queries"), out.get("prefix_cache_hits")
    if q and h is not None:
        out["prefix_cache_hit_rate"] = round(h / q, 4)
    elif "prefix_cache_hit_rate_max" in out:
        out["prefix_cache_hit_rate"] = out["prefix_cache_hit_rate_mean"]
    dt, acc, nd = out.get("spec_draft_tokens"), out.get("spec_accepted_tokens"), out.get("spec_drafts")
    if dt and acc is not None:
        out["spec_acceptance_rate"] = round(acc / dt, 4)
    elif "spec_accept_rate_mean" in out:
        out["spec_acceptance_rate"] = out["spec_accept_rate_mean"]
    if nd and acc is not None:
        out["spec_mean_accepted_length"] = round(1 + acc / nd, 4)  # tokens per verify step: accepted + 1 bonus
    elif "spec_accept_length_mean" in out:
        out["spec_mean_accepted_length"] = out["spec_accept_length_mean"]


def summarize_snapshots(backend: str, snaps: Sequence[Snapshot]) -> dict[str, Any]:
    """The ``server_metrics`` dict of one cell from its scrapes (first = before the cell, last = after). Pure.

    A key is absent when the server did not expose what it needs (docs/server-metrics.md lists the keys).
    """
    table = BACKENDS["vllm" if backend == "bench-sim" else backend]
    out: dict[str, Any] = {"backend": backend, "scrapes": len(snaps)}
    if len(snaps) < 2:
        return out
    out["window_s"] = round(snaps[-1].t_s - snaps[0].t_s, 3)
    last = snaps[-1].page
    for key in COUNTER_KEYS:
        s = _first(last, table, key)
        if s is not None:
            out[key] = int(round(_counter_delta(snaps, _sample_name(s))))
    if backend in QUERIES_ARE_PROMPT_PLUS_HITS and "prefix_cache_hits" in out and "prompt_tokens" in out:
        out["prefix_cache_queries"] = out["prompt_tokens"] + out["prefix_cache_hits"]
    out.update(_gauges(snaps, table))
    for key in HISTOGRAM_KEYS:
        s = _first(last, table, key)
        h = _histogram_delta(snaps, s.name) if s is not None else None
        if h is not None:
            out.update(_hist_summary(key, h))
    _ratios(out)
    return out


async def _fetch(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        r = await client.get(url, headers={"Accept": "text/plain"}, timeout=10.0)
    except httpx.HTTPError:
        return None
    if r.status_code != 200 or "html" in r.headers.get("content-type", ""):
        return None
    return r.text


class MetricsScraper:
    """Scrapes one server's ``/metrics`` page around a cell: :meth:`begin`, then :meth:`end` -> the summary.

    Between the two, an asyncio task scrapes every ``interval_s`` (the gauge series). A scrape that fails is
    skipped: the summary is built from those that answered (``scrapes`` says how many).
    """

    def __init__(self, client: httpx.AsyncClient, url: str, backend: str, interval_s: float = 1.0,
                 source: str = "metrics") -> None:
        self.client = client
        self.url = url
        self.backend = backend
        self.interval_s = interval_s
        self.source = source
        self._snaps: list[Snapshot] = []
        self._task: asyncio.Task[None] | None = None
        self.crashed: str | None = None  # why the interval task died during the cell, if it did

    async def scrape(self) -> Snapshot | None:
        """One scrape, appended to the cell's snapshots; None when the page did not come or did not parse."""
        text = await _fetch(self.client, self.url)
        t = time.monotonic()
        page = page_from(self.source, text) if text is not None else None
        if page is None:
            return None
        snap = Snapshot(t, page)
        self._snaps.append(snap)
        return snap

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.scrape()

    async def begin(self) -> None:
        """Start a cell: scrape once (the baseline) and start the interval task."""
        await self.stop()
        self._snaps = []
        self.crashed = None
        await self.scrape()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="bench-metrics-scrape")

    async def stop(self) -> None:
        """Stop the interval task (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception as e:  # noqa: BLE001 - a scrape that broke the task loses the series, never the run
                self.crashed = f"{type(e).__name__}: {e}"

    async def end(self) -> dict[str, Any]:
        """End the cell: stop the task, scrape once more, and return the cell's ``server_metrics`` dict."""
        await self.stop()
        await self.scrape()
        out = summarize_snapshots(self.backend, self._snaps)
        out["source"] = self.source
        if self.crashed is not None:
            out["scraper_error"] = self.crashed
        return out


def available_keys(page: Page, backend: str) -> list[str]:
    """bench's names (:mod:`bench.server.metric_names`) that ``page`` carries for ``backend``, in table order."""
    table = BACKENDS.get("vllm" if backend == "bench-sim" else backend, {})
    return [k for k in table if _first(page, table, k) is not None]


def backend_of_page(page: Page) -> str | None:
    """The backend that wrote a page (bench's sim says ``bench-sim``; it speaks vLLM's names)."""
    if any(n.startswith("bench_sim:") for n in page):
        return "bench-sim"
    return backend_of_names(set(page))


def page_from(source: str, text: str) -> Page | None:
    """A page from what a route answered: ``/metrics`` text, or the JSON of llama.cpp's ``/slots`` (busy slots ->
    ``llamacpp:requests_processing``) or SGLang's ``/get_server_info`` (``sglang:spec_accept_length``), the
    stand-ins where metrics are off. None when it does not parse."""
    if source == "metrics":
        try:
            return parse_page(text)
        except ValueError:
            return None
    try:
        d = json.loads(text)
    except ValueError:
        return None
    if source == "slots":
        info = slots_summary(d)
        return {"llamacpp:requests_processing": [((), float(info["slots_processing"]))]} if info else None
    info = sglang_summary(d)
    if info is None:
        return None
    acc = info.get("spec_accept_length")
    return {"sglang:spec_accept_length": [((), acc)]} if acc is not None else {}


async def detect_metrics(client: httpx.AsyncClient, base_root: str, interval_s: float = 1.0) -> MetricsScraper | None:
    """A scraper for the server at ``base_root`` (root or ``.../v1``), or None when nothing answers.

    Tried in order: ``/metrics`` with a page of a known backend (vLLM, SGLang, TGI, llama.cpp, bench's sim);
    where metrics are off, llama.cpp's ``/slots`` (running requests only) and SGLang's ``/get_server_info`` (the
    speculative accept length only). The summary's ``source`` says which.
    """
    root = root_url(base_root.rstrip("/"))
    text = await _fetch(client, root + "/metrics")
    page = page_from("metrics", text) if text is not None else None
    backend = backend_of_page(page) if page is not None else None
    if backend:
        return MetricsScraper(client, root + "/metrics", backend, interval_s)
    for source, route, name in (("slots", "/slots", "llama.cpp"), ("get_server_info", "/get_server_info", "sglang")):
        text = await _fetch(client, root + route)
        if text is not None and page_from(source, text) is not None:
            return MetricsScraper(client, root + route, name, interval_s, source)
    return None


def spec_from_timings(records: Sequence[Any]) -> dict[str, Any] | None:
    """Speculative decoding as llama-server reports it per response (``timings.draft_n``, ``draft_n_accepted``),
    summed over the successful records of a cell: ``{"draft_tokens", "accepted_tokens", "acceptance_rate"}``, or
    None when no record carries it. Pure."""
    drafted = accepted = 0
    seen = False
    for r in records:
        t = getattr(r, "timings", None)
        if not getattr(r, "ok", False) or not isinstance(t, dict) or "draft_n" not in t:
            continue
        seen = True
        drafted += int(t.get("draft_n") or 0)
        accepted += int(t.get("draft_n_accepted") or 0)
    if not seen:
        return None
    rate = round(accepted / drafted, 4) if drafted else None
    return {"draft_tokens": drafted, "accepted_tokens": accepted, "acceptance_rate": rate}


# columns a cell's row may show (terminal table, CSV, Markdown): (server_metrics key, header)
TABLE_FIELDS: tuple[tuple[str, str], ...] = (
    ("kv_cache_usage_pct_max", "KV % max"),
    ("requests_waiting_max", "waiting max"),
    ("spec_acceptance_rate", "accept rate"),
)


def table_fields(server_metrics: dict[str, Any] | None) -> dict[str, float]:
    """``{header: value}`` of :data:`TABLE_FIELDS` present in a cell's ``server_metrics`` (absent: not shown)."""
    sm = server_metrics or {}
    return {h: sm[k] for k, h in TABLE_FIELDS if isinstance(sm.get(k), (int, float))}


def _bench_output_tokens(cell: dict[str, Any]) -> float | None:
    if isinstance(cell.get("output_tokens_total"), (int, float)):
        return float(cell["output_tokens_total"])
    ot = cell.get("output_tokens")
    if isinstance(ot, dict) and ot.get("n") and ot.get("mean") is not None:
        return float(ot["n"]) * float(ot["mean"])
    return None


def _failed_can_explain(server: float, mine: float, cell: dict[str, Any]) -> bool:
    """True when the server's surplus fits in what the cell's failed or cut requests could have generated (each at
    most ``max_tokens``): bench keeps no tokens of a request it cut, the server counted what it had written."""
    failed, cap = cell.get("requests_failed") or 0, cell.get("max_tokens")
    return bool(failed) and isinstance(cap, (int, float)) and 0 < server - mine <= failed * cap


def _token_check(sm: dict[str, Any], cell: dict[str, Any], cid: str) -> list[str]:
    server, mine = sm.get("generation_tokens"), _bench_output_tokens(cell)
    if server is None or mine is None or mine <= 0:
        return []
    diff = (server - mine) / mine * 100
    if abs(diff) <= TOKEN_MISMATCH_WARN_PCT or _failed_can_explain(server, mine, cell):
        return []
    failed = cell.get("requests_failed") or 0
    cause = (f"{failed} failed request(s) generated tokens bench does not count" if failed and diff > 0 else
             "another client used the server during the cell" if diff > 0 else
             "the server's counter lags its responses or counts per engine only")
    return [warning("token-count-mismatch", cid, server=server, mine=mine, diff=diff, cause=cause)]


def cross_checks(server_metrics: dict[str, Any], cell_summary: dict[str, Any],
                 prefix_cache_expected: bool, expected_hits: int = 0) -> list[str]:
    """Warnings from comparing what the server counted with what bench measured in one cell. Pure.

    * generated tokens differ by more than :data:`TOKEN_MISMATCH_WARN_PCT` % -> warning, unless the server's surplus
      fits in what the cell's failed or cut requests could have generated (``max_tokens`` each: their own
      warnings already tell);
    * prefix-cache hits over :data:`PREFIX_HIT_WARN_RATE` of prompt tokens in a cell meant to defeat the cache
      (``prefix_cache_expected`` False) and whose prompts are longer than the shortest (depth > 0: at depth 0 the
      chat template's shared header alone is a large share), beyond ``expected_hits`` (the hits the shared header
      explains: its tokens times the requests sent; needs the server's hit and query counts) -> warning: the
      numbers measure a warm cache.

    The TTFT comparison is a note, not a warning: :func:`cross_check_notes`.
    """
    cid = str(cell_summary.get("id", "cell"))
    out = _token_check(server_metrics, cell_summary, cid)
    hits = server_metrics.get("prefix_cache_hits")
    rate = server_metrics.get("prefix_cache_hit_rate")
    depth = cell_summary.get("depth") or 0
    queries = server_metrics.get("prefix_cache_queries")
    if expected_hits and hits is not None and queries:
        rate = (hits - expected_hits) / queries  # the share beyond the template's header
    if not prefix_cache_expected and depth > 0 and rate is not None and rate > PREFIX_HIT_WARN_RATE:
        n = f" ({hits} tokens)" if hits is not None else ""
        out.append(warning("prefix-cache-hits", cid, rate=rate, tokens=n))
    return out


def cross_check_notes(server_metrics: dict[str, Any], cell_summary: dict[str, Any]) -> list[str]:
    """Notes (never warnings) for one cell: bench's TTFT p50 beside the server's; the difference is network,
    HTTP and client time (the server's figure is interpolated within its histogram buckets). Pure."""
    cid = str(cell_summary.get("id", "cell"))
    st = server_metrics.get("server_ttft_ms_p50")
    bt = cell_summary.get("ttft_ms")
    b50 = bt.get("median") if isinstance(bt, dict) else None
    if st is None or b50 is None:
        return []
    lo, hi = server_metrics.get("server_ttft_ms_p50_bucket") or (None, None)
    if lo is not None and hi is not None and lo < b50 <= hi:
        return [f"{cid}: TTFT p50 {b50:.1f} ms at bench, {st:.1f} ms at the server, whose histogram puts it in "
                f"({lo:g}, {hi:g}] ms with bench's: the difference is within the bucket, not measured"]
    return [f"{cid}: TTFT p50 {b50:.1f} ms at bench, {st:.1f} ms at the server: {b50 - st:+.1f} ms is network, "
            "HTTP and client"]


def counters_beside(server_metrics: dict[str, Any], view: dict[str, Any], *,
                    prefix_cache_expected: bool, expected_hits: int = 0) -> tuple[dict[str, Any], list[str]]:
    """The server's counters over one cell or open-loop point beside bench's figures ``view`` (its summary, with
    ``output_tokens_total`` of its successful requests): the copy to store (TTFT notes added, :func:`cross_check_notes`)
    and the warnings (a scraper that stopped; :func:`cross_checks`, unless the counters cover some waves only:
    ``partial``). Pure."""
    sm = dict(server_metrics)
    cid = str(view.get("id", "cell"))
    warns = [warning("scraper-stopped", cid, error=sm["scraper_error"])] if sm.get("scraper_error") else []
    if not sm.get("partial"):  # counters of some waves only (ab, re-measured gate cells): nothing to compare
        warns += cross_checks(sm, view, prefix_cache_expected=prefix_cache_expected, expected_hits=expected_hits)
    notes = cross_check_notes(sm, view)
    if notes:
        sm["notes"] = notes
    return sm, warns
