"""Starting the labelling app: every check before the server starts (task, pool, labels file,
artifact, LLM options, the address), then the background scoring and the server. The CLI
(``hdeval label``) and a script call the same :func:`prepare` and :meth:`LabelApp.serve`."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hdeval.app.criteria import (
    PoolCriteria,
    artifact_criteria,
    check_artifact_task,
    first_decomposition,
)
from hdeval.app.labels import LabelStore
from hdeval.app.server import build_app, needs_token, new_token, url_of
from hdeval.app.session import (
    DEFAULT_DOUBLE_SHARE,
    DEFAULT_REFIT_EVERY,
    LabelSession,
    ScoringState,
    check_options,
    score_in_background,
)
from hdeval.core.errors import ConfigError
from hdeval.llm.config import LLMConfig

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8765


@dataclass
class LabelApp:
    """A prepared labelling app: the session, its store and LLM, and the bound socket."""

    session: LabelSession
    store: LabelStore
    llm: Any
    sock: socket.socket
    host: str
    port: int
    token: str | None
    notify: Callable[[str], None]
    artifact: Any = None
    _closers: list = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _scoring: threading.Thread | None = None

    @property
    def url(self) -> str:
        return url_of(self.host, self.port, self.token)

    def start_scoring(self, concurrency: int | None = None) -> threading.Thread:
        task = self.session.task
        holder: dict[str, PoolCriteria] = {}

        def prepare() -> list[str]:
            crit = (
                artifact_criteria(self.artifact, task)
                if self.artifact is not None
                else first_decomposition(self.llm, task)
            )
            holder["c"] = crit
            if crit.warning:
                self.notify(crit.warning)
            n, c = len(self.session.samples), len(crit.criteria)
            calls, cached, tokens = crit.plan(self.llm, self.session.samples)
            what = "pairs (each response alone)" if task.shape == "pairwise" else "samples"
            self.notify(
                f"scoring {n} {what} on {c} criteria ({crit.source}): {calls} LLM calls, {cached} of "
                f"them cached, ~{tokens / 1e6:.2f} M prompt tokens in all; labelling starts "
                "with the first scored samples"
            )
            return crit.keys

        def score(samples: list) -> Any:
            return holder["c"].score(self.llm, samples, concurrency)

        def done(state: ScoringState) -> None:
            stats = getattr(self.llm, "stats", None)
            calls = getattr(stats, "calls", None)
            if state.error:
                self.notify(f"error: scoring the pool stopped: {state.error} (labels given so far are kept)")
            else:
                self.notify(
                    f"pool scored: {state.scored} samples"
                    + (f", {calls} LLM calls made" if calls is not None else "")
                )

        self._scoring = score_in_background(self.session, prepare, score, done=done, stop=self._stop)
        return self._scoring

    def asgi(self) -> Any:
        return build_app(self.session, host=self.host, port=self.port, token=self.token)

    def serve(self) -> None:
        """Serve until interrupted (Ctrl-C, SIGTERM)."""
        import uvicorn

        config = uvicorn.Config(self.asgi(), log_level="warning", access_log=False, lifespan="off")
        uvicorn.Server(config).run(sockets=[self.sock])

    def close(self) -> None:
        """Stop the scoring after its chunk in progress (its replies are cached), then close the
        LLM, the socket and the labels file."""
        self._stop.set()
        if self._scoring is not None:
            self._scoring.join(timeout=30)
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                close()
        self._closers.clear()


def prepare(
    *,
    task: str,
    data: str | Path,
    labels: str | Path,
    llm: LLMConfig,
    artifact: str | Path | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    strategy: str | None = None,
    double_share: float = DEFAULT_DOUBLE_SHARE,
    refit_every: int = DEFAULT_REFIT_EVERY,
    seed: int = 0,
    notify: Callable[[str], None] = lambda line: None,
    backend: Any = None,
) -> LabelApp:
    """Check everything, open the labels file and the LLM, bind the address: a one-line
    HdevalError for whatever is wrong, before anything is served or paid for."""
    from hdeval.data.samples import read_task_samples
    from hdeval.data.tasks import load_task
    from hdeval.llm.client import open_llm

    the_task = load_task(task)
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {port}")
    check_options(strategy, double_share)
    samples = read_task_samples(data, the_task, require_labels=False)
    ev = check_artifact_task(artifact, the_task) if artifact is not None else None
    llm.check()
    closers: list[Callable[[], None]] = []
    try:
        # the address and the LLM first: a port in use leaves no new labels file (nor its folder)
        sock = bind(host, port)
        closers.append(sock.close)
        client = open_llm(llm, backend)
        closers.append(client.close)
        store = LabelStore(labels, the_task)
        closers.append(store.close)
        session = LabelSession(
            the_task,
            samples,
            store,
            strategy=strategy,
            double_share=double_share,
            refit_every=refit_every,
            seed=seed,
        )
    except BaseException:
        for close in reversed(closers):
            close()
        raise
    app = LabelApp(
        session,
        store,
        client,
        sock,
        host,
        sock.getsockname()[1],
        new_token() if needs_token(host) else None,
        notify,
        ev,
        closers,
    )
    if session.changed:
        notify(
            f"warning: {len(session.changed)} labelled sample(s) changed in {data} since they were labelled "
            f"(e.g. {session.changed[0]!r}): their old labels are kept but not used"
        )
    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: any free port), or a one-line error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host}: not an address this machine has ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"--port {port} is in use on {host}: pass another --port (0 picks a free one)"
            ) from None
        raise ConfigError(
            f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})"
        ) from None
    sock.set_inheritable(True)
    return sock
