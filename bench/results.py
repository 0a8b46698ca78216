"""The results document (``results.json``): typed classes, one loader that validates, one atomic writer.

``results.json`` is the source of truth of a run; CSV, Markdown, plots, reports and the gate are views of it. Its
fields are the dataclasses below; docs/results.md lists them and ``tests/test_structure.py`` fails when the two
drift. ``capacity.json`` (:class:`Capacity`) and ``gate.json`` / ``ab.json`` (:class:`Gate`) are typed the same way,
written by the same atomic writer and loaded by the same validation (:func:`load_capacity`, :func:`load_gate`).

    Results
    ├── profile: ProfileInfo      name, source, every Profile setting
    ├── endpoint: EndpointInfo    url, model, kind
    ├── server: dict              what bench.server.info discovered (backend, context size, routes, slots...)
    ├── machine: dict             where bench ran (hostname, platform, cpu_count, python)
    ├── run: RunInfo              id, times, complete / interrupted, overhead, tokenizer, workers...
    ├── cells: [CellResult]       one summary per cell (definitions: docs/metrics.md, "Per cell")
    └── warnings: [str]

:func:`load_results` raises :class:`bench.errors.ConfigError` (exit 3) for anything that is not such a document;
:func:`save_results` writes it atomically (temp file + rename), so a reader never sees
half a file and a crash keeps the last complete version.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import types
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.errors import ConfigError
from bench.redaction import redact
from bench.warns import check_document

__all__ = ["SCHEMA_VERSION", "Results", "ProfileInfo", "EndpointInfo", "RunInfo", "CellResult", "Stat",
           "load_results", "results_from_dict", "save_results", "write_atomic", "to_json", "prepare_folder",
           "RUN_FILES", "run_files_in", "replace_run", "discard_when_failed", "cell_from_dict", "Capacity",
           "CapacityPoint", "Gate", "GateVerdict", "capacity_from_dict", "gate_from_dict", "load_capacity",
           "load_gate", "save_capacity", "save_gate", "gate_json"]

SCHEMA_VERSION = 1

Stat = dict[str, Any]
"""A statistic's summary (:meth:`bench.stats.Summary.to_dict`): n, mean, median, p10, p90, p99, min, max, thin."""


def _stat() -> Stat:
    return {"n": 0, "mean": None, "median": None, "p10": None, "p90": None, "p99": None, "min": None,
            "max": None, "thin": []}


