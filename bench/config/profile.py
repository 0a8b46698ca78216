"""Profiles: validated, frozen run settings read from TOML (``profiles/*.toml``, documented in docs/profiles.md).

A profile is a set of defaults plus one or more ``[[sweep]]`` tables; each sweep expands into cells
depth x streams x prompt. Every key is checked once, here: an unknown key, a wrong type or a bad value raises
:class:`ConfigError` whose one-line message names the key (``profile quick: sweep[1].streams: ...``).
"""

from __future__ import annotations

import itertools
import json
import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.config.slo import SLO, parse_slo
from bench.errors import ConfigError
from bench.prompts.content import KINDS as PROMPT_KINDS

if TYPE_CHECKING:
    from bench.gate import Rule

__all__ = ["Profile", "Sweep", "Cell", "load_profile", "profile_settings", "settings_diff", "parse_profile", "parse_depth",
           "parse_depths", "parse_ints", "parse_image_size", "parse_image_sizes", "parse_counts", "PROFILES_DIR",
           "IMAGE_FORMATS", "TOOL_CHOICES"]

def _profiles_dir() -> Path:
    """The shipped profiles: the repository's ``profiles/`` (a checkout or editable install), else the copy
    installed inside the package (``bench.shipped_profiles``)."""
    package = Path(__file__).resolve().parents[1]
    repo = package.parent / "profiles"
    if repo.is_dir():
        return repo
    return package / "shipped_profiles"


PROFILES_DIR = _profiles_dir()
_DEPTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")
_SIZE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
IMAGE_FORMATS = ("png", "jpeg")
TOOL_CHOICES = ("auto", "required", "none")
MAX_IMAGE_SIDE = 8192


def parse_image_size(s: str, what: str = "--image-size") -> str:
    """``"512x512"`` -> ``"512x512"`` (normalized ``WxH``, each side 1..8192 pixels). Raises ConfigError."""
    m = _SIZE.match(str(s))
    if not m:
        raise ConfigError(f"{what}: {s!r} is not WIDTHxHEIGHT in pixels, like 512x512")
    w, h = int(m.group(1)), int(m.group(2))
    if not (1 <= w <= MAX_IMAGE_SIDE and 1 <= h <= MAX_IMAGE_SIDE):
        raise ConfigError(f"{what}: {s!r}: each side must be 1..{MAX_IMAGE_SIDE} pixels")
    return f"{w}x{h}"


def parse_image_sizes(s: str) -> list[str]:
    """Comma list of image sizes (``--image-size 512x512,1024x1024``). Raises ConfigError."""
    out = [parse_image_size(x) for x in s.split(",") if x.strip()]
    if not out:
        raise ConfigError(f"--image-size: {s!r} names no size (give WIDTHxHEIGHT, like 512x512)")
    return out


def parse_counts(s: str, what: str) -> list[int]:
    """Comma list of ints >= 0 (``--images 0,1,4``). Raises ConfigError naming ``what``."""
    return parse_ints(s, what, minimum=0)


