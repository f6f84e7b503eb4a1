"""``hdeval view``: options -> :func:`hdeval.app.view.prepare_view` -> the server."""

from __future__ import annotations

import functools
import threading
import webbrowser

import click

from hdeval.cli.boundary import guarded
from hdeval.cli.options import server_options

_stopped = functools.partial(guarded, interrupted="stopped")


@click.command("view")
@click.argument("folder", default=".", type=click.Path(file_okay=False))
@server_options(port=8766)
@_stopped
def view(folder, host, port, open_browser) -> None:
    """Browse the artifacts under FOLDER (default: here) in a local web page: each one's verdict
    banner and headline figures, its report, and two of them side by side. Offline: it makes no
    LLM call and writes nothing into the artifacts."""
    from hdeval.app.view import MAX_ARTIFACTS, prepare_view

    app = prepare_view(folder, host=host, port=port)
    try:
        n, total = len(app.catalogue.entries()), app.catalogue.total
        if total > n:
            click.echo(
                f"showing {n} of {total} artifacts under {app.catalogue.root} (at most {MAX_ARTIFACTS} "
                "are listed: give a folder further down for the others)",
                err=True,
            )
        else:
            click.echo(f"{n} artifact{'' if n == 1 else 's'} under {app.catalogue.root}", err=True)
        click.echo(f"open {app.url}", err=True)
        click.echo(app.url)
        if open_browser:
            threading.Timer(0.5, webbrowser.open, (app.url,)).start()
        app.serve()
    finally:
        app.close()