@dataclass
class CellResult:
    """One cell's summary: identity, counts, statistics (each a :data:`Stat`), raw samples and warnings.

    Units are in the names (``_ms``, ``_tok_s``); docs/metrics.md defines each. Optional sections are None when
    the run did not produce them (no /metrics, no roofline flags, closed-loop load...).
    """

    id: str
    sweep: str = ""
    depth: int = 0
    streams: int = 1
    prompt: str = ""
    max_tokens: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    requests_cut: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    waves: int = 0
    decode_tok_s: Stat = field(default_factory=_stat)
    aggregate_decode_tok_s: Stat = field(default_factory=_stat)
    ttft_ms: Stat = field(default_factory=_stat)
    ttfc_ms: Stat = field(default_factory=_stat)
    itl_ms: Stat = field(default_factory=_stat)
    tpot_ms: Stat = field(default_factory=_stat)
    e2e_ms: Stat = field(default_factory=_stat)
    prompt_tok_s: Stat = field(default_factory=_stat)
    prompt_tok_s_corrected: Stat = field(default_factory=_stat)
    server_prefill_tok_s: Stat = field(default_factory=_stat)
    server_decode_tok_s: Stat = field(default_factory=_stat)
    ttft_minus_server_prompt_ms: Stat = field(default_factory=_stat)
    overhead_ms: float | None = None
    overhead_share: float | None = None
    overhead_flag: bool = False
    prompt_tokens: Stat = field(default_factory=_stat)
    prompt_target: int | None = None
    prompt_miss_pct: float | None = None
    output_tokens: Stat = field(default_factory=_stat)
    output_tokens_estimated: int = 0
    tokens_per_event: Stat = field(default_factory=_stat)
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    ttft_reasoning_ms: Stat = field(default_factory=_stat)
    ttft_content_ms: Stat = field(default_factory=_stat)
    reasoning_tok_s: Stat = field(default_factory=_stat)
    content_tok_s: Stat = field(default_factory=_stat)
    ttft_tool_ms: Stat = field(default_factory=_stat)
    tool_tok_s: Stat = field(default_factory=_stat)
    tool_calls: int = 0
    tool_calls_forced: int = 0
    tool_calls_missing: int = 0
    images: int = 0
    image_size: str = ""
    image_bytes: Stat = field(default_factory=_stat)
    image_prompt_tokens: float | None = None
    upload_ms: Stat = field(default_factory=_stat)
    queue_ms: Stat = field(default_factory=_stat)
    client_cpu_pct: float | None = None
    client_lag: dict[str, Any] | None = None
    noise: dict[str, Any] | None = None
    queueing: dict[str, Any] | None = None
    server_metrics: dict[str, Any] | None = None
    gpu: dict[str, Any] | None = None
    roofline: dict[str, Any] | None = None
    load: dict[str, Any] | None = None
    goodput: dict[str, Any] | None = None
    slo: dict[str, Any] | None = None
    mode: str | None = None
    schedule: dict[str, Any] | None = None
    counts: dict[str, Any] | None = None
    window: dict[str, Any] | None = None
    throughput: dict[str, Any] | None = None
    latency: dict[str, Any] | None = None
    trend: dict[str, Any] | None = None
    steady: bool | None = None
    slo_met: bool | None = None
    turns: list[dict[str, Any]] | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def measures_prefill(self) -> bool:
        """Whether its prompt tok/s is a prefill figure: a closed-loop cell at a depth (at depth 0 TTFT is mostly
        overhead; open loop, queueing). Elsewhere the table shows "-" and compare / ab do not judge it."""
        return bool(self.depth and self.streams and not self.load)

    def stat(self, metric: str, which: str = "median") -> float | None:
        """One statistic of a metric, e.g. ``cell.stat("ttft_ms", "p90")``; None when absent."""
        s = getattr(self, metric, None)
        v = s.get(which) if isinstance(s, dict) else None
        return v if isinstance(v, int | float) and not isinstance(v, bool) else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (optional sections left out when None)."""
        return _to_dict(self)


@dataclass
class ProfileInfo:
    """The profile a run used: its name, where it came from, and every setting."""

    name: str
    source: str = ""
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class EndpointInfo:
    """The endpoint measured: OpenAI base URL, model, and ``chat`` or ``completions``."""

    url: str
    model: str = ""
    kind: str = "chat"


@dataclass
class RunInfo:
    """How the run went. ``complete`` is False until the last cell is written (a killed run stays incomplete);
    ``interrupted`` is True when it was stopped by SIGINT/SIGTERM."""

    id: str
    started: str = ""
    duration_s: float = 0.0
    complete: bool = False
    interrupted: bool = False
    overhead_ms: float | None = None
    tokenizer: str = ""
    template_overhead_tokens: int = 0
    template_cached_tokens: int = 0
    forced_length: bool = True
    workers: int = 1
    workers_auto: bool = False
    gate_extra_waves: dict[str, int] | None = None
    sizing: dict[str, Any] | None = None
    stamp_clock: dict[str, Any] | None = None
    ray: dict[str, Any] | None = None
    nodes: list[dict[str, Any]] | None = None
    drift: dict[str, Any] | None = None
    lag: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (optional sections left out when None)."""
        return _to_dict(self)


