"""URLs that may be written down or shown: never with credentials, a query or a fragment."""

from __future__ import annotations

import re
from typing import Sequence
from urllib.parse import SplitResult, urlsplit, urlunsplit


def unreadable(url: str) -> str | None:
    """Why urllib cannot split ``url`` into its parts, in words that quote none of it (its own
    may quote the host part, credentials and all); None when it can."""
    try:
        urlsplit(url.strip())
    except ValueError as exc:
        text = str(exc)
        if text == "Invalid IPv6 URL":
            return text
        if "NFKC" in text:
            return "its host part holds characters that Unicode normalisation changes"
        if "IPv4 or IPv6" in text:
            return "its host in brackets is no IP address"
        return "its host part cannot be read"
    return None


def _split(url: str) -> SplitResult:
    """``urlsplit(url)``, or for a URL it refuses (``http://[bad/v1``) the same parts cut by hand:
    what is shown or written of a URL never depends on the URL being valid."""
    try:
        return urlsplit(url)
    except ValueError:
        scheme, sep, rest = url.partition("://")
        if not sep:
            scheme, rest = "", url
        rest, _, fragment = rest.partition("#")
        rest, _, query = rest.partition("?")
        netloc, slash, path = rest.partition("/") if sep else ("", "", rest)
        return SplitResult(scheme, netloc, slash + path, query, fragment)


def public_url(url: str | None) -> str | None:
    """``url`` without ``user:password@``, query string or fragment. The password may hold ``/``,
    ``#`` or ``?``, so the authority is cut at the *last* ``@`` before anything else is parsed."""
    if not url:
        return url
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    at = rest.rfind("@")
    if at >= 0:
        rest = rest[at + 1 :]
    parts = _split(f"{scheme}://{rest}" if sep else rest)
    return urlunsplit(parts._replace(query="", fragment=""))


# a URL runs to a space or to the ", " that joins an identity's parts: a query may hold commas
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+?(?=,\s|\s|\Z)")


def shown_identity(identity: str, suffixes: Sequence[str] = ()) -> str:
    """A backend identity fit to print or write down: every URL in it as :func:`public_url`.
    The raw identity (which may quote a query such as ``?api-key=...``) is for cache keys only.
    ``suffixes``: what an identity may append to its URL (the llm layer's ``+<dialect>``), kept
    where the URL's query or fragment is cut (the suffix would otherwise go with it)."""

    def shown(m: re.Match[str]) -> str:
        url, tail = m.group(0), ""
        if "?" in url or "#" in url:
            tail = next((x for x in suffixes if url.endswith(x)), "")
            url = url[: len(url) - len(tail)]
        return (public_url(url) or "") + tail

    return _URL.sub(shown, identity) if identity else identity


def public_identity(identity: str, url: str | None) -> str:
    """A backend identity without the query or fragment of ``url`` (which it may quote)."""
    if not url or not identity:
        return identity
    parts = _split(url)
    for secret in (parts.query and "?" + parts.query, parts.fragment and "#" + parts.fragment):
        if secret:
            identity = identity.replace(secret, "")
    return (
        identity.replace(parts.netloc, parts.netloc.rpartition("@")[2]) if "@" in parts.netloc else identity
    )


def keyed_identity(identity: str, url: str | None, suffixes: Sequence[str] = ()) -> str:
    """The identity cache keys were made with, from ``identity`` as an artifact keeps it (see
    :func:`public_identity`) and ``url``, the base URL the user gives again with its query
    (Azure's ``?api-version=...``), which the artifact never holds. ``identity`` unchanged when
    ``url`` has no query or names another server. ``suffixes``: as for :func:`shown_identity`
    (the query goes before a ``+<dialect>`` the identity ends with)."""
    if not url or not identity:
        return identity
    parts = _split(url.strip())
    if not parts.query and not parts.fragment:
        return identity
    tail = next((x for x in suffixes if identity.endswith(x)), "")
    head = identity[: len(identity) - len(tail)]
    bare = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path.rstrip("/"), "", ""))
    if not head.endswith("@" + bare):
        return identity
    return (
        head
        + (f"?{parts.query}" if parts.query else "")
        + (f"#{parts.fragment}" if parts.fragment else "")
        + tail
    )
