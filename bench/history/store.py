"""The run history store: every run's metadata and each cell's statistics, in SQLite (default) or PostgreSQL.

A store is named by a URL: a plain path or ``sqlite:///path`` is an SQLite file (Python's :mod:`sqlite3`);
``postgresql://user@host/db`` (or ``postgres://``) is a PostgreSQL database reached with psycopg 3
(``pip install 'bench[history]'``). Both hold the same tables::

    schema_version  version, applied, about        one row per migration applied (MIGRATIONS below)
    runs            one row per results.json: run id and start, commit, branch, server, model, profile, machine,
                    the profile's gate rules (JSON), the file it came from, the settings it ran with (JSON)
    stats           one row per run x cell x metric: n, mean, median, p10, p90, p99, min, max and the 95 %
                    bootstrap interval of the median (median_lo, median_hi; NULL without raw samples)

A run's *setup* (:class:`Setup`: profile, model, endpoint URL and a digest of the settings it measured with,
command-line overrides included) says what it measured; a series is one cell of one setup. A run is identified by
``run.id``, ``run.started`` and a digest of its cells (``run_key``, unique): adding it again is refused
(:class:`bench.errors.HistoryError`, exit 3). Migrations are numbered; opening a store applies the missing ones in
one transaction each, and a store written by a newer bench (a version above :data:`SCHEMA_VERSION`) is refused.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bench.errors import ConfigError, HistoryError
from bench.gate import OPEN_LOOP_SAMPLE
from bench.redaction import redact
from bench.results import CellResult, Results

__all__ = ["HistoryStore", "open_store", "RunRow", "Point", "Setup", "MIGRATIONS", "SCHEMA_VERSION",
           "STAT_METRICS", "STAT_COLUMNS", "DEFAULT_DB", "run_key", "sqlite_file", "setup_url", "FREE_PORTS_FROM",
           "measured_settings", "settings_key", "setup_labels"]

DEFAULT_DB = "bench-history.db"

STAT_METRICS = ("decode_tok_s", "aggregate_decode_tok_s", "ttft_ms", "ttfc_ms", "itl_ms", "tpot_ms", "e2e_ms",
                "prompt_tok_s", "prompt_tok_s_corrected", "server_prefill_tok_s", "server_decode_tok_s",
                "ttft_minus_server_prompt_ms", "queue_ms")
"""The statistics of a cell kept in the store (the :data:`bench.results.Stat` fields of a cell summary)."""
STAT_COLUMNS = ("mean", "median", "p10", "p90", "p99", "min", "max")

_RUN_COLUMNS = ("run_key", "run_id", "started", "created", "duration_s", "complete", "interrupted", "bench_version",
                "results_schema", "profile", "endpoint_url", "endpoint_kind", "model", "backend", "server_version",
                "hostname", "commit_sha", "branch", "gate_rules", "source", "added", "settings")

MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (1, "runs and per-cell statistics", (
        "CREATE TABLE runs ("
        " pk {pk}, run_key TEXT NOT NULL UNIQUE, run_id TEXT NOT NULL, started TEXT NOT NULL, created TEXT,"
        " duration_s DOUBLE PRECISION, complete INTEGER, interrupted INTEGER, bench_version TEXT,"
        " results_schema INTEGER, profile TEXT, endpoint_url TEXT, endpoint_kind TEXT, model TEXT, backend TEXT,"
        " server_version TEXT, hostname TEXT, commit_sha TEXT, branch TEXT, gate_rules TEXT, source TEXT,"
        " added TEXT NOT NULL)",
        "CREATE TABLE stats ("
        " run_pk INTEGER NOT NULL REFERENCES runs(pk) ON DELETE CASCADE, cell TEXT NOT NULL, metric TEXT NOT NULL,"
        " n INTEGER NOT NULL, mean DOUBLE PRECISION, median DOUBLE PRECISION, p10 DOUBLE PRECISION,"
        " p90 DOUBLE PRECISION, p99 DOUBLE PRECISION, min DOUBLE PRECISION, max DOUBLE PRECISION,"
        " median_lo DOUBLE PRECISION, median_hi DOUBLE PRECISION, PRIMARY KEY (run_pk, cell, metric))",
    )),
    (2, "series lookups by metric and cell; runs in the order they were made", (
        "CREATE INDEX stats_series ON stats (metric, cell)",
        "CREATE INDEX runs_started ON runs (started)",
    )),
    (3, "the settings each run measured with (its profile's, command-line overrides included): part of its setup", (
        "ALTER TABLE runs ADD COLUMN settings TEXT",
    )),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]


def run_key(results: Results) -> str:
    """The identity of a run in the store: ``run.id@run.started#digest`` (the 8-hex id alone could repeat; the
    digest, of the cells' summaries, tells a file edited after the run from the run itself)."""
    import hashlib

    cells = redact(json.dumps([c.to_dict() for c in results.cells], sort_keys=True, ensure_ascii=False))
    return f"{results.run.id}@{_started(results)}#{hashlib.sha256(cells.encode()).hexdigest()[:16]}"


