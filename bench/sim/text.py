"""The sim's tokenizer and output text.

Tokenizer (documented in docs/sim.md): one token per match of the regular expression ``\\s*\\S+``, i.e. one
token per maximal run of non-whitespace characters, together with the whitespace before it. Whitespace at
the very end of a text belongs to no token; an empty or all-whitespace text has 0 tokens. The id of a token is
``zlib.crc32(word.encode("utf-8")) & 0x7FFFFFFF`` where ``word`` is the non-whitespace part, so ids are
deterministic across processes and runs.

Output text: every output token is one word from WORDS with a leading space (" the", " of", ...), so the
output re-tokenizes to exactly ``completion_tokens`` tokens.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from typing import Any

__all__ = ["tokenize", "count_tokens", "token_id", "output_words", "WORDS", "chat_prompt_tokens", "chat_prompt",
           "image_token_ids"]

_TOKEN_RE = re.compile(r"\s*(\S+)")

WORDS: tuple[str, ...] = tuple(
    " " + w
    for w in (
        "the of and to a in is that for it as was with be by on not he this are or his from at which but "
        "have an they you were her she there one all we their been has when who will more no if out so "
        "said what up its about into than them can only other new some could time these two may then do "
        "first any my now such like our over man me even most made after also did many before must "
        "through back years where much your way well down should because each just those people how too "
        "little state good very make world still own see men work long get here between both life being "
        "under never day same another know while last might us great old year off come since against go "
        "came right used take three"
    ).split()
)


def token_id(word: str) -> int:
    return zlib.crc32(word.encode("utf-8")) & 0x7FFFFFFF


def tokenize(text: str) -> list[int]:
    """Token ids of ``text`` (one per ``\\s*\\S+`` match)."""
    return [token_id(m) for m in _TOKEN_RE.findall(text)]


def count_tokens(text: str) -> int:
    return sum(1 for _ in _TOKEN_RE.finditer(text))


def image_token_ids(url: str, count: int) -> list[int]:
    """The ``count`` prompt token ids an image stands for: derived from ``zlib.crc32`` of its URL, so the same
    image gives the same ids (a prefix cache can match it) and different images differ."""
    h = zlib.crc32(url.encode("utf-8"))
    return [(h * 2654435761 + i * 40503) & 0x7FFFFFFF for i in range(count)]


def _content_parts(content: Any) -> Iterable[tuple[str, str]]:
    """``("text", text)`` and ``("image", url)`` items of one message's content, in order."""
    if content is None:
        return
    if isinstance(content, str):
        yield "text", content
        return
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                yield "text", part
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                yield "text", part["text"]
            elif isinstance(part, dict) and part.get("type") == "image_url":
                img = part.get("image_url")
                url = img.get("url") if isinstance(img, dict) else img
                if not isinstance(url, str) or not url:
                    raise ValueError("an image_url part needs image_url.url (a string)")
                yield "image", url
        return
    raise ValueError("message content must be a string, a list of parts, or null")


def chat_prompt(messages: Any, image_tokens: int = 0) -> tuple[list[int], int]:
    """``(prompt token ids, images)`` of a chat request: the tokens of every message's content parts in order
    (each text tokenized on its own; each ``image_url`` part ``image_tokens`` ids from :func:`image_token_ids`).
    Roles, names and the chat template add no tokens."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    out: list[int] = []
    images = 0
    for msg in messages:
        if not isinstance(msg, dict):
            raise ValueError("each message must be an object")
        for kind, value in _content_parts(msg.get("content")):
            if kind == "text":
                out.extend(tokenize(value))
            else:
                images += 1
                out.extend(image_token_ids(value, image_tokens))
    return out, images


def chat_prompt_tokens(messages: Any, image_tokens: int = 0) -> list[int]:
    """Prompt token ids of a chat request (:func:`chat_prompt`)."""
    return chat_prompt(messages, image_tokens)[0]


def output_words(request_no: int, start: int, count: int) -> str:
    """Text of output tokens ``start .. start+count-1`` (0-based) of request ``request_no``."""
    n = len(WORDS)
    base = request_no * 7
    return "".join(WORDS[(base + i) % n] for i in range(start, start + count))
