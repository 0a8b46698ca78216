"""bench side by side with peer tools, against one ``bench sim`` configuration whose truth is known.

    python3 -m venv /tmp/peers-venv && /tmp/peers-venv/bin/pip install guidellm llama-benchy aiperf
    python benchmarks/peers.py                          # --venv /tmp/peers-venv; writes benchmarks/results/peers.md
    python benchmarks/peers.py --streams 1,4 --tools bench,llama-benchy

The peers live in their own virtual environment (``--venv``), never in bench's: a peer whose command is not
there is reported as missing, with the line that installs it. For every stream count and every tool the script
starts a fresh sim (``python -m bench.sim --port 0``, its own process), runs the tool as a child process with the
same workload (chat, ``--prompt-tokens`` prompt tokens, ``--output-tokens`` output tokens, N concurrent streams,
``max(8, 2 N)`` measured requests, no warm-up where the tool allows it), reads what the tool reports, reads the
sim's own ``/metrics`` for what actually ran, and stops the sim. CPU is the tool process tree's user + system
time (``getrusage(RUSAGE_CHILDREN)`` around the child; the sim is not reaped until after), start-up included.

Truth (docs/sim.md): per-stream decode = 1000 / decode_step_ms tok/s at any stream count (the step time does not
depend on the batch here); aggregate = streams x that in steady state; TTFT of a request alone =
prompt / prefill_tok_s + one step. With several streams a request that arrives while a step runs waits for the
next step boundary, so TTFT lies between that and one step more; the sim's own mean TTFT (arrival -> first
token write, its clock, from /metrics; bench's one probe request subtracted) is shown for each run.

No tool here may reach the HuggingFace hub (this machine reaches PyPI only), so the script builds a local
tokenizer (``tokenizers`` WordLevel + whitespace split: exactly the sim's own tokenization, one token per run of
non-space characters) from bench's prose text, the sim's output words and Faker's lorem words, and serves
bench's prose text over a local HTTP port as llama-benchy's "book". What each peer needed is in docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import platform
import resource
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simproc import SimProcess  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from bench.sim import SimConfig, expected_ttft_ms  # noqa: E402
from bench.sim.text import WORDS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "peers.md"
PROSE = ROOT / "bench" / "prompts" / "data" / "prose.txt"
MODEL = "bench-sim"
PEERS = {"guidellm": "guidellm", "llama-benchy": "llama-benchy", "aiperf": "aiperf"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"}

TOKENIZER_BUILDER = r"""
import json, os, re, sys
from tokenizers import Tokenizer, models, pre_tokenizers
out, files = sys.argv[1], sys.argv[2:]
words = set()
for path in files:
    with open(path, encoding="utf-8") as f:
        words.update(re.findall(r"\S+", f.read()))
try:  # the words guidellm's synthetic text is made of
    from faker.providers.lorem.en_US import Provider
    for w in Provider.word_list:
        words.update((w, w.capitalize(), w + ".", w.capitalize() + "."))
except ImportError:
    pass
vocab = {"[UNK]": 0}
for w in sorted(words):
    vocab.setdefault(w, len(vocab))
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
os.makedirs(out, exist_ok=True)
tok.save(os.path.join(out, "tokenizer.json"))
# no special tokens declared: a decoded "[UNK]" stays in the text (one token for the sim too)
with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1000000,
               "clean_up_tokenization_spaces": False}, f)
print(len(vocab))
"""


# ---------------------------------------------------------------------------------------------------------------
# the sim, the book server
# ---------------------------------------------------------------------------------------------------------------
def start_sim(cfg: SimConfig) -> SimProcess:
    """The sim of one run, in its own process, with ``cfg``'s timing."""
    return SimProcess(decode_step_ms=cfg.decode_step_ms, prefill_tok_s=cfg.prefill_tok_s,
                      max_running=cfg.max_running, tokens_per_event=cfg.tokens_per_event, model=cfg.model)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a: Any) -> None:
        pass


def serve_dir(path: Path) -> tuple[socketserver.TCPServer, str]:
    """Serve ``path`` on a free loopback port (a thread); returns the server and its root URL."""
    handler = lambda *a, **k: _Quiet(*a, directory=str(path), **k)  # noqa: E731
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


