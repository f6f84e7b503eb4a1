"""How a reply is stored: the compact value formats, and the bounded reading of a stored value
(a cache directory is untrusted: anything hdeval cannot use is :class:`UnreadableEntry`)."""

from __future__ import annotations

import io
import json
import math
import os
import re
import struct
import zlib
from pathlib import Path
from typing import Any

from diskcache.core import MODE_RAW, MODE_TEXT

from hdeval.llm.backends.base import Completion

# A cached completion is a few KB; anything larger is not one of ours (and is not read or parsed).
MAX_ENTRY_CHARS = 4 * 2**20

# How a reply is stored: VALUE_MAGIC, then raw DEFLATE (with the preset dictionary
# below, part of the format) of a compact JSON (short keys, a logprob as [token, logprob], zero
# counts left out) that holds every field Completion.from_dict reads back, losslessly.
VALUE_MAGIC = b"Z1"
_ZDICT = b'{"t":"1","l":[[["1",-0.["2",-1.["3",-2.["4",-3.["5",-4.]]],"p":7,"c":1}'
_COMPACT = {"prompt_tokens": "p", "completion_tokens": "c", "prompt_tokens_evaluated": "e"}
_MISSING = {"prompt_tokens": 0, "completion_tokens": 0, "prompt_tokens_evaluated": None}
# The same fields packed, when shorter (DEFLATE cannot shrink a full-precision logprob's digits),
# and only when exact (finite float logprobs, plain integer counts): a flags byte (_LOGPROBS,
# _TEXT_IS_TOP: the text is the first top token, _EVALUATED), prompt, completion [and evaluated]
# token counts as LEB128 varints, [the text as varint length + UTF-8], [varint positions, per
# position varint tokens, per token varint length + UTF-8 + little-endian double].
VALUE_MAGIC_PACKED = b"Z2"
_LOGPROBS, _TEXT_IS_TOP, _EVALUATED = 1, 2, 4
_DOUBLE = struct.Struct("<d")

# diskcache's own value-file names: two levels of hex directories, then 28 hex digits
_VALUE_FILE = re.compile(r"[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val\Z")


class UnreadableEntry(ValueError):
    """One cache entry is not a completion hdeval can read. ``foreign``: hdeval never writes
    entries of this kind (a pickled value or key, a key that is not a sha256)."""

    def __init__(self, reason: str, foreign: bool = False):
        super().__init__(reason)
        self.foreign = foreign


class EntryTooLarge(ValueError):
    """A completion too large to store (it is still returned, just not cached)."""


def table_value(value: Any, length: Any = None) -> str:
    """The JSON text of one value of the reply table, read with bounds; :class:`UnreadableEntry`
    otherwise (``value`` None: longer than MAX_ENTRY_CHARS, so not read)."""
    if value is None:
        raise UnreadableEntry(f"a value of {length} bytes (more than hdeval writes)")
    if type(value) is not bytes or not value.startswith((VALUE_MAGIC, VALUE_MAGIC_PACKED)):
        raise UnreadableEntry("a value hdeval does not write (not a compact reply)", foreign=True)
    return expand_value(value)


def value_path(directory: str | Path, filename: Any) -> str:
    """The full path of a value file, if ``filename`` is one diskcache would have made and it
    resolves inside ``directory``; :class:`UnreadableEntry` otherwise."""
    if not isinstance(filename, str) or not _VALUE_FILE.match(filename):
        raise UnreadableEntry(
            f"a value file name hdeval does not write: {str(filename)[:80]!r}", foreign=True
        )
    root = os.path.realpath(directory)
    full = os.path.realpath(os.path.join(root, filename))
    if not full.startswith(root + os.sep):
        raise UnreadableEntry("a value file outside the cache directory", foreign=True)
    return full


def encode_completion(c: Completion) -> bytes:
    """``c`` as the cache stores it: the shorter of VALUE_MAGIC_PACKED (when it can hold ``c``
    exactly) and VALUE_MAGIC."""
    d = c.to_dict()
    packed = _pack(d)
    deflated = _deflate(d)
    return packed if packed is not None and len(packed) <= len(deflated) else deflated


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _utf8(text: str) -> bytes:
    # surrogatepass: a lone surrogate a server sent is kept, as the JSON form keeps it
    data = text.encode("utf-8", "surrogatepass")
    return _varint(len(data)) + data


