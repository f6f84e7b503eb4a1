"""The one redaction of secrets: every form a secret takes (as it is, its ``repr``, percent-encoded,
base64 at any alignment, as in a Basic or Proxy-Authorization header) taken out of whatever hdeval
prints or writes: messages, logs, replies before they are cached, result files. The secrets are
the API key (sent as ``Authorization: Bearer`` or Azure's ``api-key``), the ``user:password`` and
query of the base URL, and the ``user:password`` of every proxy the environment names."""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.request
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit

MASK = "***"
MIN_SECRET = 4  # shorter values (a user name "a", a query "v=1") are not secrets worth garbling text for
MIN_BASE64 = 6  # a base64 core shorter than this would match ordinary words
# A form shorter than this may be a word or a part of one (a key "test" or "EMPTY", as local
# servers are given): it is masked only as a whole token, so paths and words holding it stay whole.
WHOLE_TOKEN_BELOW = 12
_WORD = "A-Za-z0-9_"
KEY_ENV = ("OPENAI_API_KEY", "AZURE_OPENAI_API_KEY")
PLACEHOLDERS = frozenset({"not-needed", "unused"})  # keys hdeval sends when there is none


def _base64_cores(raw: bytes) -> set[str]:
    """The characters of ``raw``'s base64 (standard and URL-safe) that depend on ``raw`` alone, at
    each of the three alignments it can have inside a longer encoded text (``Basic`` of
    ``user:key``, a header dump encoded whole), plus the whole encodings with their padding."""
    cores: set[str] = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        cores.add(encode(raw).decode("ascii"))
        for pad in range(3):
            text = encode(b"\0" * pad + raw).decode("ascii")
            start, end = -(-8 * pad // 6), 8 * (pad + len(raw)) // 6
            core = text[start:end]
            if len(core) >= MIN_BASE64:
                cores.add(core)
    return cores


def secret_forms(secret: str) -> set[str]:
    """Every text form of ``secret`` that may be printed or echoed back; none for a short one."""
    if not secret or len(secret) < MIN_SECRET or secret in PLACEHOLDERS:
        return set()
    forms = {
        secret,
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        quote(secret, safe=""),
        quote_plus(secret),
        quote(secret),
    }
    forms |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), f) for f in list(forms)}
    forms |= _base64_cores(secret.encode("utf-8"))
    return {f for f in forms if f}


def _userinfo_forms(netloc: str) -> set[str]:
    """The forms of ``user:password`` in a URL's authority (raw and decoded), and of the password."""
    if "@" not in netloc:
        return set()
    userinfo = netloc.rpartition("@")[0]
    user, _, password = userinfo.partition(":")
    forms = (
        {userinfo} | secret_forms(unquote(userinfo)) | secret_forms(f"{unquote(user)}:{unquote(password)}")
    )
    return forms | secret_forms(password) | secret_forms(unquote(password))


def _netloc_and_query(url: str) -> tuple[str, str]:
    """A URL's authority and query; for one urllib refuses (``http://u:pw@[bad/v1``), cut by hand
    and wide: everything before its last ``@`` is taken as the credentials, so the redactor that
    reports the refusal never raises and leaves no part of them."""
    try:
        parts = urlsplit(url)
        return parts.netloc, parts.query
    except ValueError:
        rest = url.partition("://")[2] or url
        return rest, rest.partition("?")[2].partition("#")[0]


def url_secrets(url: str | None) -> set[str]:
    """The secret forms a URL holds: its ``user:password`` and its query (whole and each value).
    Never raises: a URL that cannot be parsed gives what can be cut from it."""
    if not url:
        return set()
    netloc, query = _netloc_and_query(url.strip())
    forms = _userinfo_forms(netloc)
    if query:
        forms |= {query, unquote(query)} | secret_forms(query)
        for _, value in parse_qsl(query):
            forms |= secret_forms(value)
    return forms


def proxy_secrets() -> set[str]:
    """The ``user:password`` forms of every proxy the environment names (``HTTP_PROXY`` ...)."""
    forms: set[str] = set()
    for proxy in urllib.request.getproxies_environment().values():
        forms |= _userinfo_forms(_netloc_and_query(proxy if "://" in proxy else "http://" + proxy)[0])
    return forms


class Redactor:
    """Replaces every form of the secrets of ``key`` and ``url`` (and the environment's proxies)
    with ``***``, in text (``__call__``) or in every string of a parsed JSON value (:meth:`json`)."""

    def __init__(self, key: str | None = None, url: str | None = None, *, extra: Iterable[str] = ()) -> None:
        forms = secret_forms(key or "") | url_secrets(url) | proxy_secrets()
        for secret in extra:
            forms |= secret_forms(secret)
        # longest first: a key's repr contains the key, a Basic core contains a user's part
        self.forms = tuple(sorted((f for f in forms if f), key=len, reverse=True))
        self._long = tuple(f for f in self.forms if len(f) >= WHOLE_TOKEN_BELOW)
        self._shorts = tuple(f for f in self.forms if len(f) < WHOLE_TOKEN_BELOW)
        alternatives = "|".join(map(re.escape, self._shorts))
        self._short = re.compile(f"(?:(?<![{_WORD}])|(?<=%[0-9A-Fa-f]{{2}}))(?:{alternatives})(?![{_WORD}])")

    @classmethod
    def from_env(cls, url: str | None = None) -> Redactor:
        """The secrets a command that is given no key knows of: the environment's keys and proxies."""
        return cls(None, url, extra=[os.environ.get(name, "") for name in KEY_ENV])

    def __bool__(self) -> bool:
        return bool(self.forms)

    def __call__(self, text: str) -> str:
        for f in self._long:
            if f in text:
                text = text.replace(f, MASK)
        if any(f in text for f in self._shorts):  # a plain search first: the pattern is slower
            text = self._short.sub(MASK, text)
        return text

    def json(self, value: Any) -> Any:
        """``value`` (plain JSON data) with every string in it redacted, keys included: its JSON
        text redacted (the forms include each secret's JSON-escaped one) and read back."""
        if not self.forms:
            return value
        try:
            text = json.dumps(value, ensure_ascii=False)
            clean = self(text)
            return value if clean == text else json.loads(clean)
        except (ValueError, RecursionError):  # a mask that broke the JSON: nothing of it is kept
            return MASK


__all__ = ["MASK", "Redactor", "proxy_secrets", "secret_forms", "url_secrets"]
