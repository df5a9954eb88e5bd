"""zstd framing of record values, with decompression that a hostile frame cannot blow up.

A value is exactly one zstd frame. :func:`compress` always writes the content size
into the frame header, which lets :func:`inflate` check it against the cap before it
allocates anything. A frame that does not declare its size (other producers) is
inflated in small steps and abandoned as soon as it passes the cap, so a zstd bomb
costs at most a couple of MiB.
"""

from __future__ import annotations

import threading

import zstandard

from worker.errors import ErrorCode, RequestError

ZSTD_LEVEL = 3
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# A window this large covers every standard zstd level (19 uses 8 MiB); bigger windows
# (--ultra, --long) are accepted only up to the decompressed-size cap.
MIN_WINDOW_LIMIT = 8 << 20
# Compressed bytes fed per step to a frame of unknown size. One RLE block turns 4 bytes
# into 128 KiB, so a step inflates to at most 16 * 128 KiB = 2 MiB before the cap check.
FEED_BYTES = 64

# zstd contexts are expensive to create (~30 µs) and not thread-safe: one set per thread.
_local = threading.local()


def compress(data: bytes) -> bytes:
    """One zstd frame holding ``data``, its size declared in the frame header."""
    cctx = getattr(_local, "cctx", None)
    if cctx is None:
        cctx = _local.cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    frame: bytes = cctx.compress(data)
    return frame


def _decompressor(window_limit: int) -> zstandard.ZstdDecompressor:
    cache: dict[int, zstandard.ZstdDecompressor] = _local.__dict__.setdefault("dctx", {})
    if window_limit not in cache:
        cache[window_limit] = zstandard.ZstdDecompressor(max_window_size=window_limit)
    return cache[window_limit]


def _malformed(message: str) -> RequestError:
    return RequestError(ErrorCode.MALFORMED, message)


def _over_limit(message: str) -> RequestError:
    return RequestError(ErrorCode.OVER_LIMIT, message)


def inflate(frame: bytes, cap: int) -> bytes:
    """The content of exactly one zstd frame, if it is at most ``cap`` bytes.

    Raises :class:`RequestError`: 4003 when the content (declared, or actual) or the
    frame's window exceeds the cap; 4001 for anything that is not one complete frame.
    """
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as exc:
        raise _malformed(
            f"content-encoding zstd, but the value is not a zstd frame: {exc}"
        ) from exc
    window_limit = max(MIN_WINDOW_LIMIT, cap)
    declared = params.content_size != zstandard.CONTENTSIZE_UNKNOWN
    if declared and params.content_size > cap:
        raise _over_limit(f"zstd frame declares {params.content_size} bytes, limit {cap}")
    if params.window_size > window_limit:
        raise _over_limit(
            f"zstd frame needs a {params.window_size}-byte window, limit {window_limit}"
        )
    dctx = _decompressor(window_limit)
    try:
        if declared:
            # One allocation of the declared size, already checked against the cap.
            data: bytes = dctx.decompress(frame, allow_extra_data=False)
            return data
        return _inflate_unknown_size(dctx, frame, cap)
    except zstandard.ZstdError as exc:
        raise _malformed(f"undecodable zstd frame: {exc}") from exc


def _inflate_unknown_size(dctx: zstandard.ZstdDecompressor, frame: bytes, cap: int) -> bytes:
    dobj = dctx.decompressobj()
    view = memoryview(frame)
    chunks: list[bytes] = []
    total = 0
    offset = 0
    while offset < len(view) and not dobj.eof:
        chunk = dobj.decompress(view[offset : offset + FEED_BYTES])
        offset += FEED_BYTES
        total += len(chunk)
        if total > cap:
            raise _over_limit(f"zstd frame inflates past the limit of {cap} bytes")
        chunks.append(chunk)
    if not dobj.eof:
        raise _malformed("undecodable zstd frame: truncated")
    if dobj.unused_data or offset < len(view):
        raise _malformed("undecodable zstd frame: data after the end of the frame")
    return b"".join(chunks)
