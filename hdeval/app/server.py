"""The labelling app's web side: a Starlette app over a :class:`~hdeval.app.session.LabelSession`.

Safe by default: it is meant to bind 127.0.0.1. Bound elsewhere, every request needs the random
token (the printed URL's ``?token=``, then an HttpOnly cookie); on a loopback bind the Host
header must name this server (no DNS rebinding). A state-changing request also needs the
``X-Hdeval`` header, which a cross-origin page cannot send without a preflight this app never
grants, and its Origin, when sent, must be this server. Every page carries a
Content-Security-Policy that allows scripts from this server's static files only.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from hdeval.app.labels import MAX_NOTE, check_rater, new_session
from hdeval.app.session import LabelSession
from hdeval.core.errors import HdevalError

HERE = Path(__file__).resolve().parent
TOKEN_COOKIE, RATER_COOKIE, SESSION_COOKIE = "hdeval_token", "hdeval_rater", "hdeval_session"
STATE_HEADER = "x-hdeval"
MAX_BODY = 64 * 1024  # a label request is a few hundred bytes
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),  # the token never leaves in a Referer
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def needs_token(host: str) -> bool:
    """Only 127.0.0.1, localhost and ::1 are served without a token: any other address, the rest
    of 127.0.0.0/8 included, may be one that others reach (a container's port, a forwarded one)."""
    return host not in LOOPBACK_NAMES


def new_token() -> str:
    return secrets.token_urlsafe(32)


class Guard:
    """The ASGI middleware that makes every check above, before any route runs."""

    def __init__(self, app: Any, *, host: str, port: int, token: str | None) -> None:
        self.app, self.token = app, token
        names = {host, *(("localhost", "127.0.0.1", "::1") if not needs_token(host) else ())}
        self.hosts = {f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in names}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: dict) -> None:
            if message["type"] == "http.response.start":
                # a route may set a stricter or its own policy (a report page's inline style)
                own = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    h for h in SECURITY_HEADERS if h[0] not in own
                ]
            await send(message)

        request = Request(scope)
        refusal = self.refusal(request)
        if refusal is not None:
            await refusal(scope, receive, secured)
            return
        if self.token and request.query_params.get("token"):
            # the token's URL is opened once: it becomes a cookie and leaves the address bar
            target = request.url.remove_query_params("token")
            response = RedirectResponse(str(target.path) + (f"?{target.query}" if target.query else ""), 303)
            response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict")
            await response(scope, receive, secured)
            return
        await self.app(scope, receive, secured)

    def refusal(self, request: Request) -> Response | None:
        if self.token is None and request.headers.get("host", "") not in self.hosts:
            return PlainTextResponse("refused: this server answers only to its own address\n", 403)
        if self.token is not None:
            given = request.query_params.get("token") or request.cookies.get(TOKEN_COOKIE) or ""
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return PlainTextResponse("refused: open the URL with the token that hdeval printed\n", 403)
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("origin")
            site = request.headers.get("sec-fetch-site")
            if (
                request.headers.get(STATE_HEADER) != "1"
                or (origin and origin != f"{request.url.scheme}://{request.headers.get('host')}")
                or (site and site not in ("same-origin", "none"))
            ):
                return PlainTextResponse("refused: a cross-site request\n", 403)
        return None


def templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.filters["fig"] = lambda x: (
        "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"
    )
    return env


def curve_svg_points(curve: list[tuple[int, float]], width: int = 260, height: int = 110) -> dict[str, Any]:
    """The learning curve as SVG coordinates (x: labels, y: agreement), drawn by the template."""
    if not curve:
        return {"points": "", "dots": [], "xmax": 0, "ylow": 0.0}
    xmax = max(n for n, _ in curve) or 1
    ylow = min(0.0, math.floor(min(a for _, a in curve) * 10) / 10)  # a round axis: 0 or -0.1, -0.2...
    pad = 24

    def xy(n: int, a: float) -> tuple[float, float]:
        return (pad + (width - pad - 6) * n / xmax, 6 + (height - 24) * (1 - (a - ylow) / (1 - ylow)))

    dots = [xy(n, a) for n, a in curve]
    return {
        "points": " ".join(f"{x:.1f},{y:.1f}" for x, y in dots),
        "dots": dots,
        "xmax": xmax,
        "ylow": ylow,
        "width": width,
        "height": height,
        "pad": pad,
    }