def parse_depth(s: str | int) -> int:
    """``"32k"`` -> 32768 (k = 1024 tokens), ``"1m"`` -> 1048576, ``"500"`` -> 500. Raises ConfigError."""
    if isinstance(s, int) and not isinstance(s, bool):
        if s < 0:
            raise ConfigError(f"depth {s} is negative")
        return s
    m = _DEPTH.match(str(s))
    if not m:
        raise ConfigError(f"depth {s!r} is not a token count like 0, 4096, 4k, 128k or 1m")
    mult = {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def parse_depths(s: str) -> list[int]:
    """Comma list of depths: ``"0,4k,32k"`` -> [0, 4096, 32768]. Raises ConfigError when it names none."""
    out = [parse_depth(x) for x in s.split(",") if x.strip()]
    if not out:
        raise ConfigError(f"--depths: {s!r} names no depth (give a comma list such as 0,4k,32k)")
    return out


def parse_kinds(s: str) -> list[str]:
    """Comma list of prompt types (``--prompt prose,code``). Raises ConfigError for none or an unknown one."""
    out = [p.strip() for p in s.split(",") if p.strip()]
    if not out:
        raise ConfigError(f"--prompt: {s!r} names no prompt type (choose from {', '.join(PROMPT_KINDS)})")
    bad = [p for p in out if p not in PROMPT_KINDS]
    if bad:
        raise ConfigError(f"--prompt: unknown prompt type {bad[0]!r} (choose from {', '.join(PROMPT_KINDS)})")
    return out


def parse_ints(s: str, what: str, minimum: int = 1) -> list[int]:
    """Comma list of ints >= ``minimum`` (``--streams 1,2,4``). Raises ConfigError naming ``what``."""
    try:
        out = [int(x) for x in s.split(",")]
    except ValueError:
        raise ConfigError(f"{what}: {s!r} is not a comma list of integers (e.g. 1,2,4)") from None
    if not out or any(v < minimum for v in out):
        raise ConfigError(f"{what}: every value must be >= {minimum}, got {s!r}")
    return out


@dataclass(frozen=True, slots=True)
class Sweep:
    """One group of cells: every depth x every stream count x every prompt kind."""

    name: str = "main"
    depths: tuple[int, ...] = (0,)
    streams: tuple[int, ...] = (1,)
    prompts: tuple[str, ...] = ("prose",)
    max_tokens: int | None = None  # None: the profile's
    requests: int | None = None  # None: the profile's
    images: tuple[int, ...] | None = None  # images per request; None: the profile's
    image_sizes: tuple[str, ...] | None = None  # "WxH"; None: the profile's
    thinking: tuple[bool, ...] | None = None  # thinking on/off per cell; None: the profile's


@dataclass(frozen=True, slots=True)
class Cell:
    """One measured cell of a run (depth in prompt tokens; streams = concurrent requests per wave; images per
    request, each ``image_size`` = ``"WxH"`` pixels, ``""`` without images)."""

    sweep: str
    depth: int
    streams: int
    prompt: str
    max_tokens: int
    requests: int
    images: int = 0
    image_size: str = ""
    thinking: bool | None = None
    label: str = ""

    @property
    def id(self) -> str:
        """Stable id used in results and gates: ``d{depth}-s{streams}-{prompt}``, then ``-i{images}-{W}x{H}`` when
        the requests carry images and ``-think`` / ``-nothink`` when the sweep sets thinking per cell. An open-loop
        point's cell is named by its load (``label``: ``rate-10``, ``trace-mooncake``), the id of every line about
        it."""
        if self.label:
            return self.label
        base = f"d{self.depth}-s{self.streams}-{self.prompt}"
        if self.images:
            base += f"-i{self.images}-{self.image_size}"
        if self.thinking is not None:
            base += "-think" if self.thinking else "-nothink"
        return base

    @property
    def image_wh(self) -> tuple[int, int]:
        """``(width, height)`` of each image; ``(0, 0)`` without images."""
        if not self.images:
            return 0, 0
        w, _, h = parse_image_size(self.image_size, f"cell {self.id}").partition("x")
        return int(w), int(h)


@dataclass(frozen=True, slots=True)
class Profile:
    """Validated run settings. Field meanings and units: docs/profiles.md.

    Attributes (the main ones):
        requests: measured requests per cell at least (whole waves: rounded up to a multiple of streams).
        min_waves / max_waves: waves per cell, at least / at most.
        target_ci: stop adding waves once the 95 % CI half-width of the median per-stream decode tok/s is below
            this fraction of the median (0 = off; ``max_waves`` bounds it).
        requests_by_depth: override of ``requests`` for large depths: ``{"32k": 4, "128k": 2}`` (the largest key
            <= the cell's depth applies).
        warmup: warm-up waves per cell (short prompts, short outputs, not measured).
        overhead_probes: tiny requests at the start whose median TTFT is the fixed overhead of a request.
        gate: the ``[[gate]]`` rules, parsed and checked against the cells when the profile is read
            (:func:`bench.gate.parse_rules`); empty: the gate's default rules.
        mode: ``"concurrency"`` (waves of N streams: the sweeps) or an open-loop mode, ``"rate"`` / ``"trace"``
            (docs/load.md), whose settings are the ``[load]`` table (``load``: its key/value pairs). In concurrency
            mode only its ``slo`` is read: each cell's goodput and SLOs (:attr:`slo`).
        overrides: the command-line flags that changed the cells (``--streams``, ``--depths``...), named in the
            results' header so that it does not claim the profile's cells; not a TOML key.
    """

    name: str = "custom"
    description: str = ""
    endpoint: str = "chat"
    max_tokens: int = 256
    requests: int = 4
    min_waves: int = 1
    max_waves: int = 20
    target_ci: float = 0.0
    requests_by_depth: tuple[tuple[int, int], ...] = ()
    warmup: int = 1
    overhead_probes: int = 3
    temperature: float = 0.0
    thinking: bool = False
    prefix_cache: bool = False
    force_length: bool = True
    images: int = 0
    image_size: str = "512x512"
    image_format: str = "jpeg"
    image_source: str = "noise"
    tools: str = ""
    tool_choice: str = ""
    sweeps: tuple[Sweep, ...] = (Sweep(),)
    gate: tuple[Rule, ...] = ()
    gate_budget_waves: int = 0
    mode: str = "concurrency"
    load: tuple[tuple[str, Any], ...] = ()
    source: str = ""
    overrides: tuple[str, ...] = ()

    def cells(self) -> list[Cell]:
        """All cells in run order (sweep by sweep; depth, then streams, then prompt); duplicates dropped."""
        seen: set[str] = set()
        out: list[Cell] = []
        for sw in self.sweeps:
            images = sw.images if sw.images is not None else (self.images,)
            sizes = sw.image_sizes if sw.image_sizes is not None else (self.image_size,)
            thinks: tuple[bool | None, ...] = sw.thinking if sw.thinking is not None else (None,)
            for d, s, p, n, size, th in itertools.product(sw.depths, sw.streams, sw.prompts, images, sizes, thinks):
                req = sw.requests if sw.requests is not None else self.requests_for_depth(d)
                c = Cell(sw.name, d, s, p, sw.max_tokens or self.max_tokens, req, n, size if n else "", th)
                if c.id not in seen:
                    seen.add(c.id)
                    out.append(c)
        return out

    @property
    def slo(self) -> str | None:
        """The ``[load]`` key ``slo`` (an SLO string, docs/load.md), or None."""
        v = dict(self.load).get("slo")
        return str(v) if v else None

    @property
    def slo_spec(self) -> SLO | None:
        """:attr:`slo` as typed objectives (checked when the profile was read, so this cannot fail)."""
        return parse_slo(self.slo, "[load] slo") if self.slo else None

    def requests_for_depth(self, depth: int) -> int:
        """``requests``, or the ``requests_by_depth`` entry with the largest depth <= ``depth``."""
        n = self.requests
        for d, r in sorted(self.requests_by_depth):
            if depth >= d:
                n = r
        return n

    def with_overrides(self, **kw: Any) -> Profile:
        """A copy with command-line overrides; ``depths``/``streams``/``prompts``/``max_tokens`` apply to every
        sweep. Raises ConfigError on a bad value."""
        sweeps = self.sweeps
        flags = {"depths": "--depths", "streams": "--streams", "prompts": "--prompt", "max_tokens": "--max-tokens",
                 "requests": "--repeats", "images": "--images", "image_sizes": "--image-size",
                 "thinking": "--thinking", "tools": "--tools", "tool_choice": "--tool-choice"}
        given = tuple(f for k, f in flags.items() if kw.get(k) is not None)
        sweep_kw = {k: kw.pop(k) for k in ("depths", "streams", "prompts", "images", "image_sizes")
                    if kw.get(k) is not None}
        for k in list(kw):
            if kw[k] is None:
                del kw[k]
        if "images" in sweep_kw:  # the first value is also the open-loop modes' (one point, one workload)
            kw["images"] = sweep_kw["images"][0]
        if "image_sizes" in sweep_kw:
            kw["image_size"] = sweep_kw["image_sizes"][0]
        if sweep_kw:
            sweep_kw = {k: tuple(v) for k, v in sweep_kw.items()}
            if "prompts" in sweep_kw:
                _check_prompts(list(sweep_kw["prompts"]), "--prompt")
            sweeps = tuple(replace(sw, **sweep_kw) for sw in sweeps)
        if "max_tokens" in kw:
            sweeps = tuple(replace(sw, max_tokens=None) for sw in sweeps)
        if "thinking" in kw:  # --thinking on|off: every cell, whatever the sweeps say
            sweeps = tuple(replace(sw, thinking=None) for sw in sweeps)
        p = replace(self, sweeps=sweeps, overrides=tuple(dict.fromkeys(self.overrides + given)), **kw)
        _validate_numbers(p, "command line")
        return p


_TOP = {f.name: f for f in fields(Profile)} | {"sweep": None}
_TOP.pop("sweeps")
_TOP.pop("source")
_TOP.pop("overrides")
_SWEEP = {f.name for f in fields(Sweep)}


def _type_check(where: str, key: str, v: Any, typ: type | tuple[type, ...]) -> None:
    if isinstance(v, bool) and typ in (int, float, (int, float)):
        raise ConfigError(f"{where}: {key} must be a number, not {v!r}")
    if not isinstance(v, typ):
        name = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise ConfigError(f"{where}: {key} must be {name}, not {type(v).__name__} {v!r}")


def _check_prompts(v: list[str], where: str) -> None:
    for p in v:
        if p not in PROMPT_KINDS:
            raise ConfigError(f"{where}: unknown prompt type {p!r} (choose from {', '.join(PROMPT_KINDS)})")


def _parse_sweep_images(d: dict[str, Any], where: str) -> dict[str, Any]:
    """A sweep's ``images`` (counts >= 0) and ``image_sizes`` (``"WxH"``)."""
    kw: dict[str, Any] = {}
    if "images" in d:
        _type_check(where, "images", d["images"], list)
        for n in d["images"]:
            _type_check(where, "images", n, int)
            if n < 0:
                raise ConfigError(f"{where}: images must be >= 0, got {n}")
        kw["images"] = tuple(d["images"])
    if "image_sizes" in d:
        _type_check(where, "image_sizes", d["image_sizes"], list)
        kw["image_sizes"] = tuple(parse_image_size(str(x), f"{where}: image_sizes") for x in d["image_sizes"])
    if "thinking" in d:
        _type_check(where, "thinking", d["thinking"], list)
        for v in d["thinking"]:
            _type_check(where, "thinking", v, bool)
        kw["thinking"] = tuple(d["thinking"])
    return kw


def _parse_sweep(d: dict[str, Any], where: str) -> Sweep:
    for k in d:
        if k not in _SWEEP:
            raise ConfigError(f"{where}: unknown key {k!r} (known: {', '.join(sorted(_SWEEP))})")
    kw: dict[str, Any] = {}
    if "name" in d:
        _type_check(where, "name", d["name"], str)
        kw["name"] = d["name"]
    if "depths" in d:
        _type_check(where, "depths", d["depths"], list)
        try:
            kw["depths"] = tuple(parse_depth(x) for x in d["depths"])
        except ConfigError as e:
            raise ConfigError(f"{where}: depths: {e}") from None
    if "streams" in d:
        _type_check(where, "streams", d["streams"], list)
        for s in d["streams"]:
            _type_check(where, "streams", s, int)
            if s < 1:
                raise ConfigError(f"{where}: streams must be >= 1, got {s}")
        kw["streams"] = tuple(d["streams"])
    if "prompts" in d:
        _type_check(where, "prompts", d["prompts"], list)
        _check_prompts(d["prompts"], f"{where}: prompts")
        kw["prompts"] = tuple(d["prompts"])
    kw.update(_parse_sweep_images(d, where))
    for k in ("max_tokens", "requests"):
        if k in d:
            _type_check(where, k, d[k], int)
            if d[k] < 1:
                raise ConfigError(f"{where}: {k} must be >= 1, got {d[k]}")
            kw[k] = d[k]
    for k in ("depths", "streams", "prompts", "images", "image_sizes", "thinking"):
        if k in kw and not kw[k]:
            raise ConfigError(f"{where}: {k} is empty")
    return Sweep(**kw)


def _validate_numbers(p: Profile, where: str) -> None:
    checks = [
        ("max_tokens", p.max_tokens >= 1, ">= 1"),
        ("requests", p.requests >= 1, ">= 1"),
        ("min_waves", p.min_waves >= 1, ">= 1"),
        ("max_waves", p.max_waves >= p.min_waves, ">= min_waves"),
        ("target_ci", 0 <= p.target_ci < 1, "in [0, 1)"),
        ("warmup", p.warmup >= 0, ">= 0"),
        ("overhead_probes", p.overhead_probes >= 0, ">= 0"),
        ("temperature", p.temperature >= 0, ">= 0"),
        ("gate_budget_waves", p.gate_budget_waves >= 0, ">= 0"),
        ("endpoint", p.endpoint in ("chat", "completions"), "'chat' or 'completions'"),
        ("mode", p.mode in ("concurrency", "rate", "trace", "sessions"),
         "'concurrency', 'rate', 'trace' or 'sessions'"),
    ]
    for key, ok, want in checks:
        if not ok:
            raise ConfigError(f"{where}: {key} must be {want}, got {getattr(p, key)!r}")
    _validate_workload(p, where)


def _validate_workload(p: Profile, where: str) -> None:
    """Images, tools and their combinations (docs/workloads.md)."""
    if p.images < 0:
        raise ConfigError(f"{where}: images must be >= 0, got {p.images}")
    parse_image_size(p.image_size, f"{where}: image_size")
    if p.image_format not in IMAGE_FORMATS:
        raise ConfigError(f"{where}: image_format must be one of {', '.join(IMAGE_FORMATS)}, got {p.image_format!r}")
    if not p.image_source:
        raise ConfigError(f"{where}: image_source must be 'noise' or a folder of images")
    if p.endpoint != "chat" and any(c.images for c in p.cells()):
        raise ConfigError(f"{where}: images need the chat endpoint (--endpoint chat); /completions takes text only")
    if p.tool_choice and not p.tools:
        raise ConfigError(f"{where}: tool_choice {p.tool_choice!r} needs tools (--tools builtin or a JSON file)")
    if p.tools and p.endpoint != "chat":
        raise ConfigError(f"{where}: tools need the chat endpoint (--endpoint chat)")
    from bench.config.tools import load_tools, tool_choice_value

    tool_choice_value(p.tool_choice, load_tools(p.tools))  # a bad file or choice fails when the profile is read


def parse_profile(data: dict[str, Any], name: str, source: str = "") -> Profile:
    """Validate a profile dict (parsed TOML). Raises ConfigError naming the bad key."""
    where = f"profile {name}"
    kw: dict[str, Any] = {"name": data.get("name", name), "source": source}
    for k, v in data.items():
        if k not in _TOP:
            raise ConfigError(f"{where}: unknown key {k!r} (see docs/profiles.md)")
        if k in ("sweep", "gate", "requests_by_depth", "name", "load"):
            continue
        f = _TOP[k]
        assert f is not None
        want: Any = {"int": int, "float": (int, float), "bool": bool, "str": str}[str(f.type).split(" ")[0]]
        _type_check(where, k, v, want)
        kw[k] = float(v) if want == (int, float) else v
    if "name" in data:
        _type_check(where, "name", data["name"], str)
    if "requests_by_depth" in data:
        rbd = data["requests_by_depth"]
        _type_check(where, "requests_by_depth", rbd, dict)
        pairs = []
        for dk, rv in rbd.items():
            try:
                dd = parse_depth(dk)
            except ConfigError as e:
                raise ConfigError(f"{where}: requests_by_depth: {e}") from None
            _type_check(where, f"requests_by_depth.{dk}", rv, int)
            if rv < 1:
                raise ConfigError(f"{where}: requests_by_depth.{dk} must be >= 1, got {rv}")
            pairs.append((dd, rv))
        kw["requests_by_depth"] = tuple(sorted(pairs))
    sweeps = data.get("sweep", [{}])
    if isinstance(sweeps, dict):
        sweeps = [sweeps]
    _type_check(where, "sweep", sweeps, list)
    kw["sweeps"] = tuple(_parse_sweep(s, f"{where}: sweep[{i}]") for i, s in enumerate(sweeps))
    gate = data.get("gate", [])
    _type_check(where, "gate", gate, list)
    for i, g in enumerate(gate):
        _type_check(where, f"gate[{i}]", g, dict)
    from bench.gate import check_rule_cells, parse_rules

    rules = parse_rules(gate, where)  # a bad gate rule fails when the profile is read, not after the run
    kw["gate"] = tuple(rules)
    kw["load"] = _parse_load(data.get("load", {}), kw.get("mode", "concurrency"), where)
    p = Profile(**kw)
    _validate_numbers(p, where)
    if not p.cells():
        raise ConfigError(f"{where}: the sweep has no cells (every sweep needs depths, streams and prompts)")
    check_rule_cells(rules, [c.id for c in p.cells()], where)
    return p


def _parse_load(d: Any, mode: str, where: str) -> tuple[tuple[str, Any], ...]:
    """The ``[load]`` table: keys of :class:`bench.load.point.LoadSettings` (docs/profiles.md), checked."""
    from dataclasses import fields as dc_fields

    from bench.config.load import MODES, LoadSettings

    _type_check(where, "load", d, dict)
    if mode not in MODES:
        raise ConfigError(f"{where}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    known = {f.name for f in dc_fields(LoadSettings) if f.init} - {"mode", "exact_count"}  # exact_count: probes
    for k in d:
        if k not in known:
            raise ConfigError(f"{where}: load: unknown key {k!r} (known: {', '.join(sorted(known))})")
    try:
        if mode != "concurrency":
            LoadSettings(mode=mode, **d).check()
        elif "slo" in d:  # the one key concurrency cells read
            parse_slo(d["slo"], "slo")
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"{where}: load: {e}") from None
    return tuple(sorted(d.items()))


def profile_settings(profile: Profile) -> dict[str, Any]:
    """The profile as stored in a results document (``profile.settings``): every field but ``source``, the gate
    rules as the ``[[gate]]`` tables they were read from, so that :func:`bench.gate.parse_rules` reads them back."""
    from dataclasses import asdict

    out = {k: v for k, v in asdict(profile).items() if k not in ("source", "gate")}
    out["gate"] = [r.to_dict() for r in profile.gate]
    return out


def settings_diff(was: dict[str, Any], now: dict[str, Any]) -> str:
    """The profile settings (:func:`profile_settings`) that differ between a stored run and this one, as ``key was -> now`` (the innermost
    differing values, e.g. ``sweeps[0].streams [1, 2] -> [1, 4]``; at most three named); empty when the same."""
    diffs: list[str] = []
    _diff("", json.loads(json.dumps(was, default=str)), json.loads(json.dumps(now, default=str)), diffs)
    return "; ".join(diffs[:3]) + (f"; {len(diffs) - 3} more" if len(diffs) > 3 else "")


def _diff(path: str, a: Any, b: Any, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            _diff(f"{path}.{k}" if path else str(k), a.get(k), b.get(k), out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and any(
            isinstance(x, dict | list) for x in a + b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(f"{path}[{i}]", x, y, out)
    elif a != b:
        out.append(f"{path} {json.dumps(a)} -> {json.dumps(b)}")


def load_profile(name_or_path: str) -> Profile:
    """Load a shipped profile by name (``quick``) or a TOML file by path. A shipped name wins over a file or
    folder of that name in the current folder (``./quick`` names the file). Raises ConfigError."""
    path, shipped_path = Path(name_or_path), PROFILES_DIR / f"{name_or_path}.toml"
    bare = not path.suffix and "/" not in name_or_path and "\\" not in name_or_path
    if (bare and shipped_path.is_file()) or (not path.suffix and not path.exists()):
        path = shipped_path
    if path.is_dir():
        raise ConfigError(f"profile {name_or_path}: is a folder (give a .toml file)")
    if not path.is_file():
        shipped = sorted(p.stem for p in PROFILES_DIR.glob("*.toml") if not p.stem.startswith("sim"))
        raise ConfigError(f"profile {name_or_path!r} not found (shipped: {', '.join(shipped)}; or give a .toml path)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"profile {path}: not valid TOML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"profile {path}: not UTF-8 text (save it as UTF-8)") from None
    except OSError as e:
        raise ConfigError(f"profile {path}: cannot read it ({e.strerror or e})") from None
    return parse_profile(data, path.stem, str(path))
