"""The tools a tool-calling workload offers (``--tools builtin|FILE.json``) and its ``tool_choice`` (docs/workloads.md).

Parsed once, here: ``builtin`` is :data:`BUILTIN_TOOLS` (two small functions, the shape of an agent's first turn);
a file holds an OpenAI ``tools`` list (or ``{"tools": [...]}``) whose every entry is a function with a name.
``tool_choice``: ``auto``, ``required``, ``none`` or the name of one of the tools (which forces that function).
A choice of ``required`` or a function name forces a call: a request answered without one is counted
(``tool_calls_missing``), never hidden.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.errors import ConfigError

__all__ = ["BUILTIN_TOOLS", "TOOL_RESULT", "load_tools", "tool_choice_value", "forces_call", "assistant_turn"]

TOOL_RESULT = '{"status": "ok", "result": "done"}'  # what a session sends back for each tool call it got

BUILTIN_TOOLS: tuple[dict[str, Any], ...] = (
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_docs",
        "description": "Search the documentation and return the best passages.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "top_k": {"type": "integer", "minimum": 1, "maximum": 20}},
            "required": ["query"]}}},
)


def load_tools(spec: str) -> tuple[dict[str, Any], ...]:
    """``"builtin"`` or a JSON file's tools, checked; ``""`` -> no tools. Raises ConfigError naming the flag."""
    if not spec:
        return ()
    if spec == "builtin":
        return BUILTIN_TOOLS
    path = Path(spec)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"--tools: cannot read {spec} ({e.strerror or e}); give 'builtin' or a JSON file") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"--tools: {spec} is not JSON ({e})") from None
    tools = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(tools, list) or not tools:
        raise ConfigError(f"--tools: {spec} must hold a non-empty list of tools (or {{\"tools\": [...]}})")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ConfigError(f"--tools: {spec}: tool {i} is not {{\"type\": \"function\", \"function\": "
                              "{\"name\": ...}}")
    return tuple(tools)


def _names(tools: tuple[dict[str, Any], ...]) -> list[str]:
    return [str(t["function"]["name"]) for t in tools]


def tool_choice_value(choice: str, tools: tuple[dict[str, Any], ...]) -> str | dict[str, Any] | None:
    """The request's ``tool_choice``: None (not sent) for ``""``, the keyword, or a function by name."""
    if not choice:
        return None
    if choice in ("auto", "required", "none"):
        return choice
    if choice not in _names(tools):
        raise ConfigError(f"--tool-choice: {choice!r} is not auto, required, none or one of the tools "
                          f"({', '.join(_names(tools)) or 'none given: add --tools'})")
    return {"type": "function", "function": {"name": choice}}


def forces_call(choice: str | dict[str, Any] | None) -> bool:
    """A choice that obliges the model to call a tool (``required`` or a named function)."""
    return choice == "required" or isinstance(choice, dict)


def assistant_turn(content: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages a chat client adds after an answer: the assistant message (its content, and its tool calls as
    the server streamed them) and, per tool call, a ``tool`` message with :data:`TOOL_RESULT`."""
    if not calls:
        return [{"role": "assistant", "content": content}]
    msg: dict[str, Any] = {"role": "assistant", "content": content or None, "tool_calls": [
        {"id": c.get("id") or f"call_{i}", "type": "function",
         "function": {"name": c.get("name", ""), "arguments": c.get("arguments", "")}} for i, c in enumerate(calls)]}
    return [msg, *({"role": "tool", "tool_call_id": t["id"], "content": TOOL_RESULT} for t in msg["tool_calls"])]