def build_app(
    session: LabelSession,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    title: str = "",
) -> Any:
    """The ASGI app: the routes wrapped in the :class:`Guard`."""
    env = templates()
    task = session.task

    def rater_of(request: Request) -> tuple[str | None, str]:
        try:
            rater = check_rater(request.cookies.get(RATER_COOKIE, ""))
        except HdevalError:
            rater = None
        return rater, request.cookies.get(SESSION_COOKIE) or "unknown"

    def page(name: str, **values: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(task=task, title=title, **values))

    def panel_values() -> dict[str, Any]:
        panel = session.panel()
        return {"panel": panel, "svg": curve_svg_points(panel["curve"])}

    # the routes that pick, write or render run in Starlette's thread pool (plain functions):
    # a pick or a commit of one rater never holds up another's page
    def index(request: Request) -> Response:
        rater, _ = rater_of(request)
        if rater is None:
            return page("rater.html.j2")
        shown = session.next_for(rater)
        scoring = session.scoring
        return page("label.html.j2", rater=rater, shown=shown, scoring=scoring, **panel_values())

    def panel(request: Request) -> Response:
        return HTMLResponse(env.get_template("panel.html.j2").render(task=task, **panel_values()))

    async def body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > MAX_BODY:
            raise HdevalError("request too large")
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            raise HdevalError("the request is not JSON") from None
        if not isinstance(data, dict):
            raise HdevalError("the request is not a JSON object")
        return data

    def acting(handler: Callable[[Request, str, str, dict], Response]) -> Callable:
        async def run(request: Request) -> Response:
            rater, sess = rater_of(request)
            if rater is None:
                return JSONResponse({"error": "give your name first"}, 400)
            try:
                data = await body(request)
                return await run_in_threadpool(handler, request, rater, sess, data)
            except HdevalError as exc:
                return JSONResponse({"error": str(exc)}, 400)

        return run

    def label(request: Request, rater: str, sess: str, data: dict) -> Response:
        values = data.get("values")
        note = data.get("note") or ""
        if (
            not isinstance(values, dict)
            or not isinstance(note, str)
            or not isinstance(data.get("sample_id"), str)
        ):
            raise HdevalError("a label is {sample_id, values: {aspect: number}, note}")
        session.label(rater, sess, data["sample_id"], values, note[:MAX_NOTE])
        return JSONResponse({"ok": True, "labelled": data["sample_id"]})

    def skip(request: Request, rater: str, sess: str, data: dict) -> Response:
        if not isinstance(data.get("sample_id"), str):
            raise HdevalError("a skip names its sample_id")
        session.skip(rater, sess, data["sample_id"])
        return JSONResponse({"ok": True})

    def undo(request: Request, rater: str, sess: str, data: dict) -> Response:
        return JSONResponse({"ok": True, "undone": session.undo(rater, sess)})

    async def set_rater(request: Request) -> Response:
        try:
            data = await body(request)
            name = check_rater(data.get("name"))
        except HdevalError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        response = JSONResponse({"ok": True, "rater": name})
        response.set_cookie(RATER_COOKIE, name, httponly=True, samesite="strict")
        if not request.cookies.get(SESSION_COOKIE):
            response.set_cookie(SESSION_COOKIE, new_session(), httponly=True, samesite="strict")
        return response

    def state(request: Request) -> Response:
        """The panel's figures as JSON (for scripts and tests)."""
        p = session.panel()
        last = p["last"]
        return JSONResponse(
            {
                "labelled": p["labelled"],
                "labels": p["labels"],
                "raters": p["raters"],
                "scored": p["scored"],
                "pool": p["pool"],
                "criteria": p["criteria"],
                "scoring": p["scoring_stage"],
                "scoring_error": p["scoring_error"],
                "changed": p["changed"],
                "strategy": p["strategy"],
                "agreement": None
                if last is None
                else {"n_labels": last.n_labels, "value": last.agreement, "low": last.low, "high": last.high},
                "curve": p["curve"],
                "between_people": p["people"],
                "labels_needed": p["labels_needed"],
                "next_step": p["next_step"],
            }
        )

    routes = [
        Route("/", index),
        Route("/panel", panel),
        Route("/api/state", state),
        Route("/api/rater", set_rater, methods=["POST"]),
        Route("/api/label", acting(label), methods=["POST"]),
        Route("/api/skip", acting(skip), methods=["POST"]),
        Route("/api/undo", acting(undo), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Guard(Starlette(routes=routes), host=host, port=port, token=token)


def url_of(host: str, port: int, token: str | None) -> str:
    try:
        shown = f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        shown = host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
