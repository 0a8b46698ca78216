"""Images for chat requests: ``image_url`` content parts carrying ``data:image/...;base64,`` URLs (docs/workloads.md).

Every request gets its own images unless asked otherwise, so a server's image or prefix cache cannot serve one
request from another's: noise images (``source="noise"``, the default, as NVIDIA AIPerf does) are drawn from a
stream seeded by the request; images from a folder (``source=DIR``) are read, scaled to the size asked, and get a
seeded noise strip along their top row (``unique=False`` leaves both alone). Encoding is Pillow's (PNG or JPEG);
nothing here is timed: callers build a wave's images before the wave starts.

:func:`body_images` counts what a request body carries (images and their decoded bytes), for its record.
"""

from __future__ import annotations

import base64
import io
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.errors import ConfigError
from bench.records import RequestRecord

__all__ = ["ImageSet", "body_images", "image_part", "image_rejection", "image_files", "FORMATS", "DATA_URL_PREFIX",
           "IMAGE_SUFFIXES"]

_IMAGE_ERROR = re.compile(r"image|multimodal|multi-modal|vision|mmproj", re.I)

FORMATS = ("png", "jpeg")
DATA_URL_PREFIX = "data:image/"
JPEG_QUALITY = 90
PNG_COMPRESS_LEVEL = 1  # noise does not compress; a higher level only costs time


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is a dependency
        raise ConfigError("--images needs Pillow: pip install 'pillow==13.0.0'") from None
    return Image


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")


def image_files(source: str) -> tuple[Path, ...]:
    """The image files of an ``--image-source`` folder, sorted; ConfigError when it is no folder or holds none."""
    folder = Path(source)
    if not folder.is_dir():
        raise ConfigError(f"--image-source: {source!r} is neither 'noise' nor a folder")
    files = tuple(sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES))
    if not files:
        raise ConfigError(f"--image-source: {source} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    return files


@dataclass(frozen=True)
class ImageSet:
    """What images one request carries: ``count`` images of ``width`` x ``height`` pixels in ``fmt``, from
    ``source`` (``"noise"`` or a folder of image files)."""

    count: int
    width: int
    height: int
    fmt: str = "jpeg"
    source: str = "noise"
    unique: bool = True
    _files: tuple[Path, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ConfigError(f"--image-format: {self.fmt!r} is not one of {', '.join(FORMATS)}")
        if self.source != "noise":
            files = image_files(self.source)
            object.__setattr__(self, "_files", files)

    def encode(self, seed: str, i: int) -> bytes:
        """Image ``i`` of the request seeded ``seed``, encoded (the file's bytes, before base64)."""
        image = _pil()
        w, h = self.width, self.height
        rng = random.Random(f"{seed}/{i}" if self.unique else f"shared/{i}")
        if self.source == "noise":
            img = image.frombytes("RGB", (w, h), rng.randbytes(w * h * 3))
        else:
            path = self._files[(rng.randrange(len(self._files)) if self.unique else i) % len(self._files)]
            try:
                with image.open(path) as src:
                    img = src.convert("RGB").resize((w, h))
            except OSError as e:
                raise ConfigError(f"--image-source: cannot read {path}: {e}") from None
            if self.unique:
                img.paste(image.frombytes("RGB", (w, 1), rng.randbytes(w * 3)), (0, 0))
        buf = io.BytesIO()
        if self.fmt == "png":
            img.save(buf, "PNG", compress_level=PNG_COMPRESS_LEVEL)
        else:
            img.save(buf, "JPEG", quality=JPEG_QUALITY)
        return buf.getvalue()

    def urls(self, seed: str) -> list[str]:
        """The request's ``count`` images as data URLs (``seed``: unique per request, e.g. its id)."""
        mime = "image/png" if self.fmt == "png" else "image/jpeg"
        return [f"data:{mime};base64,{base64.b64encode(self.encode(seed, i)).decode('ascii')}"
                for i in range(self.count)]


def image_part(url: str) -> dict[str, Any]:
    """One chat content part carrying an image."""
    return {"type": "image_url", "image_url": {"url": url}}


def _data_url_bytes(url: str) -> int:
    """Decoded size of a base64 data URL's payload (0 for any other URL)."""
    comma = url.find(",", 0, 256)
    if comma < 0 or not url.startswith("data:") or not url.endswith(";base64", 0, comma):
        return 0
    n = len(url) - comma - 1
    return n * 3 // 4 - url[-2:].count("=") if n else 0


def body_images(body: dict[str, Any]) -> tuple[int, int]:
    """``(images, image_bytes)`` of a chat request body: its ``image_url`` parts, and the decoded bytes of those
    sent as base64 data URLs."""
    msgs = body.get("messages")
    count = size = 0
    if not isinstance(msgs, list):
        return 0, 0
    for m in msgs:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                img = part.get("image_url")
                url = img.get("url") if isinstance(img, dict) else img
                count += 1
                size += _data_url_bytes(url) if isinstance(url, str) else 0
    return count, size


def image_rejection(rec: RequestRecord) -> str | None:
    """The one line to stop on when a request with images failed with an HTTP error about images, else None."""
    if not rec.images or rec.ok or rec.status is None or rec.status < 400 or not _IMAGE_ERROR.search(rec.error or ""):
        return None
    said = " ".join((rec.error or "").split())
    said = said if len(said) <= 90 else said[:87] + "..."
    return (f"the server does not accept image input ({said}): run without --images, or serve a vision model "
            "(llama-server: --mmproj FILE)")