def _started(results: Results) -> str:
    return results.run.started or results.created


_UNMEASURED = frozenset({"description", "gate", "overrides", "requests", "requests_by_depth", "min_waves",
                         "max_waves", "target_ci", "gate_budget_waves", "overhead_probes"})
"""Profile settings that do not change what a request measures: words, the gate's rules (they judge), the flags'
names (their values are the settings), and how many requests are sampled (the figures' precision, not their
level)."""
_CELL_LISTS = frozenset({"name", "requests", "depths", "streams", "prompts"})
"""A sweep's keys that only say which cells it has (a cell's id names its depth, streams and prompt) or how many
requests each gets: adding ``--depths 0,32k`` to a profile keeps the depth-0 cells' series."""


def _settings_json(results: Results) -> str:
    """What the ``settings`` column holds: the profile's settings as results.json records them (overrides applied;
    the gate rules are ``gate_rules``) and the open-loop load (``results.load``), JSON."""
    prof = results.profile.settings if isinstance(results.profile.settings, dict) else {}
    doc = {"profile": {k: v for k, v in prof.items() if k != "gate"}, "load": results.load}
    return redact(json.dumps(doc, sort_keys=True, ensure_ascii=False, default=str))


def measured_settings(stored: Any) -> dict[str, Any] | None:
    """The settings that say what a run measured, from its stored ``settings`` (:func:`_settings_json`): the
    profile's, less :data:`_UNMEASURED` (a sweep's :data:`_CELL_LISTS` too), and the open-loop load as
    ``open_loop`` (less its seed, duration and request count). None for a run stored before they were (schema
    version 3)."""
    try:
        doc = json.loads(stored) if stored else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return None
    prof = doc.get("profile")
    out = {k: v for k, v in prof.items() if k not in _UNMEASURED} if isinstance(prof, dict) else {}
    if isinstance(out.get("sweeps"), list):
        kept = {json.dumps({k: v for k, v in sw.items() if k not in _CELL_LISTS} if isinstance(sw, dict) else sw,
                           sort_keys=True, default=str) for sw in out["sweeps"]}
        out["sweeps"] = [json.loads(x) for x in sorted(kept)]  # the distinct settings of the sweeps
    if isinstance(doc.get("load"), dict):
        out["open_loop"] = {k: v for k, v in doc["load"].items() if k not in OPEN_LOOP_SAMPLE}
    return out