# ---------------------------------------------------------------------------------------------------------------
# one run of one tool
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Run:
    tool: str
    streams: int
    requests: int
    status: str = "ok"  # ok | missing | failed
    note: str = ""
    per_stream: float | None = None  # decode tok/s per stream, as the tool reports it (see notes)
    aggregate: float | None = None  # tok/s over all streams, as the tool reports it
    ttft_ms: float | None = None  # mean TTFT the tool reports
    cpu_s: float | None = None
    wall_s: float | None = None
    sim_requests: int | None = None
    sim_ttft_ms: float | None = None  # the sim's own mean TTFT over the measured requests
    extra: dict[str, Any] = field(default_factory=dict)


def child(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[int, str, float, float]:
    """Run ``cmd``; returns (exit code, combined output tail, CPU s of the process tree, wall s)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return rc, out[-3000:], cpu, wall


def run_bench(sim: SimProcess, c: int, n: int, a: argparse.Namespace, work: Path, cfg: SimConfig) -> Run:
    run = Run("bench", c, n)
    prof = work / f"bench-{c}.toml"
    prof.write_text(
        f'name = "peers"\nendpoint = "chat"\nmax_tokens = {a.output_tokens}\nrequests = {n}\nwarmup = 0\n'
        f'overhead_probes = 0\n\n[[sweep]]\ndepths = [{a.prompt_tokens}]\nstreams = [{c}]\nprompts = ["prose"]\n')
    out = work / f"bench-{c}"
    env = dict(os.environ)
    rc, tail, run.cpu_s, run.wall_s = child(
        [sys.executable, "-m", "bench", "run", sim.base, "-p", str(prof), "--out", str(out), "--json"],
        env, ROOT, a.timeout)
    if rc != 0:
        run.status, run.note = "failed", f"exit {rc}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"
        return run
    res = json.loads((out / "results.json").read_text())
    cell = res["cells"][0]
    run.per_stream = cell["decode_tok_s"]["mean"]
    run.aggregate = cell["aggregate_decode_tok_s"]["mean"]
    run.ttft_ms = cell["ttft_ms"]["mean"]
    run.extra["per_stream_median"] = cell["decode_tok_s"]["median"]
    # the run's one probe request (1 output token, tiny prompt): its server TTFT, to leave it out of the truth
    probes = []
    for line in (out / "records.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d["meta"].get("phase") != "measure" and d.get("usage"):
            probes.append(expected_ttft_ms(cfg, int(d["usage"]["prompt_tokens"])))
    run.extra["probe_ttft_ms"] = probes
    return run


def run_guidellm(sim: SimProcess, exe: Path, c: int, n: int, a: argparse.Namespace, work: Path, tok: Path) -> Run:
    run = Run("guidellm", c, n)
    out = work / f"guidellm-{c}.json"
    cmd = [str(exe), "run",
           "--backend", f"kind=openai_http,target={sim.root},model={MODEL},request_format=/v1/chat/completions",
           "--profile", f"kind=concurrent,streams={c}",
           "--constraint", f"kind=max_requests,count={n}",
           "--data", f"kind=synthetic_text,prompt_tokens={a.prompt_tokens},output_tokens={a.output_tokens}",
           "--tokenizer", f"kind=huggingface_auto,model={tok}",
           "--output", f"kind=json,path={out}",
           "--disable-console-interactive"]
    rc, tail, run.cpu_s, run.wall_s = child(cmd, {**os.environ, **OFFLINE}, work, a.timeout)
    if rc != 0 or not out.exists():
        run.status, run.note = "failed", f"exit {rc}: {_last(tail)}"
        return run
    m = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    itl = m["inter_token_latency_ms"]["successful"]["mean"]
    run.per_stream = 1000.0 / itl if itl else None
    run.aggregate = m["output_tokens_per_second"]["successful"]["mean"]
    run.ttft_ms = m["time_to_first_token_ms"]["successful"]["mean"]
    reqs = json.loads(out.read_text())["benchmarks"][0]["requests"]["successful"]
    if reqs:
        run.extra["per_request_output_tok_s"] = sum(r["output_tokens_per_second"] for r in reqs) / len(reqs)
    return run


def run_llama_benchy(sim: SimProcess, exe: Path, c: int, n: int, a: argparse.Namespace, work: Path, tok: Path,
                     book: str) -> Run:
    run = Run("llama-benchy", c, n)
    out = work / f"llama-benchy-{c}.json"
    cmd = [str(exe), "--base-url", sim.base, "--model", MODEL, "--tokenizer", str(tok),
           "--pp", str(a.prompt_tokens), "--tg", str(a.output_tokens), "--depth", "0",
           "--concurrency", str(c), "--runs", str(max(1, n // c)), "--book-url", book,
           "--latency-mode", "none", "--no-warmup", "--skip-coherence", "--no-cache",
           "--format", "json", "--save-result", str(out)]
    rc, tail, run.cpu_s, run.wall_s = child(cmd, {**os.environ, **OFFLINE}, work, a.timeout)
    if rc != 0 or not out.exists():
        run.status, run.note = "failed", f"exit {rc}: {_last(tail)}"
        return run
    b = json.loads(out.read_text())["benchmarks"][0]
    run.per_stream = (b.get("tg_req_throughput") or {}).get("mean")
    run.aggregate = (b.get("tg_throughput") or {}).get("mean")
    run.ttft_ms = (b.get("e2e_ttft") or {}).get("mean")
    run.extra["pp_tok_s"] = (b.get("pp_req_throughput") or {}).get("mean")
    return run


def run_aiperf(sim: SimProcess, exe: Path, c: int, n: int, a: argparse.Namespace, work: Path, tok: Path) -> Run:
    run = Run("aiperf", c, n)
    out = work / f"aiperf-{c}"
    cmd = [str(exe), "profile", "--model", MODEL, "--url", sim.root, "--endpoint-type", "chat", "--streaming",
           "--tokenizer", str(tok), "--concurrency", str(c), "--request-count", str(n),
           "--prompt-input-tokens-mean", str(a.prompt_tokens), "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(a.output_tokens), "--ui-type", "none",
           "--output-artifact-dir", str(out)]
    # not offline: aiperf 0.13's offline mode looks a local tokenizer path up in the hub cache and fails
    rc, tail, run.cpu_s, run.wall_s = child(cmd, dict(os.environ), work, a.timeout)
    res = out / "profile_export_aiperf.json"
    if rc != 0 or not res.exists():
        run.status, run.note = "failed", f"exit {rc}: {_last(tail)}"
        return run
    d = json.loads(res.read_text())
    run.per_stream = (d.get("output_token_throughput_per_user") or {}).get("avg")
    run.aggregate = (d.get("output_token_throughput") or {}).get("avg")
    run.ttft_ms = (d.get("time_to_first_token") or {}).get("avg")
    return run


def _last(tail: str) -> str:
    lines = [ln.strip() for ln in tail.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


# ---------------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------------
def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, load average at start {load}"


def peer_version(venv: Path, dist: str) -> str:
    try:
        out = subprocess.run([str(venv / "bin" / "python"), "-c",
                              f"import importlib.metadata as m; print(m.version({dist!r}))"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
        return out or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def fmt(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def err(v: float | None, truth: float) -> str:
    return "" if v is None else f" ({(v - truth) / truth * 100:+.1f} %)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default="/tmp/peers-venv", help="virtual environment holding the peer tools")
    ap.add_argument("--tools", default="bench,guidellm,llama-benchy,aiperf", help="comma list")
    ap.add_argument("--streams", default="1,4,16", help="stream counts, comma list")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=20.0, help="sim decode_step_ms")
    ap.add_argument("--prefill-tok-s", type=float, default=20_000.0, help="sim prefill_tok_s")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per tool run")
    ap.add_argument("--out", default=str(RESULTS), help="Markdown results file ('' = do not write)")
    a = ap.parse_args(argv)
    venv = Path(a.venv)
    tools = [t.strip() for t in a.tools.split(",") if t.strip()]
    streams = [int(x) for x in a.streams.split(",") if x.strip()]
    cfg = SimConfig(decode_step_ms=a.step_ms, prefill_tok_s=a.prefill_tok_s, max_running=1024, model=MODEL)
    truth_decode = 1000.0 / a.step_ms
    truth_ttft = expected_ttft_ms(cfg, a.prompt_tokens)
    started = datetime.now(UTC)
    mach = machine()
    print(f"machine: {mach}")

    # which peers are there
    exes: dict[str, Path] = {}
    versions: dict[str, str] = {"bench": "this checkout"}
    missing: list[str] = []
    for t in tools:
        if t == "bench":
            continue
        if t not in PEERS:
            print(f"unknown tool {t!r} (known: bench, {', '.join(PEERS)})", file=sys.stderr)
            return 2
        exe = venv / "bin" / PEERS[t]
        if exe.exists():
            exes[t] = exe
            versions[t] = peer_version(venv, t)
        else:
            missing.append(t)
            print(f"MISSING: {t} is not installed in {venv} "
                  f"(python3 -m venv {venv} && {venv}/bin/pip install {t}); it is skipped")

    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    tok = work / "tokenizer"
    srv = None
    book = ""
    try:
        if exes:
            words = work / "sim-words.txt"
            words.write_text(" ".join(w.strip() for w in WORDS))
            p = subprocess.run([str(venv / "bin" / "python"), "-c", TOKENIZER_BUILDER, str(tok), str(PROSE),
                                str(words)], capture_output=True, text=True)
            if p.returncode != 0:
                print(f"cannot build the local tokenizer with {venv}/bin/python (needs `tokenizers`): "
                      f"{_last(p.stderr)}; peers skipped")
                missing += list(exes)
                exes = {}
            else:
                print(f"local tokenizer: {tok} ({p.stdout.strip()} words, whitespace split)")
            srv, root = serve_dir(PROSE.parent)
            book = f"{root}/{PROSE.name}"

        runs: list[Run] = []
        for c in streams:
            n = max(8, 2 * c)
            for t in tools:
                if t in missing:
                    runs.append(Run(t, c, n, status="missing", note=f"not in {venv}"))
                    continue
                sim = start_sim(cfg)
                try:
                    if t == "bench":
                        r = run_bench(sim, c, n, a, work, cfg)
                    elif t == "guidellm":
                        r = run_guidellm(sim, exes[t], c, n, a, work, tok)
                    elif t == "llama-benchy":
                        r = run_llama_benchy(sim, exes[t], c, n, a, work, tok, book)
                    else:
                        r = run_aiperf(sim, exes[t], c, n, a, work, tok)
                    m = sim.metrics()
                finally:
                    sim.close()
                cnt, tsum = m.get("ttft_count", 0.0), m.get("ttft_sum_s", 0.0) * 1000
                probes = r.extra.get("probe_ttft_ms", [])
                if cnt > len(probes):
                    r.sim_ttft_ms = (tsum - sum(probes)) / (cnt - len(probes))
                r.sim_requests = int(m.get("requests", 0))
                runs.append(r)
                print(line(r, truth_decode, truth_ttft), flush=True)
        table = report(runs, streams, truth_decode, truth_ttft)
        print()
        print("\n".join(table))
        if a.out:
            write_md(Path(a.out), a, mach, started, versions, missing, runs, table, truth_decode, truth_ttft, venv)
            print(f"\nwrote {a.out}")
    finally:
        if srv is not None:
            srv.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def line(r: Run, td: float, tt: float) -> str:
    if r.status != "ok":
        return f"{r.tool:13s} streams={r.streams:3d}  {r.status}: {r.note}"
    return (f"{r.tool:13s} streams={r.streams:3d}  per-stream {fmt(r.per_stream)} tok/s{err(r.per_stream, td)}  "
            f"aggregate {fmt(r.aggregate)}{err(r.aggregate, td * r.streams)}  TTFT {fmt(r.ttft_ms)} ms "
            f"(sim {fmt(r.sim_ttft_ms)})  sim requests {r.sim_requests}  CPU {fmt(r.cpu_s, 2)} s  "
            f"wall {fmt(r.wall_s, 1)} s")


HEAD = ("| streams | tool | per-stream decode tok/s (truth {td:g}) | aggregate tok/s (truth streams x {td:g}) "
        "| TTFT mean ms | sim's TTFT mean ms | requests at the sim | CPU s | wall s |")


def report(runs: list[Run], streams: list[int], td: float, tt: float) -> list[str]:
    out = [HEAD.format(td=td), "|---|---|---|---|---|---|---|---|---|"]
    for c in streams:
        for r in (x for x in runs if x.streams == c):
            if r.status != "ok":
                out.append(f"| {c} | {r.tool} | {r.status}: {r.note} | | | | | | |")
                continue
            out.append(
                f"| {c} | {r.tool} | {fmt(r.per_stream)}{err(r.per_stream, td)} "
                f"| {fmt(r.aggregate)}{err(r.aggregate, td * c)} | {fmt(r.ttft_ms)} | {fmt(r.sim_ttft_ms)} "
                f"| {r.sim_requests} | {fmt(r.cpu_s, 2)} | {fmt(r.wall_s, 1)} |")
    return out


def write_md(path: Path, a: argparse.Namespace, mach: str, started: datetime, versions: dict[str, str],
             missing: list[str], runs: list[Run], table: list[str], td: float, tt: float, venv: Path) -> None:
    vers = ", ".join(f"{k} {v}" for k, v in versions.items())
    out = [
        "# bench and peer tools against bench sim",
        "",
        f"Written by `python benchmarks/peers.py` ({started.strftime('%Y-%m-%d %H:%M UTC')}). Machine: {mach}. "
        f"Tools: {vers} (peers from `{venv}`)." + (f" Missing: {', '.join(missing)}." if missing else ""),
        "",
        f"Workload for every tool: chat completions, {a.prompt_tokens} prompt tokens, {a.output_tokens} output "
        "tokens, N concurrent streams, max(8, 2N) measured requests. Sim: "
        f"decode_step_ms = {a.step_ms:g} (truth: {td:g} tok/s per stream at any N; aggregate N x {td:g}), "
        f"prefill_tok_s = {a.prefill_tok_s:g} (TTFT of a request alone: {tt:.1f} ms; with N > 1 up to one step "
        "more, waiting for the next step boundary), one token per event, a fresh sim per run.",
        "",
        *table,
        "",
        "What each column holds, per tool (means over the measured requests):",
        "",
        "* bench: `decode_tok_s` mean ((tokens - 1) / first-to-last token time per request), "
        "`aggregate_decode_tok_s` mean (per wave: all streams' tokens / earliest first to latest last token), "
        "`ttft_ms` mean (send -> first token event).",
        "* guidellm: per-stream = 1000 / its ITL mean (it reports no per-stream decode rate; its per-request "
        "`output_tokens_per_second` is output tokens / whole request latency, TTFT included: "
        + ", ".join(f"{fmt(r.extra.get('per_request_output_tok_s'))} at N = {r.streams}" for r in runs
                    if r.tool == "guidellm" and r.status == "ok") +
        "); aggregate = `output_tokens_per_second` mean (its server throughput); TTFT = "
        "`time_to_first_token_ms` mean.",
        "* llama-benchy: `tg_req_throughput` mean (per request), `tg_throughput` mean (per batch), `e2e_ttft` mean "
        "(`--latency-mode none`, so nothing is subtracted). Its prompt tok/s (`pp`) divides by the time to the "
        "first *response chunk*, which the sim (like vLLM) sends before prefill: "
        + ", ".join(f"{fmt(r.extra.get('pp_tok_s'), 0)} at N = {r.streams}" for r in runs
                    if r.tool == "llama-benchy" and r.status == "ok") +
        f" tok/s vs the truth {a.prefill_tok_s:g}.",
        "* aiperf: `output_token_throughput_per_user` avg, `output_token_throughput` avg, `time_to_first_token` avg.",
        "* *sim's TTFT mean*: the sim's own arrival -> first-token write (its clock) over the run's requests "
        "(bench's one probe request left out); a client's TTFT adds HTTP handling and delivery (~1-2 ms here) and, "
        "with N > 1, the time the sim takes to read the other requests that arrived together. *Requests at the "
        "sim* beyond max(8, 2N) are the tools' own probes: bench's one overhead probe, llama-benchy's two start-up "
        "prompt-size probes (~10-token prompts, isolated TTFT ~20.5 ms: they pull its sim TTFT mean down, by ~2.5 "
        f"ms at N = 1). At N = 1 every measured request ran alone, so its TTFT truth is exactly {tt:.1f} ms.",
        "* CPU s: user + system time of the tool's process tree, start-up (imports) included; wall s likewise.",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