def _pack(d: dict[str, Any]) -> bytes | None:
    """``d`` (a :meth:`Completion.to_dict`) as VALUE_MAGIC_PACKED, or None if that format cannot
    hold it exactly."""
    counts = [d["prompt_tokens"], d["completion_tokens"]]
    flags = 0
    if d["prompt_tokens_evaluated"] is not None:
        flags |= _EVALUATED
        counts.append(d["prompt_tokens_evaluated"])
    if not all(type(n) is int and 0 <= n < 2**53 for n in counts) or type(d["text"]) is not str:
        return None
    lp = d["top_logprobs"]
    body = bytearray()
    if lp is not None:
        flags |= _LOGPROBS
        body += _varint(len(lp))
        for pos in lp:
            body += _varint(len(pos))
            for t in pos:
                v = t["logprob"]
                if type(t["token"]) is not str or type(v) is not float or not math.isfinite(v):
                    return None
                body += _utf8(t["token"]) + _DOUBLE.pack(v)
        if lp and lp[0] and lp[0][0]["token"] == d["text"]:
            flags |= _TEXT_IS_TOP
    head = VALUE_MAGIC_PACKED + bytes([flags]) + b"".join(map(_varint, counts))
    return head + (b"" if flags & _TEXT_IS_TOP else _utf8(d["text"])) + bytes(body)


def _take(r: io.BytesIO, n: int) -> bytes:
    """The next ``n`` bytes of a VALUE_MAGIC_PACKED blob, checked against its end."""
    got = r.read(n)
    if len(got) < n:
        raise UnreadableEntry("its packed value is cut short")
    return got


def _read_varint(r: io.BytesIO) -> int:
    n = 0
    for shift in range(0, 56, 7):
        (b,) = _take(r, 1)
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n
    raise UnreadableEntry("its packed value holds a number larger than hdeval writes")


def _read_text(r: io.BytesIO) -> str:
    try:
        return _take(r, _read_varint(r)).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise UnreadableEntry("its packed value holds text that is not UTF-8") from None


def _unpack(blob: bytes) -> str:
    """A VALUE_MAGIC_PACKED blob as the JSON text of :meth:`Completion.to_dict`."""
    r = io.BytesIO(blob)
    r.seek(len(VALUE_MAGIC_PACKED))
    (flags,) = _take(r, 1)
    if flags & ~(_LOGPROBS | _TEXT_IS_TOP | _EVALUATED) or (flags & _TEXT_IS_TOP and not flags & _LOGPROBS):
        raise UnreadableEntry("its packed value has flags hdeval does not write")
    d: dict[str, Any] = {
        "prompt_tokens": _read_varint(r),
        "completion_tokens": _read_varint(r),
        "prompt_tokens_evaluated": _read_varint(r) if flags & _EVALUATED else None,
    }
    text = None if flags & _TEXT_IS_TOP else _read_text(r)
    lp = None
    if flags & _LOGPROBS:
        # each position and token takes bytes: a count cannot outrun the blob
        lp = [
            [
                {"token": _read_text(r), "logprob": _DOUBLE.unpack(_take(r, 8))[0]}
                for _ in range(_read_varint(r))
            ]
            for _ in range(_read_varint(r))
        ]
        if text is None:
            if not (lp and lp[0]):
                raise UnreadableEntry("its packed value has no top token to be its text")
            text = lp[0][0]["token"]
    if r.tell() != len(blob):
        raise UnreadableEntry("its packed value has bytes after its end")
    return json.dumps({"text": text, "top_logprobs": lp, **d})


def _deflate(d: dict[str, Any]) -> bytes:
    """``d`` (a :meth:`Completion.to_dict`) as VALUE_MAGIC."""
    compact: dict[str, Any] = {"t": d["text"]}
    if d["top_logprobs"] is not None:
        compact["l"] = [[[t["token"], t["logprob"]] for t in pos] for pos in d["top_logprobs"]]
    # left out: the value a missing field reads back as (0, or None for prompt_tokens_evaluated)
    compact.update({short: d[name] for name, short in _COMPACT.items() if d[name] != _MISSING[name]})
    raw = json.dumps(compact, separators=(",", ":")).encode("ascii")
    z = zlib.compressobj(9, zlib.DEFLATED, -15, zdict=_ZDICT)
    return VALUE_MAGIC + z.compress(raw) + z.flush()