def settings_key(measured: dict[str, Any] | None) -> str:
    """8 hex digits of the SHA-256 of :func:`measured_settings` (``""``: not recorded): runs of one profile made with
    other settings (``--max-tokens 64`` after 16) have another key, so another setup."""
    import hashlib

    if measured is None:
        return ""
    text = json.dumps(measured, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


FREE_PORTS_FROM = 32768
"""The first port of the kernel's range for free ports (Linux: 32768-60999; macOS, Windows: 49152-65535): where
bench's embedded endpoint, ``bench sim --port 0`` and ``running_sim`` listen, a new port each run."""


def setup_url(url: str) -> str:
    """The endpoint of a setup: ``url``, except that a loopback URL on a free port (from :data:`FREE_PORTS_FROM`:
    a local server started for the run, e.g. the embedded endpoint) has its port as ``*``, so that every run of
    it is one setup. ``http://127.0.0.1:41235/v1`` -> ``http://127.0.0.1:*/v1``; ``:8000`` stays."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        u = urlsplit(url)
        port, host = u.port, u.hostname or ""
    except ValueError:
        return url
    if port is None or port < FREE_PORTS_FROM or not (host in ("localhost", "::1") or host.startswith("127.")):
        return url
    return urlunsplit(u._replace(netloc=f"{u.netloc.rsplit(':', 1)[0]}:*"))


@dataclass(frozen=True)
class Setup:
    """What a series is measured on: the profile, the model and the endpoint of a run (the ``runs`` columns
    ``profile``, ``model``, ``endpoint_url``; the URL as :func:`setup_url` reads it) and the settings it ran with
    (:func:`settings_key`; ``""`` for a run stored before they were recorded). A series is one cell of one setup:
    runs of another profile or other settings (``--max-tokens``, ``--depths``...), model or server measure something
    else, and are never mixed into it."""

    profile: str
    model: str
    endpoint_url: str
    settings_key: str = ""

    def to_dict(self) -> dict[str, str]:
        """The JSON form."""
        return {"profile": self.profile, "model": self.model, "endpoint_url": self.endpoint_url,
                "settings_key": self.settings_key}

    def label(self) -> str:
        """One line: ``profile P, model M, URL``."""
        return f"profile {self.profile or '-'}, model {self.model or '-'}, {self.endpoint_url or 'no endpoint URL'}"


@dataclass(frozen=True)
class RunRow:
    """One stored run (the columns of ``runs``), in the order the runs were made (``started``)."""

    pk: int
    run_id: str
    started: str
    commit_sha: str | None
    branch: str | None
    profile: str
    model: str
    backend: str
    hostname: str
    gate_rules: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    endpoint_url: str = ""
    settings: dict[str, Any] | None = None  # :func:`measured_settings`; None: stored before they were recorded
    settings_key: str = ""  # :func:`settings_key` of ``settings``

    @property
    def setup(self) -> Setup:
        """The setup the run measured (its series are this setup's)."""
        return Setup(self.profile, self.model, setup_url(self.endpoint_url), self.settings_key)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``gate_rules`` and ``settings`` left out)."""
        return {"run_id": self.run_id, "started": self.started, "commit": self.commit_sha, "branch": self.branch,
                "profile": self.profile, "model": self.model, "backend": self.backend, "hostname": self.hostname,
                "source": self.source, "endpoint_url": self.endpoint_url, "settings_key": self.settings_key}


def setup_labels(runs: Sequence[RunRow]) -> dict[Setup, str]:
    """Each setup of ``runs`` named in one line: :meth:`Setup.label`; where several share profile, model and URL
    (other settings), each also gets its settings' key and the settings that tell them apart, at most three:
    ``..., settings 1a2b3c4d (max_tokens 16)``; ``settings not recorded`` for runs stored before they were."""
    first: dict[Setup, RunRow] = {}
    for r in runs:
        first.setdefault(r.setup, r)
    groups: dict[tuple[str, str, str], list[Setup]] = {}
    for su in first:
        groups.setdefault((su.profile, su.model, su.endpoint_url), []).append(su)
    out = {}
    for su, run in first.items():
        sibs = groups[(su.profile, su.model, su.endpoint_url)]
        if len(sibs) == 1:
            out[su] = su.label()
        elif run.settings is None:
            out[su] = f"{su.label()}, settings not recorded"
        else:
            flats = [_flat(first[s].settings) for s in sibs if first[s].settings is not None]
            keys = sorted({k for f in flats for k in f if any(g.get(k, None) != f.get(k) for g in flats)})
            mine = _flat(run.settings)
            shown = [f"{k} {json.dumps(mine[k], default=str) if k in mine else '-'}" for k in keys[:3]]
            more = f", {len(keys) - 3} more" if len(keys) > 3 else ""
            which = f" ({', '.join(shown)}{more})" if shown else ""
            out[su] = f"{su.label()}, settings {su.settings_key}{which}"
    return out


def _flat(v: Any, path: str = "") -> dict[str, Any]:
    """A JSON value's leaves by path: ``{"sweeps[0].depths": [0], "max_tokens": 16}`` (lists of plain values whole)."""
    out: dict[str, Any] = {}
    if isinstance(v, dict):
        for k, x in v.items():
            out.update(_flat(x, f"{path}.{k}" if path else str(k)))
    elif isinstance(v, list) and any(isinstance(x, dict | list) for x in v):
        for i, x in enumerate(v):
            out.update(_flat(x, f"{path}[{i}]"))
    else:
        out[path] = v
    return out


@dataclass(frozen=True)
class Point:
    """One run's value of one statistic in one cell, with the median's interval when the run had samples."""

    run: RunRow
    index: int  # position of the run among the store's runs (a view's: its setup's), by start
    value: float
    n: int
    lo: float | None = None
    hi: float | None = None


def _median_interval(cell: CellResult, metric: str) -> tuple[float | None, float | None]:
    """The 95 % percentile-bootstrap interval of the median (:func:`bench.stats.bootstrap_ci`, seed 0)."""
    from bench.gate import cell_samples
    from bench.stats import bootstrap_ci

    xs = cell_samples(cell, metric)
    if len(xs) < 2:
        return None, None
    return bootstrap_ci(xs, resamples=1000)


def _stat_rows(results: Results) -> list[tuple[Any, ...]]:
    rows = []
    for cell in results.cells:
        for metric in STAT_METRICS:
            s = getattr(cell, metric, None)
            if not isinstance(s, dict) or not s.get("n"):
                continue
            if metric.startswith("prompt_tok_s") and not cell.measures_prefill:  # not prefill's: the table's "-"
                continue
            vals = [cell.stat(metric, c) for c in STAT_COLUMNS]
            if all(v is None for v in vals):
                continue
            lo, hi = _median_interval(cell, metric)
            med = vals[STAT_COLUMNS.index("median")]
            if lo is None or hi is None or med is None or not lo <= med <= hi:  # samples that are not the summary's
                lo = hi = None
            rows.append((cell.id, metric, int(s["n"]), *vals, lo, hi))
    return rows


def _run_values(results: Results, source: str, commit: str | None, branch: str | None) -> tuple[Any, ...]:
    server = results.server if isinstance(results.server, dict) else {}
    gate = results.profile.settings.get("gate") if isinstance(results.profile.settings, dict) else None
    return (run_key(results), results.run.id, _started(results), results.created, results.run.duration_s,
            int(results.run.complete), int(results.run.interrupted), results.bench_version, results.schema,
            results.profile.name, redact(results.endpoint.url), results.endpoint.kind, results.endpoint.model,
            str(server.get("backend") or ""), str(server.get("version") or "") or None,
            str(results.machine.get("hostname") or ""), commit, branch, json.dumps(gate or []), source,
            datetime.now(UTC).isoformat(timespec="seconds"), _settings_json(results))


class HistoryStore:
    """An open store (SQLite or PostgreSQL); use :func:`open_store`. Close it (or use it as a context manager)."""

    def __init__(self, conn: Any, kind: str, where: str) -> None:
        self.conn = conn
        self.kind = kind  # "sqlite" | "postgresql"
        self.where = where  # the URL, password hidden, for messages
        self.only: Setup | None = None  # a view of one setup's runs (:meth:`view`)
        self.errors: tuple[type[Exception], ...] = (sqlite3.Error,)
        if kind == "postgresql":
            import psycopg

            self.errors = (psycopg.Error,)
        self._migrate()

    # --- plumbing ---------------------------------------------------------------------------------------------

    def _sql(self, sql: str) -> str:
        if self.kind == "postgresql":
            return sql.replace("?", "%s").replace("{pk}", "BIGSERIAL PRIMARY KEY")
        return sql.replace("{pk}", "INTEGER PRIMARY KEY AUTOINCREMENT")

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cur = self.conn.cursor()
        cur.execute(self._sql(sql), tuple(params))
        return cur

    def _db_error(self, e: Exception, doing: str) -> HistoryError:
        return HistoryError(f"history {self.where}: {doing} failed ({_first_line(e)})")

    def _version(self) -> int:
        if self.kind == "sqlite":
            q = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        else:
            q = ("SELECT 1 FROM information_schema.tables WHERE table_name = 'schema_version' "
                 "AND table_schema = current_schema()")
        if self._exec(q).fetchone() is None:
            return 0
        row = self._exec("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def _migrate(self) -> None:
        try:
            have = self._version()
            if have > SCHEMA_VERSION:
                raise HistoryError(f"history {self.where}: schema version {have} was written by a newer bench "
                                   f"(this one reads up to {SCHEMA_VERSION}); upgrade bench")
            if have == 0:
                self._exec("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied TEXT NOT NULL, "
                           "about TEXT NOT NULL)")
                self.conn.commit()
            for version, about, statements in MIGRATIONS:
                if version <= have:
                    continue
                if self.kind == "sqlite":  # DDL included: the whole migration or none of it
                    self._exec("BEGIN")
                for s in statements:
                    self._exec(s)
                if version == 3:
                    self._backfill_settings()
                self._exec("INSERT INTO schema_version (version, applied, about) VALUES (?, ?, ?)",
                           (version, datetime.now(UTC).isoformat(timespec="seconds"), about))
                self.conn.commit()
            self.conn.commit()
        except HistoryError:
            self.conn.rollback()
            raise
        except self.errors as e:  # the driver's error (sqlite3.Error, psycopg.Error): one line
            self.conn.rollback()
            raise self._db_error(e, "reading or migrating its schema") from None

    def _backfill_settings(self) -> None:
        """Migration 3's data step: a run stored before it whose results file is still where it was read from, and
        is still that run (its :func:`run_key`), gets its settings; the others keep none (``settings not
        recorded``: one setup per profile, model and URL, as before)."""
        from bench.results import load_results

        for pk, key, source in self._exec("SELECT pk, run_key, source FROM runs WHERE settings IS NULL").fetchall():
            try:
                results = load_results(source) if source and os.path.isfile(source) else None
            except (ConfigError, OSError):
                continue
            if results is not None and run_key(results) == key:
                self._exec("UPDATE runs SET settings = ? WHERE pk = ?", (_settings_json(results), pk))

    def schema_versions(self) -> list[int]:
        """The migrations applied, in order."""
        return [int(r[0]) for r in self._exec("SELECT version FROM schema_version ORDER BY version").fetchall()]

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing ----------------------------------------------------------------------------------------------

    def has_run(self, key: str) -> bool:
        """Whether a run with this :func:`run_key` is stored."""
        return self._exec("SELECT 1 FROM runs WHERE run_key = ?", (key,)).fetchone() is not None

    def same_start(self, results: Results) -> list[tuple[str, str]]:
        """``(run_key, source)`` of the stored runs with this run's ``run.id`` and ``run.started`` (the same run,
        or a copy of its file whose figures were edited: another :func:`run_key`)."""
        rows = self._exec("SELECT run_key, source FROM runs WHERE run_id = ? AND started = ? ORDER BY pk",
                          (results.run.id, _started(results))).fetchall()
        return [(str(r[0]), str(r[1] or "")) for r in rows]

    def add(self, results: Results, *, source: str = "", commit: str | None = None,
            branch: str | None = None) -> int:
        """Store one run and its cells' statistics in one transaction; returns the number of statistics rows.

        Raises:
            HistoryError: the run is already stored (same :func:`run_key`: ``run.id``, ``run.started`` and
                figures), or the database failed.
        """
        key = run_key(results)
        try:
            if self.has_run(key):
                raise HistoryError(f"history {self.where}: run {results.run.id} (started {_started(results)}) is "
                                   f"already stored{f' (from {source})' if source else ''}; not added again")
            cols = ", ".join(_RUN_COLUMNS)
            marks = ", ".join("?" for _ in _RUN_COLUMNS)
            cur = self._exec(f"INSERT INTO runs ({cols}) VALUES ({marks}) RETURNING pk",
                             _run_values(results, source, commit, branch))
            pk = int(cur.fetchone()[0])
            rows = _stat_rows(results)
            sql = self._sql("INSERT INTO stats (run_pk, cell, metric, n, mean, median, p10, p90, p99, min, max, "
                            "median_lo, median_hi) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
            self.conn.cursor().executemany(sql, [(pk, *r) for r in rows])
            self.conn.commit()
            return len(rows)
        except HistoryError:
            self.conn.rollback()
            raise
        except self.errors as e:
            self.conn.rollback()
            if _is_unique_violation(e):  # another writer stored it between the check and the insert
                raise HistoryError(f"history {self.where}: run {results.run.id} is already stored; not added "
                                   "again") from None
            raise self._db_error(e, f"adding run {results.run.id}") from None

    # --- reading ----------------------------------------------------------------------------------------------

    def view(self, setup: Setup, label: str | None = None) -> HistoryStore:
        """The same store seen through one setup: :meth:`runs`, :meth:`series`, :meth:`export_rows` hold its runs
        only (positions count its runs); ``where`` names the setup (``label``, else :meth:`Setup.label`). Shares
        the connection: close the store."""
        v = copy.copy(self)
        v.only = setup
        v.where = f"{self.where}: {label or setup.label()}"
        return v

    def runs(self) -> list[RunRow]:
        """Every stored run (a view's: its setup's), in the order they were made (``started``, then when added)."""
        rows = self._exec("SELECT pk, run_id, started, commit_sha, branch, profile, model, backend, hostname, "
                          "gate_rules, source, endpoint_url, settings FROM runs ORDER BY started, pk").fetchall()
        out = []
        for r in rows:
            measured = measured_settings(r[12])
            out.append(RunRow(int(r[0]), r[1], r[2], r[3], r[4], r[5] or "", r[6] or "", r[7] or "", r[8] or "",
                              _json_list(r[9]), r[10] or "", r[11] or "", measured, settings_key(measured)))
        return out if self.only is None else [r for r in out if r.setup == self.only]

    def setups(self, runs: Sequence[RunRow] | None = None) -> list[tuple[Setup, int]]:
        """Every setup with stored runs and its number of runs, in the order of its first run (of ``runs`` when the
        caller has read them already)."""
        count: dict[Setup, int] = {}
        for r in self.runs() if runs is None else runs:
            count[r.setup] = count.get(r.setup, 0) + 1
        return list(count.items())

    def cells(self) -> list[str]:
        """Every cell id with a stored statistic, sorted."""
        return [r[0] for r in self._exec("SELECT DISTINCT cell FROM stats ORDER BY cell").fetchall()]

    def metrics(self) -> list[str]:
        """Every metric with a stored statistic, sorted."""
        return [r[0] for r in self._exec("SELECT DISTINCT metric FROM stats ORDER BY metric").fetchall()]

    def series(self, metric: str, stat: str = "median", cells: Iterable[str] | None = None) -> dict[str, list[Point]]:
        """Each cell's values of ``stat`` of ``metric`` over the runs, oldest first (runs without it skipped).

        Every run of the store, whatever its setup: :meth:`setup_series` (or a :meth:`view`) keeps setups apart."""
        if stat not in STAT_COLUMNS:
            raise ConfigError(f"--stat {stat}: one of {', '.join(STAT_COLUMNS)}")
        runs = self.runs()
        by_pk = {r.pk: (i, r) for i, r in enumerate(runs)}
        want = set(cells) if cells else None
        rows = self._exec(f"SELECT run_pk, cell, {stat}, n, median_lo, median_hi FROM stats WHERE metric = ?",
                          (metric,)).fetchall()
        out: dict[str, list[Point]] = {}
        for pk, cell, value, n, lo, hi in rows:
            if value is None or (want is not None and cell not in want) or int(pk) not in by_pk:
                continue
            i, run = by_pk[int(pk)]
            keep = stat == "median"  # the interval is the median's
            out.setdefault(cell, []).append(Point(run, i, float(value), int(n), lo if keep else None,
                                                  hi if keep else None))
        for pts in out.values():
            pts.sort(key=lambda p: p.index)
        return dict(sorted(out.items()))

    def setup_series(self, metric: str, stat: str = "median",
                     cells: Iterable[str] | None = None) -> dict[tuple[Setup, str], list[Point]]:
        """:meth:`series` split by setup: ``(setup, cell)`` -> its points, oldest first (``index`` still counts
        every run of the store)."""
        out: dict[tuple[Setup, str], list[Point]] = {}
        for cell, pts in self.series(metric, stat, cells).items():
            for p in pts:
                out.setdefault((p.run.setup, cell), []).append(p)
        return out

    def export_rows(self) -> list[dict[str, Any]]:
        """One row per run x cell x metric, runs oldest first (``bench history export --csv``)."""
        runs = {r.pk: (i, r) for i, r in enumerate(self.runs())}
        rows = self._exec("SELECT run_pk, cell, metric, n, mean, median, p10, p90, p99, min, max, median_lo, "
                          "median_hi FROM stats").fetchall()
        out = []
        for pk, cell, metric, n, *vals in rows:
            if int(pk) not in runs:  # a view: another setup's run
                continue
            i, run = runs[int(pk)]
            out.append({"run_index": i, **run.to_dict(), "cell": cell, "metric": metric, "n": n,
                        **dict(zip((*STAT_COLUMNS, "median_lo", "median_hi"), vals))})
        out.sort(key=lambda d: (d["run_index"], d["cell"], d["metric"]))
        return out


def _json_list(text: Any) -> list[dict[str, Any]]:
    try:
        v = json.loads(text or "[]")
    except ValueError:
        return []
    return [t for t in v if isinstance(t, dict)] if isinstance(v, list) else []


def _first_line(e: Exception) -> str:
    return redact(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)


def _is_unique_violation(e: Exception) -> bool:
    if isinstance(e, sqlite3.IntegrityError):
        return "UNIQUE" in str(e)
    return getattr(e, "sqlstate", None) == "23505"  # psycopg: unique_violation


def _hide_password(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    try:
        u = urlsplit(url)
        if u.password:
            netloc = u.netloc.replace(f":{u.password}@", ":***@")
            return urlunsplit(u._replace(netloc=netloc))
    except ValueError:
        pass
    return url


def sqlite_file(url: str | os.PathLike[str] | None, option: str = "--db") -> str | None:
    """The SQLite file a ``--db`` value names (a path, ``sqlite:///path``, None: :data:`DEFAULT_DB`); None for a
    PostgreSQL URL.

    Raises:
        HistoryError: a URL of another scheme (``mysql://...``, ``sqlite://x``), named as ``option``.
    """
    u = os.fspath(url) if url is not None else DEFAULT_DB
    if u.startswith(("postgresql://", "postgres://")):
        return None
    if u.startswith("sqlite:///"):
        return u[len("sqlite:///"):]
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", u):
        raise HistoryError(f"{option} {_hide_password(u)}: unsupported: give a file path, sqlite:///path or "
                           "postgresql://...")
    return u


def open_store(url: str | os.PathLike[str] | None = None, option: str = "--db") -> HistoryStore:
    """Open (creating and migrating when needed) the store at ``url``: a path or ``sqlite:///path`` for SQLite
    (default :data:`DEFAULT_DB` in the current folder), ``postgresql://...`` for PostgreSQL. Messages name the
    value as ``option`` (the command-line option that gave it: ``--db``, ``--history``).

    Raises:
        HistoryError: the database cannot be opened or reached, psycopg is missing, its schema is newer, or the URL
            has another scheme.
    """
    path = sqlite_file(url, option)
    if path is None:
        return _open_postgres(os.fspath(url or ""), option)
    if os.path.isdir(path):
        raise HistoryError(f"{option} {path}: is a folder (give a file, e.g. {os.path.join(path, DEFAULT_DB)})")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise HistoryError(f"{option} {path}: its folder {parent} does not exist (make it, or give another path)")
    try:
        conn = sqlite3.connect(path, timeout=30)
        conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.Error as e:
        raise HistoryError(f"{option} {path}: cannot open it as SQLite ({_first_line(e)})") from None
    return HistoryStore(conn, "sqlite", path)


def _open_postgres(url: str, option: str) -> HistoryStore:
    where = _hide_password(url)
    try:
        import psycopg
    except ImportError:
        raise HistoryError(f"{option} {where}: PostgreSQL needs psycopg (pip install 'bench[history]')") from None
    try:
        conn = psycopg.connect(url, connect_timeout=10)
    except psycopg.Error as e:
        raise HistoryError(f"{option} {where}: cannot connect ({_first_line(e)})") from None
    except (ValueError, TypeError) as e:  # a malformed URL
        raise HistoryError(f"{option} {where}: not a usable PostgreSQL URL ({_first_line(e)})") from None
    return HistoryStore(conn, "postgresql", where)
