"""How a model's attention is laid out across layers and heads: which layers are local (a
sliding window) and which global, and which key/value head each query head reads.

The head grid (page, notebook, ``headlab heads``) marks both from this one answer. Gemma 3 270M
has a 512-key window on five layers in six and global attention on every sixth (Gemma Team
2025); its 4 query heads share 1 K/V head (MQA, Shazeer 2019). SmolLM2-135M's 9 query heads read
3 K/V heads, 3 each (GQA, Ainslie et al. 2023): query head k reads K/V head k // (h / h_kv), as
``repeat_kv`` expands them.
"""

from __future__ import annotations

from typing import Any


def attention_layout(config: Any) -> dict[str, Any]:
    """The layout of a :class:`headlab.model.ModelConfig` (or anything with its fields) as JSON.

    Keys: ``n_kv_heads`` (h_kv; h for MHA); ``kv_group``, for each query head the K/V head it
    reads (length h); ``window``, the keys a local layer's query sees (itself included), or None;
    ``layer_kinds``, "local" or "global" per layer (all "global" without a window).
    """
    h = int(config.n_heads)
    h_kv = int(config.n_kv_heads or h)
    local = set(getattr(config, "local_layers", ()) or ())
    window = getattr(config, "sliding_window", None) if local else None
    return {
        "n_kv_heads": h_kv,
        "kv_group": [k // (h // h_kv) for k in range(h)],
        "window": window,
        "layer_kinds": [
            "local" if layer in local else "global" for layer in range(int(config.n_layers))
        ],
    }


def layout_lines(layout: dict[str, Any]) -> list[str]:
    """The layout in words, one sentence each (``headlab heads`` prints these): the K/V sharing
    when h_kv < h, and the local and global layers when there is a window. Empty for MHA
    without a window."""
    lines = []
    groups = layout["kv_group"]
    h, h_kv = len(groups), layout["n_kv_heads"]
    if h_kv < h:
        kind = "multi-query" if h_kv == 1 else "grouped-query"
        readers = [[str(k) for k, x in enumerate(groups) if x == g] for g in range(h_kv)]
        shared = "; ".join(
            f"K/V head {g} ← query heads {', '.join(r)}" for g, r in enumerate(readers)
        )
        lines.append(f"{kind} attention: {h // h_kv} query heads per K/V head ({shared})")
    kinds = layout["layer_kinds"]
    if layout["window"] is not None:
        local = [str(i) for i, k in enumerate(kinds) if k == "local"]
        wide = [str(i) for i, k in enumerate(kinds) if k == "global"]
        lines.append(
            f"local layers (a sliding window of {layout['window']} keys): {', '.join(local)}; "
            f"global layers (every key): {', '.join(wide) or 'none'}"
        )
    return lines