@dataclass
class Results:
    """The whole results document (see the module docstring)."""

    profile: ProfileInfo
    endpoint: EndpointInfo
    run: RunInfo
    cells: list[CellResult] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    schema: int = SCHEMA_VERSION
    bench_version: str = ""
    created: str = ""
    roofline_spec: dict[str, Any] | None = None
    load: dict[str, Any] | None = None

    def cell(self, cell_id: str) -> CellResult | None:
        """The cell with this id, or None."""
        return next((c for c in self.cells if c.id == cell_id), None)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, keys in the documented order."""
        return {
            "schema": self.schema, "bench_version": self.bench_version, "created": self.created,
            "profile": dataclasses.asdict(self.profile), "endpoint": dataclasses.asdict(self.endpoint),
            "server": self.server, "machine": self.machine, "run": self.run.to_dict(),
            "cells": [c.to_dict() for c in self.cells], "warnings": list(self.warnings),
            **({"roofline_spec": self.roofline_spec} if self.roofline_spec is not None else {}),
            **({"load": self.load} if self.load is not None else {}),
        }


def _to_dict(obj: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if v is None and f.default is None:
            continue
        out[f.name] = v
    return out


# --- validation ----------------------------------------------------------------------------------------------------


def _type_ok(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a field's annotation (shallow for containers: dict/list and their type)."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if origin is list or hint is list:
        if not isinstance(value, list):
            return False
        args = typing.get_args(hint)
        return not args or all(_type_ok(v, args[0]) for v in value)
    return True


def _build(cls: Any, data: Any, where: str) -> Any:
    """``cls(**data)`` with every present key's type checked; unknown keys are ignored (newer writers)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{where}: missing key {f.name!r}")
            continue
        v = data[f.name]
        if not _type_ok(v, hints[f.name]):
            raise ConfigError(f"{where}.{f.name}: {type(v).__name__} where {_hint_name(hints[f.name])} is expected")
        kwargs[f.name] = v
    return cls(**kwargs)


def _hint_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


def results_from_dict(data: Any, where: str = "results") -> Results:
    """Validate a parsed ``results.json`` and return the typed document.

    Raises:
        ConfigError: not an object, wrong schema, a missing required key or a field of the wrong type (the message
            names the key path, e.g. ``results.cells[2].ttft_ms``).
    """
    if not isinstance(data, dict) or "cells" not in data:
        raise ConfigError(f"{where}: not a bench results file (no 'cells')")
    if data.get("schema") != SCHEMA_VERSION:
        raise ConfigError(f"{where}: schema {data.get('schema')!r} is not supported (this bench reads "
                          f"{SCHEMA_VERSION})")
    if not isinstance(data["cells"], list):
        raise ConfigError(f"{where}.cells: a list of cell summaries is expected")
    top = {k: data[k] for k in ("schema", "bench_version", "created", "server", "machine", "warnings",
                                "roofline_spec", "load") if k in data}
    probe = _build(_Top, top, where)
    return Results(
        profile=_build(ProfileInfo, data.get("profile", {"name": ""}), f"{where}.profile"),
        endpoint=_build(EndpointInfo, data.get("endpoint", {"url": ""}), f"{where}.endpoint"),
        run=_build(RunInfo, _legacy_run(data.get("run", {"id": ""})), f"{where}.run"),
        cells=[_build(CellResult, c, f"{where}.cells[{i}]") for i, c in enumerate(data["cells"])],
        server=probe.server, machine=probe.machine, warnings=probe.warnings, schema=probe.schema,
        bench_version=probe.bench_version, created=probe.created, roofline_spec=probe.roofline_spec, load=probe.load,
    )


def _legacy_run(run: Any) -> Any:
    """Files written before ``complete`` existed: a finished, uninterrupted run was complete."""
    if isinstance(run, dict) and "complete" not in run:
        return {**run, "complete": not run.get("interrupted", False)}
    return run


@dataclass
class _Top:
    schema: int = SCHEMA_VERSION
    bench_version: str = ""
    created: str = ""
    server: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    roofline_spec: dict[str, Any] | None = None
    load: dict[str, Any] | None = None


def cell_from_dict(data: Any, where: str = "cell") -> CellResult:
    """A cell summary from its JSON form, types checked (ConfigError naming the key otherwise)."""
    cell: CellResult = _build(CellResult, data, where)
    return cell


