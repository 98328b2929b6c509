"""A response body's decoded bytes, inflated at most ``STEP`` bytes at a time.

httpx inflates each network read whole: 64 KiB of a gzip bomb becomes some 64 MiB in one
allocation before anyone can count it. Here gzip and deflate are inflated in bounded steps,
so ``read_body`` can stop at its cap having held little more than the cap. ``HttpClient``
asks only for gzip and deflate; any other encoding a server sends anyway is left to httpx.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

import httpx

__all__ = ["ACCEPT_ENCODING", "STEP", "decoded_chunks"]

ACCEPT_ENCODING = "gzip, deflate"
STEP = 1 << 20

_GZIP = 16 + zlib.MAX_WBITS
_ZLIB = zlib.MAX_WBITS
_RAW_DEFLATE = -zlib.MAX_WBITS


def decoded_chunks(response: httpx.Response) -> Iterator[bytes]:
    """The decoded body of a streamed ``response``, in chunks of at most ``STEP`` bytes
    (for gzip and deflate; identity as it arrives; other encodings as httpx decodes them)."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return response.iter_raw()
    if encoding in ("gzip", "x-gzip"):
        return inflate(response.iter_raw(), _GZIP)
    if encoding == "deflate":
        return inflate(response.iter_raw(), _ZLIB)
    return response.iter_bytes()


def inflate(raw: Iterable[bytes], wbits: int, step: int = STEP) -> Iterator[bytes]:
    """Inflate ``raw`` chunks (``wbits`` as for ``zlib``) ``step`` bytes at most at a time.

    Concatenated gzip members are read one after another; "deflate" without the zlib
    wrapper (which some servers send) is accepted, as browsers and httpx do.

    >>> import gzip
    >>> body = gzip.compress(b"a" * 10) + gzip.compress(b"b" * 5)
    >>> [len(c) for c in inflate([body[:7], body[7:]], _GZIP, step=4)]
    [4, 4, 2, 4, 1]
    """
    inflater = zlib.decompressobj(wbits)
    first = True
    try:
        for chunk in raw:
            data = chunk
            while data:
                try:
                    out = inflater.decompress(data, step)
                except zlib.error:
                    if not (first and wbits == _ZLIB):
                        raise
                    wbits, inflater = _RAW_DEFLATE, zlib.decompressobj(_RAW_DEFLATE)
                    out = inflater.decompress(data, step)
                first = False
                if out:
                    yield out
                data = inflater.unconsumed_tail
                # Output held back by the step, with all input taken: ask for it.
                while not data and len(out) == step:
                    out = inflater.decompress(b"", step)
                    if out:
                        yield out
                if inflater.eof and inflater.unused_data:
                    # Another gzip member follows.
                    data, inflater = inflater.unused_data, zlib.decompressobj(wbits)
        tail = inflater.flush()
    except zlib.error as exc:
        raise httpx.DecodingError(f"the body is not valid {_name(wbits)} data: {exc}") from None
    if tail:
        yield tail


def _name(wbits: int) -> str:
    return "gzip" if wbits == _GZIP else "deflate"
