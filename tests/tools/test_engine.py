"""`bench probe` against the real llama-server with SmolLM2-135M, both endpoints."""

from __future__ import annotations

import json

import pytest

from bench.cli.app import main

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_probe_real_engine(llama_server, capsys, endpoint) -> None:
    rc = main(["probe", llama_server, "--endpoint", endpoint, "--max-tokens", "32", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    rec = json.loads(out)
    assert rec["ok"] is True
    assert rec["ttft_ms"] > 0
    assert rec["usage"] is not None
    assert rec["output_tokens"] == rec["usage"]["completion_tokens"] and not rec["output_tokens_estimated"]
    assert rec["prompt_tokens"] == rec["usage"]["prompt_tokens"] > 0
    assert rec["decode_tok_s"] > 0
    assert rec["chunks"] >= 2 and rec["itl_count"] >= 1
    assert rec["e2e_ms"] > rec["ttft_ms"]
    # llama.cpp reports its own prompt timing: prefill comes from it
    assert rec["prefill_source"] == "server" and rec["prefill_tok_s"] > 0


def test_probe_embedded_default_endpoint(capsys) -> None:
    """No URL: bench starts the embedded llama-server itself (the quick start's path)."""
    rc = main(["probe", "--max-tokens", "8", "--json"])
    out, _ = capsys.readouterr()
    assert rc == 0 and json.loads(out)["ok"] is True
