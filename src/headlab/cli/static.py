"""``headlab static OUT``: the explainer as a static site, the model running in the browser."""

from __future__ import annotations

from pathlib import Path

import typer

from headlab.cli.common import console, fail

WEB = Path(__file__).resolve().parents[3] / "web"  # package.json and node_modules (npm ci)
OUT_ARGUMENT = typer.Argument(..., help="The folder to write the site to (replaced if it exists).")
WEB_OPTION = typer.Option(WEB, help="The folder where `npm ci` installed onnxruntime-web.")


def static(out: Path = OUT_ARGUMENT, web: Path = WEB_OPTION) -> None:
    """Write the explainer as a static site: the page, the stored results and the default model
    exported to ONNX, run in the reader's browser by onnxruntime-web (no server, no CDN).

    Serve it with `python -m http.server -d OUT`; `make static` installs onnxruntime-web first.
    """
    from headlab import site
    from headlab.pypi import install_hint

    if out.exists() and not out.is_dir():
        raise fail(f"{out} is a file; give a folder to write the site to")
    try:
        written = site.build(out, web)
    except FileNotFoundError as exc:
        raise fail(str(exc)) from None
    except ModuleNotFoundError as exc:  # onnx or wordfreq: the build's own extras
        raise fail(f"{exc.name} is not installed; the static site needs it: "
                   f"{install_hint('static')}") from None  # fmt: skip
    mb = written["bytes"] / 1e6
    console.print(f"wrote {written['files']} files, {mb:.1f} MB, to {out}")
    console.print(f"serve it: python -m http.server -d {out} 8000")