def load_results(path: str | os.PathLike[str]) -> Results:
    """Read and validate a ``results.json`` (given, or a run folder holding one).

    Raises:
        ConfigError: the file is missing, unreadable, not UTF-8 JSON, or not a valid results document.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    data = _read_json(p, "results")
    return results_from_dict(data, f"results file {p}")


# --- capacity.json and gate.json (ab.json) -------------------------------------------------------------------------


@dataclass
class CapacityPoint:
    """One trial of the capacity search (docs/results.md, "capacity.json"); ``dir`` holds its records and
    ``point.json`` (the point's full cell summary)."""

    load: float
    trial: int = 0
    phase: str = ""
    id: str | None = None
    slo_met: bool | None = None
    steady: bool | None = None
    rate: float | None = None
    slo_model: dict[str, Any] | None = None
    saturated: bool = False
    goodput: dict[str, Any] | None = None
    slo: dict[str, Any] | None = None
    achieved_rps: float | None = None
    completed_rps: float | None = None
    ttft_p90_ms: float | None = None
    tpot_p50_ms: float | None = None
    per_user_tok_s: float | None = None
    aggregate_tok_s: float | None = None
    send_lag_p99_ms: float | None = None
    dir: str | None = None


@dataclass
class Capacity:
    """``capacity.json``: the search's answer (boundary, interval, level), how it was found, and every point."""

    by: str
    points: list[CapacityPoint] = field(default_factory=list)
    definition: str = ""
    boundary: float | None = None
    interval: list[float | None] | None = None
    safe: float | None = None
    confidence: float | None = None
    saturated_at: float | None = None
    method: dict[str, Any] | None = None
    note: str | None = None
    time_budget_s: float | None = None
    elapsed_s: float | None = None
    interrupted: bool = False
    cut_point: dict[str, Any] | None = None  # interrupted mid-point: its load, trial, folder and records kept
    slo: str | None = None
    load: dict[str, Any] | None = None
    endpoint: dict[str, Any] | None = None
    server: dict[str, Any] | None = None
    run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, every key kept (None included: a search with no boundary says so)."""
        d = dataclasses.asdict(self)
        d["points"] = [dataclasses.asdict(p) for p in self.points]
        return d


@dataclass
class GateVerdict:
    """One rule in one cell (:meth:`bench.gate.Verdict.to_dict`; docs/gate.md defines each)."""

    name: str
    metric: str
    stat: str
    cell: str
    verdict: str
    rule_cell: str | None = None
    rule_index: int | None = None
    max_change_pct: float | None = None
    limit: float | None = None
    higher_better: bool | None = None
    baseline: float | None = None
    candidate: float | None = None
    ratio: float | None = None
    lo: float | None = None
    hi: float | None = None
    level: float | None = None
    n_baseline: int | None = None
    n_candidate: int | None = None
    note: str = ""
    min_detectable_pct: float | None = None
    planned_mde_pct: float | None = None
    resolution_ok: bool | None = None
    waves: dict[str, Any] | None = None
    waves_needed: int | None = None
    look: int | None = None


@dataclass
class Gate:
    """``gate.json`` of ``bench gate`` (``baseline``, the sequential keys) and ``ab.json`` of ``bench ab`` (``a``,
    ``b``): the exit code, the rules as ``[[gate]]`` tables, and one verdict per rule and cell."""

    exit: int
    rules: list[dict[str, Any]] = field(default_factory=list)
    verdicts: list[GateVerdict] = field(default_factory=list)
    baseline: str | None = None
    a: str | None = None
    b: str | None = None
    extra_waves: int | None = None
    max_time_s: float | None = None
    elapsed_s: float | None = None
    budget_ran_out: bool | None = None
    alpha: float | None = None
    instance_spread_pct: float | None = None
    plan: list[dict[str, Any]] | None = None
    schedules: dict[str, list[int]] | None = None
    looks: dict[str, list[int]] | None = None
    seconds_per_wave: dict[str, Any] | None = None
    gpu_notes: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: exit first, optional sections left out when None, rules and verdicts last."""
        d = {k: v for k, v in _to_dict(self).items() if k not in ("rules", "verdicts")}
        return {**d, "rules": list(self.rules), "verdicts": [dataclasses.asdict(v) for v in self.verdicts]}


def _document(cls: Any, item_cls: Any, items: str, required: str, kind: str, data: Any, where: str) -> Any:
    """``cls`` from a parsed document whose list ``items`` holds ``item_cls`` entries (both with types checked;
    ConfigError naming the key path, e.g. ``capacity.points[3].load``); ``required``: the other key it must have."""
    if not isinstance(data, dict) or items not in data or required not in data:
        raise ConfigError(f"{where}: not a bench {kind} file (no {required!r} and {items!r})")
    if not isinstance(data[items], list):
        raise ConfigError(f"{where}.{items}: a list of {items} is expected")
    top = _build(cls, {k: v for k, v in data.items() if k != items}, where)
    setattr(top, items, [_build(item_cls, x, f"{where}.{items}[{i}]") for i, x in enumerate(data[items])])
    return top


def capacity_from_dict(data: Any, where: str = "capacity") -> Capacity:
    """Validate a parsed ``capacity.json`` (ConfigError naming the bad key path, e.g. ``capacity.points[3].load``)."""
    doc: Capacity = _document(Capacity, CapacityPoint, "points", "by", "capacity", data, where)
    return doc


def gate_from_dict(data: Any, where: str = "gate") -> Gate:
    """Validate a parsed ``gate.json`` / ``ab.json`` (ConfigError naming the bad key path)."""
    doc: Gate = _document(Gate, GateVerdict, "verdicts", "exit", "gate", data, where)
    return doc


def _read_json(p: Path, what: str) -> Any:
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} file {p}: not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} file {p}: is a folder (give its {what}.json)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} file {p}: not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"{what} file {p}: cannot read it ({e.strerror or e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} file {p}: not valid JSON ({e.msg} at line {e.lineno})") from None


