"""Client behaviour that needs no engine: URLs, pool size, API key hygiene, unreachable endpoints."""

from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench.client import ClientSettings, make_http_client, normalize_url, root_url
from bench.errors import ConfigError
from bench.replay import Case, serve_case

KEY = "sk-test-0123456789abcdefSECRET"


def test_normalize_url() -> None:
    assert normalize_url("http://h:8000") == "http://h:8000/v1"
    assert normalize_url("http://h:8000/") == "http://h:8000/v1"
    assert normalize_url("h:8000") == "http://h:8000/v1"
    assert normalize_url("https://api.x.com/openai/v1/") == "https://api.x.com/openai/v1"
    assert root_url("http://h:1/v1") == "http://h:1"
    with pytest.raises(ConfigError):
        normalize_url("ftp://h/v1")


def test_pool_never_caps_concurrency() -> None:
    c = make_http_client(ClientSettings(), concurrency=1000)
    pool = c._transport.inner._pool  # httpx internals: the only way to see the limit it was given
    assert pool._max_connections is None or pool._max_connections >= 1000


def _echo_key_case(status: int) -> Case:
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {KEY}", "code": "invalid_api_key"}})
    return Case("key", "echoes the key", "chat", status, {"content-type": "application/json"},
                ((1.0, body.encode()),), {})


@pytest.mark.parametrize("as_json, verbose", [(True, False), (False, False), (False, True)])
def test_api_key_never_printed(monkeypatch, capsys, caplog, as_json, verbose) -> None:
    monkeypatch.setenv("BENCH_TEST_KEY", KEY)
    caplog.set_level("DEBUG", logger="bench")
    with serve_case(_echo_key_case(401)) as base:
        args = (["-v"] if verbose else []) + ["probe", base, "--model", "m", "--api-key-env", "BENCH_TEST_KEY"]
        rc = main(args + (["--json"] if as_json else []))
    out, err = capsys.readouterr()
    assert rc == 5
    assert KEY not in out and KEY not in err and KEY not in caplog.text
    assert "Bearer ***" in caplog.text  # the request was logged, with the key hidden
    assert "401" in err
    if not verbose:
        assert len(err.strip().splitlines()) == 1


def test_unreachable_url_is_one_line_and_exit_4(capsys) -> None:
    rc = main(["probe", "http://127.0.0.1:9/v1", "--connect-timeout", "2"])
    err = capsys.readouterr().err
    assert rc == 4
    assert len(err.strip().splitlines()) == 1 and "cannot reach" in err


def test_bad_option_is_exit_3(capsys) -> None:
    assert main(["probe", "http://127.0.0.1:9/v1", "--max-tokens", "0"]) == 3
    assert "--max-tokens" in capsys.readouterr().err
