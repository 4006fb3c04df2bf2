"""``headlab static OUT``: the explainer as a static site, the model running in the browser."""

from __future__ import annotations

from pathlib import Path

import typer

from headlab.cli.common import console, fail

WEB = Path(__file__).resolve().parents[3] / "web"  # package.json and node_modules (npm ci)
OUT_ARGUMENT = typer.Argument(
    ...,
    help="The folder to write the site to: a new or empty folder, or a site headlab static "
    "wrote before (replaced whole once the new one is built).",
)
WEB_OPTION = typer.Option(WEB, help="The folder where `npm ci` installed onnxruntime-web.")
FORCE_OPTION = typer.Option(
    False, "--force", help="Replace OUT even if it holds files headlab static did not write."
)


MODEL_OPTION = typer.Option(
    [],
    "--model",
    help="Also offer this model in the page, downloaded by the reader's browser only when "
    "picked: smollm2 (SmolLM2-135M-Instruct, its 4-bit weights, about 96 MB). Repeatable.",
)


def static(
    out: str = OUT_ARGUMENT,
    web: Path = WEB_OPTION,
    force: bool = FORCE_OPTION,
    model: list[str] = MODEL_OPTION,
) -> None:
    """Write the explainer as a static site: the page, the stored results and the default model
    exported to ONNX, run in the reader's browser by onnxruntime-web (no server, no CDN).

    Serve it with `python -m http.server -d OUT`; `make static` installs onnxruntime-web first.
    """
    from headlab import site
    from headlab.pypi import install_hint
    from headlab.server.stored import page_answers

    try:
        extra = tuple(dict.fromkeys(name for name in model if name != "default"))
        written = site.build(out, web, page_answers, force=force, models=extra)
    except (FileNotFoundError, site.TargetRefused) as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:  # a model the site cannot run, or one that cannot be fetched
        raise fail(str(exc)) from None
    except ModuleNotFoundError as exc:  # onnx or wordfreq: the build's own extras
        hint = install_hint("static")
        raise fail(f"{exc.name} is not installed; the static site needs it: {hint}") from None
    except OSError as exc:  # the disk filled up, the folder was made read-only meanwhile
        why = exc.strerror or exc
        raise fail(f"could not write the site to {out} ({why}); {out} is as it was") from None
    mb = written["bytes"] / 1e6
    console.print(f"wrote {written['files']} files, {mb:.1f} MB, to {out}")
    console.print(f"serve it: python -m http.server -d {out} 8000")