def expand_value(blob: bytes) -> str:
    """A compact stored reply as the JSON text of :meth:`Completion.to_dict` (what
    :func:`parse_completion` then checks); :class:`UnreadableEntry` if it is not one, read with
    bounds (a planted blob must not inflate to gigabytes)."""
    if blob.startswith(VALUE_MAGIC_PACKED):
        return _unpack(blob)
    z = zlib.decompressobj(-15, zdict=_ZDICT)
    try:
        raw = z.decompress(blob[len(VALUE_MAGIC) :], MAX_ENTRY_CHARS)
    except zlib.error:
        raise UnreadableEntry("its compressed value is damaged") from None
    if z.unconsumed_tail or not z.eof:
        raise UnreadableEntry("its compressed value is cut short or larger than hdeval writes")
    try:
        c = json.loads(raw)
    except (ValueError, RecursionError):
        raise UnreadableEntry("its compressed value is not JSON") from None
    if not isinstance(c, dict):
        raise UnreadableEntry("its compressed value is not a compact completion")
    lp = c.get("l")
    if lp is not None:
        if not (
            isinstance(lp, list)
            and all(
                isinstance(pos, list) and all(isinstance(t, list) and len(t) == 2 for t in pos) for pos in lp
            )
        ):
            raise UnreadableEntry("its compressed value has malformed top_logprobs")
        lp = [[{"token": t[0], "logprob": t[1]} for t in pos] for pos in lp]
    d = {"text": c.get("t"), "top_logprobs": lp}
    d.update({name: c.get(short, _MISSING[name]) for name, short in _COMPACT.items()})
    return json.dumps(d)


def read_value(directory: str | Path, mode: int, filename: Any, value: Any) -> str:
    """The text of one stored value, read with bounds; :class:`UnreadableEntry` otherwise."""
    if mode == MODE_RAW:
        if type(value) is bytes and value.startswith((VALUE_MAGIC, VALUE_MAGIC_PACKED)):
            return table_value(value if len(value) <= MAX_ENTRY_CHARS else None, len(value))
        if type(value) is not str:
            raise UnreadableEntry("a binary or numeric value (hdeval stores only JSON text)", foreign=True)
        if len(value) > MAX_ENTRY_CHARS:
            raise UnreadableEntry(f"a value of {len(value)} characters (more than hdeval writes)")
        return value
    if mode != MODE_TEXT:
        # MODE_PICKLE or MODE_BINARY: hdeval never writes these; never unpickle them
        raise UnreadableEntry("a pickled or binary value (hdeval stores only JSON text)", foreign=True)
    full = value_path(directory, filename)
    try:
        fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(4 * MAX_ENTRY_CHARS + 1)  # UTF-8: at most 4 bytes a character
    except OSError as exc:
        raise UnreadableEntry(f"its value file cannot be read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableEntry("its value file is not UTF-8 text") from None
    if len(text) > MAX_ENTRY_CHARS:
        raise UnreadableEntry("its value file is larger than hdeval writes")
    return text


def _count(x: Any) -> bool:
    return x is None or (type(x) is int and 0 <= x < 2**53)


def parse_completion(text: str) -> Completion:
    """A cached completion from its JSON text; :class:`UnreadableEntry` if it is not one."""
    try:
        d = json.loads(text)
    except (ValueError, RecursionError):
        raise UnreadableEntry("its value is not JSON") from None
    if not isinstance(d, dict) or not isinstance(d.get("text"), str):
        raise UnreadableEntry("its value is not a JSON completion (no text)")
    lp = d.get("top_logprobs")
    if lp is not None:
        ok = isinstance(lp, list) and all(
            isinstance(pos, list)
            and all(
                isinstance(t, dict)
                and isinstance(t.get("token"), str)
                # null: a logprob the server sent unreadable (NaN, Infinity), kept as delivered
                # so the replay records the same failure instead of paying for it again
                and (
                    t.get("logprob") is None
                    or (type(t.get("logprob")) in (int, float) and not math.isnan(t["logprob"]))
                )
                for t in pos
            )
            for pos in lp
        )
        if not ok:
            raise UnreadableEntry("its value has malformed top_logprobs")
    if not all(_count(d.get(k)) for k in ("prompt_tokens", "completion_tokens", "prompt_tokens_evaluated")):
        raise UnreadableEntry("its value has malformed token counts")
    return Completion.from_dict(d)
