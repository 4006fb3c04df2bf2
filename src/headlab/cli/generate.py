"""``headlab generate``: continue a prompt with a model, optionally labelling its heads."""

from __future__ import annotations

import typer

from headlab.cli.common import SEED_MAX, ModelName, console, ensure_fetched, fail


def generate(
    model: ModelName = "default",
    prompt: str = typer.Option(..., "--prompt", help="The text to continue."),
    # max_new_tokens, temperature and top_k are checked by the library, with the model's context
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="Most tokens to add."),
    temperature: float = typer.Option(0.0, help="0 picks the likeliest token; above 0 samples."),
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

    import torch

    from headlab import zoo
    from headlab.generation import generate_text

    ensure_fetched(model)
    try:
        m, tokenizer = zoo.load(model)
        result = generate_text(m, tokenizer, prompt, max_new_tokens, temperature, top_k, seed)
        report = None
        if show_heads:
            from headlab.heads import analyse
            from headlab.measure import make_probe

            ids = torch.tensor([result.prompt_ids + result.new_ids])
            report = analyse(m, make_probe("text", ids, tokenizer), seed or 0)
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