def load_capacity(path: str | os.PathLike[str]) -> Capacity:
    """Read and validate a ``capacity.json`` (a folder means its capacity.json). Raises ConfigError."""
    p = Path(path)
    p = p / "capacity.json" if p.is_dir() else p
    return capacity_from_dict(_read_json(p, "capacity"), f"capacity file {p}")


def load_gate(path: str | os.PathLike[str]) -> Gate:
    """Read and validate a ``gate.json`` or ``ab.json``. Raises ConfigError."""
    p = Path(path)
    return gate_from_dict(_read_json(p, "gate"), f"gate file {p}")


def save_capacity(doc: Capacity | Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``capacity.json`` atomically, its types checked first (a dict is validated, its keys all kept)."""
    d = doc.to_dict() if isinstance(doc, Capacity) else dict(doc)
    capacity_from_dict(d, "capacity.json being written")
    check_document(d)
    return write_atomic(path, json.dumps(d, indent=1, ensure_ascii=False) + "\n")


def save_gate(doc: Gate | Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``gate.json`` / ``ab.json`` atomically, its types checked first (a dict is validated, all keys kept)."""
    return write_atomic(path, gate_json(doc))


def gate_json(doc: Gate | Mapping[str, Any]) -> str:
    """The gate document as written (and printed by ``bench gate --json``), validated."""
    d = doc.to_dict() if isinstance(doc, Gate) else dict(doc)
    gate_from_dict(d, "gate document being written")
    return redact(json.dumps(d, indent=1, ensure_ascii=False)) + "\n"


# --- writing -------------------------------------------------------------------------------------------------------


def to_json(results: Results | Mapping[str, Any]) -> str:
    """The whole results document, indented."""
    d = results.to_dict() if isinstance(results, Results) else dict(results)
    check_document(d)
    return redact(json.dumps(d, indent=1, ensure_ascii=False)) + "\n"


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temp file and a rename (readers see the old or the new file); every
    secret bench knows of is redacted first.

    Raises:
        ConfigError: the folder cannot be made or written (full disk, no permission, a file in the way).
    """
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(redact(text))  # no API key in any file bench writes
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise ConfigError(f"cannot write {p}: {e.strerror or e}") from None
    return p


def save_results(results: Results, path: str | os.PathLike[str]) -> Path:
    """Write ``results.json`` atomically (views such as CSV and Markdown: :mod:`bench.report.export`)."""
    return write_atomic(path, to_json(results))


RUN_FILES = ("records.jsonl", "results.json", "results.csv", "results.md", "report.html", "gate.json")


def run_files_in(folder: str | os.PathLike[str]) -> list[str]:
    """The :data:`RUN_FILES` that ``folder`` holds: a run is there when any is (none for a missing folder)."""
    return [n for n in RUN_FILES if (Path(folder) / n).exists()]


def prepare_folder(out_dir: str | os.PathLike[str], *, overwrite: bool = False,
                   resume: bool = False) -> Results | None:
    """Make ``out_dir`` ready for a run; returns the run to continue with ``resume``, else None.

    A folder that already holds a run is refused unless ``resume`` (an interrupted run is continued: finished cells
    kept, the unfinished one measured again) or ``overwrite`` (its run files are removed first). Raises ConfigError
    when ``--out`` is a file, lies under a file, cannot be written, or holds a run (naming the flags); for
    ``resume`` with ``overwrite``, or with no run in ``out_dir``."""
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise ConfigError(f"--out {d}: is a file, not a folder")
    if resume and overwrite:
        raise ConfigError(f"--resume and --overwrite: choose one (--resume continues the run in {d}, --overwrite "
                          "replaces it)")
    held = run_files_in(d)
    if resume and not held:
        raise ConfigError(f"--resume: {d} holds no run to continue; give --out the folder of the interrupted run "
                          "(or drop --resume to start one)")
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / ".bench-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"--out {d}: cannot write there ({e.strerror or e})") from None
    if not held:
        return None
    if resume:
        if not (d / "results.json").exists():
            raise ConfigError(f"--resume: {d} holds {', '.join(held)} but no results.json (the run stopped before "
                              "it wrote any); --overwrite starts it again")
        prev = load_results(d / "results.json")
        if prev.run.complete:
            raise ConfigError(f"--resume: the run in {d} is complete; nothing to continue (--overwrite to redo it)")
        return prev
    if overwrite:
        for n in held:
            (d / n).unlink()
        return None
    raise ConfigError(f"--out {d}: already holds a run ({', '.join(held)}); --resume continues an interrupted "
                      "run, --overwrite replaces it, or choose another folder")


def replace_run(target: str | os.PathLike[str], run_dir: str | os.PathLike[str], results: Results) -> Path:
    """``bench gate --update-baseline``: make ``target`` (a baseline) the run ``results`` of ``run_dir``; returns
    what it wrote. A folder, or a results.json with a run's other files beside it, gets the run's whole set
    (``results`` as results.json, ``run_dir``'s other :data:`RUN_FILES`; run files the new run lacks are removed,
    other files stay), each written to ``.NAME.new`` and renamed in once all are there, so a failure (full disk)
    leaves the old set whole. A lone results file gets ``results`` alone. Raises ConfigError when the new files
    cannot be written (the old ones are then left as they were)."""
    p, src = Path(target), Path(run_dir)
    run_beside = p.name == "results.json" and any(n != p.name for n in run_files_in(p.parent))
    if not p.is_dir() and not run_beside:
        return write_atomic(p, to_json(results))
    d = p if p.is_dir() else p.parent
    if d.resolve() == src.resolve():  # the run was written there already
        return d
    names = ["results.json"] + [n for n in RUN_FILES if n != "results.json" and (src / n).is_file()]
    try:
        for n in names:
            if n == "results.json":
                write_atomic(d / f".{n}.new", to_json(results))
            else:
                shutil.copyfile(src / n, d / f".{n}.new")
    except (OSError, ConfigError) as e:
        for n in names:
            (d / f".{n}.new").unlink(missing_ok=True)
        raise ConfigError(f"cannot update {d} (left as it was): {getattr(e, 'strerror', None) or e}") from None
    try:
        for n in set(RUN_FILES) - set(names):
            (d / n).unlink(missing_ok=True)  # the old run's files the new one has not: no mixed folder
        for n in names:
            os.replace(d / f".{n}.new", d / n)
    except OSError as e:
        raise ConfigError(f"cannot update {d}: {e.strerror or e}") from None
    return d


@contextmanager
def discard_when_failed(out_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Around a command that writes into ``out_dir``: when it fails (any exception, Ctrl-C included) having
    written nothing there (no file, or only empty ones), the folders it made for it are removed again, so that a
    failed run leaves no empty results folder behind. A folder that held something before is never touched."""
    d = Path(out_dir).absolute()
    made = [p for p in (d, *d.parents) if not p.exists()]  # the folders this command will have made
    try:
        yield
    except BaseException:
        if made and d.is_dir() and all(f.is_file() and f.stat().st_size == 0 for f in d.rglob("*")
                                       if not f.is_dir()):
            shutil.rmtree(d, ignore_errors=True)
            for p in made[1:]:  # the new parents, innermost first, while they are empty
                try:
                    p.rmdir()
                except OSError:
                    break
        raise
