"""Prompt body content: four kinds of deterministic, unbounded text streams.

Every kind yields an endless stream of text from a ``(kind, seed)`` pair. The same pair always
produces the same characters (across processes and machines with the same Python minor version
for ``code``); different seeds start at different places and/or produce different content, so the
streams of one wave of requests do not share text.

Kinds
-----
``prose``
    English paragraphs shipped with the package (``bench/prompts/data/prose.txt``, written for
    this project). Each cycle through the paragraphs uses a fresh seeded shuffle.
``code``
    Python source read from the running interpreter's standard library (PSF license). A fixed,
    sorted list of large modules is read lazily, one file at a time, starting at a seeded file
    and line.
``structured``
    Generated markdown tables, log lines, CSV records and ``key = value`` config sections.
``json``
    Generated JSON documents (nested objects, arrays, numbers, strings, booleans, nulls).
"""

from __future__ import annotations

import functools
import json
import random
import sysconfig
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "KINDS",
    "INSTRUCTIONS",
    "CODE_MODULES",
    "instruction_for",
    "text_stream",
    "TextStream",
    "stream_text",
]

#: The four content kinds, in a fixed order.
KINDS: tuple[str, ...] = ("prose", "code", "structured", "json")

#: Task instruction per kind, placed after the body for decode benchmarks. Each asks for a long
#: answer so that the model keeps generating.
INSTRUCTIONS: dict[str, str] = {
    "prose": (
        "Continue this story from exactly where it stops. Write many more paragraphs in the "
        "same voice, adding new scenes, characters and details. Do not summarise."
    ),
    "code": (
        "Explain the code above in detail: walk through every class and function, what it does, "
        "how the parts fit together, and which edge cases it handles."
    ),
    "structured": (
        "Summarise the tables, logs, records and settings above section by section: describe "
        "the columns and keys, notable values, totals, trends and anomalies."
    ),
    "json": (
        "Produce a JSON object that describes the documents above: for every record type list "
        "each field with its value type, an example value and simple statistics."
    ),
}

#: Standard-library modules used for the ``code`` kind, in stream order. Only those present in the
#: running interpreter are used; files are read lazily, one at a time.
CODE_MODULES: tuple[str, ...] = (
    "argparse.py",
    "ast.py",
    "calendar.py",
    "configparser.py",
    "dataclasses.py",
    "datetime.py",
    "difflib.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "inspect.py",
    "ipaddress.py",
    "pathlib.py",
    "pickletools.py",
    "shutil.py",
    "statistics.py",
    "subprocess.py",
    "tarfile.py",
    "textwrap.py",
    "threading.py",
    "typing.py",
    "zipfile.py",
)


def instruction_for(kind: str) -> str:
    """Return the decode-benchmark task instruction for ``kind`` (one short English sentence pair).

    Raises ``ValueError`` for an unknown kind.
    """
    _check_kind(kind)
    return INSTRUCTIONS[kind]


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown prompt kind {kind!r}; expected one of {', '.join(KINDS)}")


def _rng(kind: str, seed: int) -> random.Random:
    # String seeds are hashed with SHA-512 by random.Random: stable across processes.
    return random.Random(f"bench.prompts:{kind}:{int(seed)}")


# --------------------------------------------------------------------------------------- prose


@functools.lru_cache(maxsize=1)
def _prose_paragraphs() -> tuple[str, ...]:
    raw = resources.files("bench.prompts").joinpath("data/prose.txt").read_text(encoding="utf-8")
    paras = [" ".join(p.split()) for p in raw.split("\n\n")]
    paras = [p for p in paras if p and not p.startswith("#")]
    if not paras:  # pragma: no cover - packaging error
        raise RuntimeError("bench/prompts/data/prose.txt is empty")
    return tuple(paras)


def _prose_stream(seed: int) -> Iterator[str]:
    rng = _rng("prose", seed)
    paras = list(_prose_paragraphs())
    last = None
    while True:
        rng.shuffle(paras)
        if paras[0] == last and len(paras) > 1:  # no paragraph twice in a row across cycles
            paras[0], paras[-1] = paras[-1], paras[0]
        for p in paras:
            yield p + "\n\n"
        last = paras[-1]


# ---------------------------------------------------------------------------------------- code


