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
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Continue a prompt with a model (KV-cached decoding), optionally labelling its heads."""
    import json
    import math

    if not math.isfinite(temperature):
        raise fail(f"--temperature must be a finite number, 0 or more; got {temperature}")

    ensure_fetched(model)
    try:
        result, report = _continue(model, prompt, max_new_tokens, temperature, top_k, seed,
                                   show_heads)  # fmt: skip
    except ValueError as exc:
        raise fail(str(exc)) from None
    if as_json:
        heads = {"heads": report.to_dict()} if report is not None else {}
        typer.echo(json.dumps({"model": model, **result.to_dict(), **heads}, ensure_ascii=False))
        return
    console.print(f"[dim]{prompt}[/][bold]{result.text}[/]", highlight=False, markup=True)
    if report is not None:
        from headlab.heads.render import heads_table

        title = f"{model}: the prompt and its continuation, {len(report.tokens)} tokens"
        console.print(heads_table(report, title))


def _continue(
    model: str,
    prompt: str,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int | None,
    show_heads: bool,
) -> tuple[Any, Any]:
    """The continuation (headlab.generation.generate_text) and, with ``show_heads``, the
    :class:`headlab.heads.HeadReport` of the prompt and its continuation (else None)."""
    import torch

    from headlab import zoo
    from headlab.generation import generate_text

    m, tokenizer = zoo.load(model)
    result = generate_text(m, tokenizer, prompt, max_new_tokens, temperature, top_k, seed)
    if not show_heads:
        return result, None
    from headlab.heads import analyse
    from headlab.measure import make_probe

    ids = torch.tensor([result.prompt_ids + result.new_ids])
    return result, analyse(m, make_probe("text", ids, tokenizer), seed or 0)
