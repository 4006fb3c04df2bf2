"""``headlab generate``: continue a prompt with a model, optionally labelling its heads."""

from __future__ import annotations

from typing import Any

import typer

from headlab.cli.common import SEED_MAX, ModelName, console, ensure_fetched, fail


def generate(
    model: ModelName = "default",
    prompt: str = typer.Option(..., "--prompt", help="The text to continue."),
    # max_new_tokens, temperature and top_k are checked by the library, with the model's context
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="Most tokens to add."),
    temperature: float = typer.Option(
        0.0,
        help="0 picks the likeliest token; above 0 samples. One too small to divide by (e.g. "
        "1e-320) picks the likeliest token too, the limit of sampling as it goes to 0.",
    ),
    top_k: int | None = typer.Option(None, "--top-k", help="Sample from the k likeliest only."),
    seed: int | None = typer.Option(
        None, min=0, max=SEED_MAX, help="Seed of the sampling (with --temperature), 0..2**63-1."
    ),
    show_heads: bool = typer.Option(
        False, "--heads", help="Also score and label every head on the prompt and its continuation."
    ),
    window: int | None = typer.Option(
        None,
        "--window",
        help="Keep only the latest W tokens in the KV cache (plus --sinks), so "
        "the text may run past the model's context (StreamingLLM, Xiao et al. 2023).",
    ),
    sinks: int | None = typer.Option(
        None, "--sinks", help="With --window: also keep the first S tokens (attention sinks)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Continue a prompt with a model (KV-cached decoding), optionally labelling its heads."""
    import json
    import math

    if not math.isfinite(temperature):
        raise fail(f"--temperature must be a finite number, 0 or more; got {temperature}")
    _check_streaming(window, sinks)
    stream = {} if window is None else {"window": window, "sinks": sinks or 0}

    ensure_fetched(model)
    try:
        result, report = _continue(
            model, prompt, max_new_tokens, temperature, top_k, seed, show_heads, stream
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    if as_json:
        heads = {"heads": report.to_dict()} if report is not None else {}
        typer.echo(
            json.dumps({"model": model, **result.to_dict(), **stream, **heads}, ensure_ascii=False)
        )
        return
    console.print(f"[dim]{prompt}[/][bold]{result.text}[/]", highlight=False, markup=True)
    if report is not None:
        from headlab.heads.render import heads_table

        title = f"{model}: the prompt and its continuation, {len(report.tokens)} tokens"
        console.print(heads_table(report, title))


def _check_streaming(window: int | None, sinks: int | None) -> None:
    """--window must be at least 1; --sinks (0 or more) only with it."""
    if window is not None and window < 1:
        raise fail(f"--window must be at least 1 token, got {window}")
    if sinks is not None and window is None:
        raise fail("--sinks needs --window: sinks are kept beside a window of recent tokens")
    if sinks is not None and sinks < 0:
        raise fail(f"--sinks must be 0 or more, got {sinks}")


def _continue(
    model: str,
    prompt: str,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int | None,
    show_heads: bool,
    stream: dict[str, int],
) -> tuple[Any, Any]:
    """The continuation (headlab.generation.generate_text) and, with ``show_heads``, the
    :class:`headlab.heads.HeadReport` of the prompt and its continuation (else None)."""
    import torch

    from headlab import zoo
    from headlab.generation import generate_text

    m, tokenizer = zoo.load(model)
    result = generate_text(m, tokenizer, prompt, max_new_tokens, temperature, top_k, seed, **stream)
    if not show_heads:
        return result, None
    from headlab.heads import analyse
    from headlab.measure import make_probe

    ids = torch.tensor([result.prompt_ids + result.new_ids])
    return result, analyse(m, make_probe("text", ids, tokenizer))