@functools.lru_cache(maxsize=1)
def _code_files() -> tuple[Path, ...]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = tuple(stdlib / name for name in CODE_MODULES if (stdlib / name).is_file())
    if found:
        return found
    # Fallback for interpreters shipped without .py sources: this package's own source.
    pkg = Path(__file__).resolve().parent.parent
    own = tuple(sorted(p for p in pkg.rglob("*.py") if p.stat().st_size > 0))
    if not own:  # pragma: no cover
        raise RuntimeError("no Python source files found for the 'code' prompt kind")
    return own


@functools.lru_cache(maxsize=8)
def _read_source(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\t", "    ")


def _code_stream(seed: int) -> Iterator[str]:
    rng = _rng("code", seed)
    files = list(_code_files())
    start = rng.randrange(len(files))
    first = _read_source(files[start])
    # Start on a seeded line in the first two thirds of the first file.
    off = rng.randrange(max(1, (len(first) * 2) // 3))
    nl = first.find("\n", off)
    off = 0 if nl < 0 else nl + 1
    yield f"# file: {files[start].name}\n"
    yield first[off:]
    order = files[start + 1 :] + files[:start]
    while True:
        for path in order:
            yield f"\n# file: {path.name}\n"
            yield _read_source(path)
        order = list(files)
        rng.shuffle(order)


# ---------------------------------------------------------------------------------- structured

_FIRST = (
    "Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas",
    "Kofi", "Lena", "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Sven", "Tariq",
    "Uma", "Victor", "Wen", "Ximena", "Yusuf", "Zoe",
)
_LAST = (
    "Abbott", "Bauer", "Castillo", "Duarte", "Eriksen", "Fontaine", "Garcia", "Hoffmann",
    "Ibarra", "Jensen", "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrov",
    "Quinn", "Rossi", "Santos", "Tanaka", "Ueda", "Vasquez", "Weber", "Yilmaz", "Zeller",
)
_CITIES = (
    "Lisbon", "Oslo", "Nairobi", "Osaka", "Quito", "Tallinn", "Porto", "Hanoi", "Perth",
    "Montreal", "Cusco", "Bergen", "Kraków", "Valparaíso", "Tbilisi", "Accra", "Leeds",
    "Dunedin", "Seville", "Winnipeg",
)
_PRODUCTS = (
    "steel bracket", "oak shelf", "LED panel", "copper pipe", "ceramic tile", "hinge set",
    "water pump", "air filter", "solar cell", "cable reel", "brass valve", "glass jar",
    "rubber seal", "drill bit", "fan motor", "paint roller", "wool blanket", "tent pole",
)
_SERVICES = (
    "api-gateway", "auth", "billing", "catalog", "checkout", "indexer", "mailer", "payments",
    "scheduler", "search", "storage", "telemetry", "thumbnailer", "worker",
)
_LEVELS = ("DEBUG", "INFO", "INFO", "INFO", "WARN", "ERROR")
_LOG_MSGS = (
    "request completed status={status} duration_ms={ms} path=/v1/{word}/{n}",
    "cache miss key={word}:{n} fallback=origin latency_ms={ms}",
    "retrying upstream call attempt={small} backoff_ms={ms} target={service}",
    "user {first}.{last} signed in from {city} session={hexid}",
    "queue depth={n} consumers={small} lag_ms={ms}",
    "wrote {n} rows to table {word}_events in {ms} ms",
    "connection pool exhausted size={small} waiting={n}",
    "scheduled job {word}-sync next_run_in={ms}s",
    "invalid payload field={word} reason=\"expected integer, got string\"",
    "health check ok uptime_s={n} rss_mb={ms}",
)
_WORDS = (
    "alpha", "orders", "ledger", "invoice", "profile", "report", "archive", "metrics",
    "session", "upload", "preview", "export", "inventory", "shipment", "review", "coupon",
)
_STATUSES = ("active", "pending", "shipped", "returned", "cancelled", "on hold")


def _name(rng: random.Random) -> tuple[str, str]:
    return rng.choice(_FIRST), rng.choice(_LAST)


def _md_table(rng: random.Random, block: int) -> str:
    rows = rng.randint(8, 20)
    out = [
        f"## Inventory snapshot {block} ({rng.choice(_CITIES)} warehouse)\n",
        "| sku | item | region | qty | unit price | status |",
        "|-----|------|--------|----:|-----------:|--------|",
    ]
    for _ in range(rows):
        out.append(
            f"| {rng.choice('ABCDEFGH')}{rng.randint(1000, 9999)} | {rng.choice(_PRODUCTS)} "
            f"| {rng.choice(_CITIES)} | {rng.randint(0, 5000)} | {rng.uniform(0.5, 900):.2f} "
            f"| {rng.choice(_STATUSES)} |"
        )
    return "\n".join(out) + "\n\n"


def _log_lines(rng: random.Random, block: int) -> str:
    n = rng.randint(10, 30)
    t = rng.randint(0, 86_399)
    day = rng.randint(1, 28)
    month = rng.randint(1, 12)
    out = [f"## Service log excerpt {block}\n"]
    for _ in range(n):
        t = (t + rng.randint(0, 45)) % 86_400
        first, last = _name(rng)
        msg = rng.choice(_LOG_MSGS).format(
            status=rng.choice((200, 200, 200, 201, 204, 304, 400, 404, 429, 500, 503)),
            ms=rng.randint(1, 4000),
            word=rng.choice(_WORDS),
            n=rng.randint(1, 99_999),
            small=rng.randint(1, 9),
            service=rng.choice(_SERVICES),
            first=first.lower(),
            last=last.lower(),
            city=rng.choice(_CITIES),
            hexid=f"{rng.getrandbits(48):012x}",
        )
        out.append(
            f"2024-{month:02d}-{day:02d}T{t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}."
            f"{rng.randint(0, 999):03d}Z {rng.choice(_LEVELS):<5} [{rng.choice(_SERVICES)}] {msg}"
        )
    return "\n".join(out) + "\n\n"


def _csv_records(rng: random.Random, block: int) -> str:
    n = rng.randint(10, 25)
    out = [f"## Customer export {block} (CSV)\n", "id,first_name,last_name,city,orders,balance,joined"]
    for _ in range(n):
        first, last = _name(rng)
        out.append(
            f"{rng.randint(10_000, 999_999)},{first},{last},{rng.choice(_CITIES)},"
            f"{rng.randint(0, 300)},{rng.uniform(-500, 20_000):.2f},"
            f"{rng.randint(2015, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        )
    return "\n".join(out) + "\n\n"


def _config(rng: random.Random, block: int) -> str:
    out = [f"## Deployment config {block}\n"]
    for _ in range(rng.randint(2, 4)):
        svc = rng.choice(_SERVICES)
        out.append(f"[{svc}]")
        out.append(f"host = {svc}.{rng.choice(_CITIES).lower()}.internal")
        out.append(f"port = {rng.randint(1024, 65535)}")
        out.append(f"workers = {rng.choice((1, 2, 4, 8, 16, 32))}")
        out.append(f"timeout_seconds = {rng.choice((5, 10, 30, 60, 120))}")
        out.append(f"log_level = {rng.choice(_LEVELS).lower()}")
        out.append(f"feature_{rng.choice(_WORDS)} = {rng.choice(('true', 'false'))}")
        out.append(f"max_body_kb = {rng.randint(16, 8192)}")
        out.append(f"owner = {'.'.join(_name(rng)).lower()}")
        out.append("")
    return "\n".join(out) + "\n"


def _structured_stream(seed: int) -> Iterator[str]:
    rng = _rng("structured", seed)
    makers = (_md_table, _log_lines, _csv_records, _config)
    block = rng.randint(1, 900)
    while True:
        yield rng.choice(makers)(rng, block)
        block += 1


# ---------------------------------------------------------------------------------------- json


def _iso(rng: random.Random) -> str:
    return (
        f"{rng.randint(2018, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
        f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"
    )


def _json_user(rng: random.Random, i: int) -> dict[str, Any]:
    first, last = _name(rng)
    return {
        "type": "user",
        "id": i,
        "name": {"first": first, "last": last},
        "email": f"{first.lower()}.{last.lower()}@example.org",
        "address": {
            "city": rng.choice(_CITIES),
            "postcode": f"{rng.randint(1000, 99999)}",
            "geo": {"lat": round(rng.uniform(-60, 70), 5), "lon": round(rng.uniform(-180, 180), 5)},
        },
        "tags": rng.sample(_WORDS, rng.randint(0, 4)),
        "active": rng.random() < 0.8,
        "score": round(rng.uniform(0, 100), 2),
        "created_at": _iso(rng),
        "manager_id": None if rng.random() < 0.3 else rng.randint(1, i + 1),
    }


def _json_order(rng: random.Random, i: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {
            "sku": f"{rng.choice('ABCDEFGH')}{rng.randint(1000, 9999)}",
            "name": rng.choice(_PRODUCTS),
            "qty": rng.randint(1, 12),
            "unit_price": round(rng.uniform(0.5, 400), 2),
        }
        for _ in range(rng.randint(1, 5))
    ]
    total = round(sum(int(it["qty"]) * float(it["unit_price"]) for it in items), 2)
    return {
        "type": "order",
        "id": f"ord_{rng.getrandbits(40):010x}",
        "customer_id": rng.randint(1, 99_999),
        "status": rng.choice(_STATUSES),
        "items": items,
        "total": total,
        "currency": rng.choice(("EUR", "USD", "JPY", "NOK", "KES")),
        "shipping": {"city": rng.choice(_CITIES), "express": rng.random() < 0.25},
        "placed_at": _iso(rng),
    }


def _json_metrics(rng: random.Random, i: int) -> dict[str, Any]:
    n = rng.randint(4, 10)
    return {
        "type": "metrics",
        "service": rng.choice(_SERVICES),
        "window": {"start": _iso(rng), "seconds": rng.choice((60, 300, 900))},
        "latency_ms": {
            "p50": round(rng.uniform(1, 40), 1),
            "p95": round(rng.uniform(40, 400), 1),
            "p99": round(rng.uniform(400, 2500), 1),
        },
        "requests": rng.randint(100, 500_000),
        "errors": {str(code): rng.randint(0, 500) for code in rng.sample((400, 404, 429, 500, 503), 3)},
        "samples": [round(rng.gauss(100, 25), 2) for _ in range(n)],
        "healthy": rng.random() < 0.9,
    }


def _json_stream(seed: int) -> Iterator[str]:
    rng = _rng("json", seed)
    makers = (_json_user, _json_order, _json_metrics)
    i = rng.randint(1, 50_000)
    while True:
        doc = rng.choice(makers)(rng, i)
        yield json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        i += 1


# ------------------------------------------------------------------------------------- public

_STREAMS = {
    "prose": _prose_stream,
    "code": _code_stream,
    "structured": _structured_stream,
    "json": _json_stream,
}


def text_stream(kind: str, seed: int) -> Iterator[str]:
    """Return an endless iterator of text chunks for ``(kind, seed)``.

    Chunks are ``str`` pieces of varying size (a paragraph, a source file, a table, a JSON
    document). The concatenation is deterministic for a given pair. Raises ``ValueError`` for
    an unknown kind.
    """
    _check_kind(kind)
    return _STREAMS[kind](int(seed))


class TextStream:
    """A lazily extended, cached prefix of the ``(kind, seed)`` text stream.

    ``take(n)`` returns the first ``n`` characters of the stream, pulling only as many chunks
    as needed (for ``code``: only as many stdlib files as needed).
    """

    def __init__(self, kind: str, seed: int) -> None:
        self.kind = kind
        self.seed = int(seed)
        self._it = text_stream(kind, seed)
        self._parts: list[str] = []
        self._len = 0
        self._joined = ""

    def __len__(self) -> int:
        """Number of characters materialised so far."""
        return self._len

    def ensure(self, n_chars: int) -> None:
        """Materialise at least ``n_chars`` characters of the stream."""
        while self._len < n_chars:
            chunk = next(self._it)
            self._parts.append(chunk)
            self._len += len(chunk)

    def take(self, n_chars: int) -> str:
        """Return the first ``n_chars`` characters of the stream (``str`` of exactly that length)."""
        n_chars = max(0, int(n_chars))
        self.ensure(n_chars)
        if len(self._joined) < n_chars:
            self._joined = "".join(self._parts)
            self._parts = [self._joined]
        return self._joined[:n_chars]


def stream_text(kind: str, seed: int, n_chars: int) -> str:
    """Return the first ``n_chars`` characters of the ``(kind, seed)`` stream."""
    return TextStream(kind, seed).take(n_chars)
