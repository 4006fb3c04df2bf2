"""The whole model: embedding → blocks → final norm → unembedding, with a KV cache per layer for
decoding, greedy or sampled generation, and its own save / load. Shapes as in
:mod:`headlab.model`'s legend.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from headlab.attention import KVCache
from headlab.model.config import ModelConfig, read_config
from headlab.model.layers import Block, Rotary, make_norm
from headlab.model.sampling import generation_problems, pick_tokens
from headlab.model.streaming import SinkCache
from headlab.trace import Trace


class MissingModelFile(FileNotFoundError, ValueError):
    """A file a saved model needs is missing: a FileNotFoundError, and a ValueError, as every
    other problem with a model folder is, so that a caller reports them all alike."""


class SkipInit(TorchFunctionMode):
    """Inside this context ``torch.nn.init``'s random fills do nothing: the new modules keep
    uninitialised memory. For weights about to be loaded from a file, where drawing 135 M
    random numbers first took longer than reading the file. Torch function modes are per
    thread, so other threads are unaffected.
    """

    SKIPPED = frozenset(
        {nn.init.normal_, nn.init.uniform_, nn.init.kaiming_uniform_, nn.init.trunc_normal_}
    )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.SKIPPED:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


class SeededInit(TorchFunctionMode):
    """Inside this context ``torch.nn.init``'s random fills draw from ``generator`` instead of
    torch's global one, in the same order and by the same rule, so a model built here with a
    generator seeded s equals one built after ``torch.manual_seed(s)``. The global generator is
    shared by every thread (a server answering requests while it trains), this one is not;
    torch function modes are per thread, so other threads are unaffected."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SkipInit.SKIPPED:
            return func(*args, **{**kwargs, "generator": self.generator})
        return func(*args, **kwargs)


class Transformer(nn.Module):
    """Embedding → blocks → final norm → unembedding, recording into an optional Trace."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = (
            nn.Embedding(config.max_len, config.d_model) if config.positional == "learned" else None
        )
        self.embed_norm = make_norm(config) if config.embed_norm else None
        rotary = config.positional == "rotary"
        self.rotary = Rotary(config.d_k, config.rope_theta, config.rotary_dim) if rotary else None
        # Gemma 3's local layers turn queries and keys with their own, lower RoPE base
        local_theta = rotary and config.rope_theta_local is not None and config.local_layers
        self.rotary_local = (
            Rotary(config.d_k, config.rope_theta_local, config.rotary_dim)  # type: ignore[arg-type]
            if local_theta
            else None
        )
        self.blocks = nn.ModuleList(Block(config, l) for l in range(config.n_layers))
        pre = config.norm in ("pre", "sandwich")
        self.final_norm = make_norm(config) if pre else nn.Identity()
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.drop = nn.Dropout(config.dropout)
        self._init_weights()
        if config.tie_embeddings:
            self.unembed.weight = self.embed.weight

    def _init_weights(self) -> None:
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        # scale the residual-writing projections by depth, as GPT-2 does
        for block in self.blocks:
            assert isinstance(block, Block)
            out_std = std / math.sqrt(2 * self.config.n_layers)
            nn.init.normal_(block.attn.W_O.weight, std=out_std)
            if block.mlp is not None:
                nn.init.normal_(block.mlp.W_out.weight, std=out_std)

    def forward(
        self,
        tokens: Tensor,
        *,
        trace: Trace | None = None,
        head_mask: Tensor | None = None,
        allowed: Tensor | None = None,
        cache: list[KVCache] | None = None,
    ) -> Tensor:
        """tokens (B, n) int → logits (B, n, V).

        trace: receives the named activations listed in the module docstring.
        head_mask: (n_layers, h) or (B, n_layers, h) factors on each head's output (1 keeps,
        0 ablates), reaching every layer (Michel et al. 2019).
        allowed: (B, n) bool, False at padding positions, which no query may attend to.
        cache: one :class:`KVCache` per layer (:meth:`new_cache`); the tokens continue the
        cached ones, at positions cache length … cache length + n − 1. With a
        :class:`SinkCache` per layer (:meth:`new_sink_cache`) a chunk that overflows it is fed
        token by token (then ``trace`` must be off).
        """
        x = self.hidden_states(
            tokens, trace=trace, head_mask=head_mask, allowed=allowed, cache=cache
        )
        return self.logits(x)  # (B, n, V)

    def logits(self, hidden: Tensor) -> Tensor:
        """The final hidden state (…, d_model) → logits (…, V), soft-capped to (−c, c) as
        c · tanh(logits / c) when the config has ``logit_softcap`` c (Gemma 2)."""
        logits = self.unembed(hidden)
        c = self.config.logit_softcap
        return logits if c is None else c * torch.tanh(logits / c)

    def hidden_states(
        self,
        tokens: Tensor,
        *,
        trace: Trace | None = None,
        head_mask: Tensor | None = None,
        allowed: Tensor | None = None,
        cache: list[KVCache] | None = None,
    ) -> Tensor:
        """tokens (B, n) → the final hidden state (B, n, d_model), before the unembedding."""
        trace = trace if trace is not None else Trace.off()
        if cache and _overflows(cache, tokens):
            return self._stream(tokens, trace, head_mask, cache)
        offset = self._check_cache(cache, tokens, allowed)
        limit = max(cache[0].capacity, self.config.max_len) if cache else self.config.max_len
        B, n = self._check_tokens(tokens, offset, limit)
        masks = self._layer_head_masks(head_mask, B)
        key_allowed = self._check_allowed(allowed, B, n)
        layer_caches: list[KVCache | None] = list(cache) if cache else [None] * len(self.blocks)
        x = self.embed(tokens)  # (B, n, d_model)
        if self.config.embed_scale != 1.0:  # Gemma: √d_model, as a tensor of the weights' dtype
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        if self.pos_embed is not None:
            positions = torch.arange(offset, offset + n, device=tokens.device)
            x = x + self.pos_embed(positions)  # (B, n, d_model)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        x = self.drop(x)
        trace.record("embed", x)
        for l, block in enumerate(self.blocks):
            scope = trace.scope(f"blocks.{l}")
            local = self.rotary_local is not None and l in self.config.local_layers
            rope = self.rotary_local if local else self.rotary
            x = block(x, scope, masks[l], key_allowed, rope, layer_caches[l])
        x = self.final_norm(x)
        trace.record("final", x)
        return x

    def _stream(
        self, tokens: Tensor, trace: Trace, head_mask: Tensor | None, cache: list[KVCache]
    ) -> Tensor:
        """Hidden states (B, n, d_model) of a chunk that overflows a sink cache: what fits in
        one pass, then one token at a time (each token's window differs)."""
        if trace.enabled:
            raise ValueError(
                "a chunk that overflows a sink cache runs token by token; "
                "trace it in pieces that fit, or without the cache"
            )
        fit = max(cache[0].capacity - cache[0].length, 0)
        pieces = [tokens[:, :fit]] if fit else []
        pieces += list(tokens[:, fit:].split(1, dim=1))
        return torch.cat(
            [self.hidden_states(p, head_mask=head_mask, cache=cache) for p in pieces], dim=1
        )

    def _check_tokens(
        self, tokens: Tensor, offset: int = 0, limit: int | None = None
    ) -> tuple[int, int]:
        if tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(
                f"tokens must be an integer tensor of shape (B, n), got {tuple(tokens.shape)} "
                f"{tokens.dtype}; add a batch dimension with tokens.unsqueeze(0)"
            )
        B, n = tokens.shape
        limit = self.config.max_len if limit is None else limit
        if n < 1 or offset + n > limit:
            cached = f" after {offset} cached positions" if offset else ""
            raise ValueError(
                f"sequence length {n}{cached} is outside 1..{limit - offset} "
                f"(max_len {self.config.max_len})"
            )
        # a traced graph (torch.export) holds no check on the ids' values: its caller checks them
        checkable = tokens.numel() and not torch.compiler.is_compiling()
        if checkable and (tokens.min() < 0 or tokens.max() >= self.config.vocab_size):
            raise ValueError(
                f"token ids must be in 0..{self.config.vocab_size - 1}, got "
                f"{int(tokens.min())}..{int(tokens.max())}"
            )
        return B, n

    def _check_cache(
        self, cache: list[KVCache] | None, tokens: Tensor, allowed: Tensor | None
    ) -> int:
        """The number of positions already cached (0 without a cache), after checking it."""
        if cache is None:
            return 0
        L = self.config.n_layers
        if len(cache) != L or len({c.length for c in cache}) != 1:
            raise ValueError(
                f"cache must hold one KVCache per layer ({L}), all of the same length; "
                "make it with model.new_cache(batch, capacity)"
            )
        if allowed is not None:
            raise ValueError("a KV cache decodes unpadded sequences: pass allowed=None with it")
        if not self.config.causal:
            raise ValueError("a KV cache needs a causal model; this one attends both ways")
        if tokens.dim() == 2 and cache[0].k.shape[0] != tokens.shape[0]:
            raise ValueError(
                f"the cache holds {cache[0].k.shape[0]} sequences but tokens has "
                f"{tokens.shape[0]}; make one with model.new_cache({tokens.shape[0]}, capacity)"
            )
        return cache[0].next_position(tokens.shape[-1])

    def new_cache(self, batch: int, capacity: int) -> list[KVCache]:
        """An empty KV cache per layer for ``batch`` sequences of up to ``capacity`` positions.

        Each layer's holds keys and values (B, h_kv, capacity, d_k): 2 · L · B · h_kv · s · d_k
        numbers in all for s positions, h / h_kv times fewer than with one K/V head per query
        head (Shazeer 2019; Ainslie et al. 2023).
        """
        if not 1 <= capacity <= self.config.max_len:
            raise ValueError(
                f"cache capacity must be 1..{self.config.max_len} (max_len), got {capacity}"
            )
        return [block.attn.new_cache(batch, capacity) for block in self._blocks()]

    def new_sink_cache(self, batch: int, sinks: int, window: int) -> list[KVCache]:
        """A :class:`SinkCache` per layer: the first ``sinks`` tokens and the last ``window``
        (Xiao et al. 2023), positions taken as cache slots, so text of any length fits in
        sinks + window positions. A rotary model may hold more than max_len positions this
        way (past its trained context, as the full-cache baseline of a streaming test does);
        learned position embeddings cannot be moved to a new slot, so they are refused."""
        if self.config.positional == "learned":
            raise ValueError(
                "a sink cache moves keys to new positions, which learned position "
                "embeddings cannot follow; use a rotary model"
            )
        return [
            SinkCache(
                batch,
                b.attn.n_kv_heads,
                b.attn.d_k,
                sinks,
                window,
                b.attn.W_K.weight.dtype,
                b.attn.W_K.weight.device,
            )
            for b in self._blocks()
        ]

    def _blocks(self) -> list[Block]:
        return [block for block in self.blocks if isinstance(block, Block)]

    def _layer_head_masks(self, head_mask: Tensor | None, B: int) -> list[Tensor | None]:
        L, h = self.config.n_layers, self.config.n_heads
        if head_mask is None:
            return [None] * L
        if head_mask.shape == (L, h):
            return list(head_mask.to(self.embed.weight.dtype))
        if head_mask.shape == (B, L, h):
            return list(head_mask.to(self.embed.weight.dtype).transpose(0, 1))
        raise ValueError(
            f"head_mask has shape {tuple(head_mask.shape)}; expected (n_layers, h) = ({L}, {h}) "
            f"or (B, n_layers, h) = ({B}, {L}, {h})"
        )

    def _check_allowed(self, allowed: Tensor | None, B: int, n: int) -> Tensor | None:
        if allowed is None:
            return None
        if allowed.dtype != torch.bool or allowed.shape != (B, n):
            raise ValueError(
                f"allowed must be a bool tensor of shape (B, n) = ({B}, {n}) with False at "
                f"padding; got {tuple(allowed.shape)} {allowed.dtype}"
            )
        return allowed[:, None, None, :]  # (B, 1, 1, n)

    @torch.inference_mode()
    def generate(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        seed: int | None = None,
        eos_id: int | None = None,
        window: int | None = None,
        sinks: int = 0,
    ) -> Tensor:
        """tokens (B, n) → (B, n + new): the prompt followed by up to ``max_new_tokens`` tokens.

        One forward pass over the prompt fills a KV cache (:meth:`new_cache`); every further
        step runs only the newest token. temperature 0 picks the most likely token (greedy);
        above 0, tokens are sampled from softmax(logits / temperature), restricted to the
        ``top_k`` most likely when given, with a generator seeded by ``seed``. With ``eos_id``
        a sequence that emits it is padded with it, and decoding stops once all have.
        With ``window`` the cache keeps the first ``sinks`` tokens and the last ``window``
        (:meth:`new_sink_cache`), so prompt and continuation may run past the context.
        Raises ValueError for settings outside these ranges or a prompt that leaves no room.
        """
        n = tokens.shape[-1]
        kept = (window or 0) + sinks
        problems = generation_problems(
            n, self.config, max_new_tokens, temperature, top_k, bounded=window is None, kept=kept
        )
        if problems:
            raise ValueError("; ".join(problems))
        B, n = self._check_tokens(tokens, limit=None if window is None else n)
        cache = (
            self.new_cache(B, n + max_new_tokens)
            if window is None
            else self.new_sink_cache(B, sinks, window)
        )
        generator = None if seed is None else torch.Generator(tokens.device).manual_seed(seed)
        hidden = self.hidden_states(tokens, cache=cache)[:, -1]  # (B, d_model)
        out, done = [tokens], torch.zeros(B, dtype=torch.bool, device=tokens.device)
        for step in range(max_new_tokens):
            logits = self.logits(hidden)  # (B, V)
            new = pick_tokens(logits, temperature, top_k, generator)  # (B,)
            if eos_id is not None:
                new = new.masked_fill(done, eos_id)
                done |= new == eos_id
            out.append(new[:, None])
            if step + 1 == max_new_tokens or bool(done.all()):
                break
            hidden = self.hidden_states(new[:, None], cache=cache)[:, -1]  # (B, d_model)
        return torch.cat(out, dim=1)  # (B, n + new)

    def save(self, directory: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory``, each atomically;
        returns it. For a whole folder at once, save into :func:`headlab.files.new_folder`."""
        from safetensors.torch import save_model

        from headlab.files import write_atomic, write_json

        path = Path(directory)
        write_json(path / "config.json", self.config.to_dict(), indent=2)
        write_atomic(path / "model.safetensors", lambda file: save_model(self, str(file)))
        return path

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> Transformer:
        """The model saved by :meth:`save` in ``directory``, in eval mode."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(directory)
        for name in ("config.json", "model.safetensors"):
            if not (path / name).is_file():
                raise MissingModelFile(f"{path / name} is missing; expected a Transformer.save dir")
        config = read_config(path / "config.json")
        with torch.device(device), SkipInit():  # every weight is replaced by the file's
            model = cls(config)
        # the file's tensors become the weights, no copy: they are mapped from the file
        # (privately, so writing to a weight never changes the file) and read in on first use
        try:
            state = load_file(str(path / "model.safetensors"), device=str(device))
        except (SafetensorError, OSError) as exc:  # truncated, empty, not safetensors at all
            raise ValueError(
                f"{path / 'model.safetensors'} cannot be read as safetensors ({exc}); save the "
                "model again"
            ) from None
        if config.tie_embeddings:  # saved once, under either name
            shared = state.pop("unembed.weight", None)
            state.setdefault("embed.weight", shared)  # type: ignore[arg-type]
        try:
            missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        except RuntimeError as exc:  # a tensor of another shape than the config makes
            first = str(exc).strip().splitlines()[-1].strip()
            raise ValueError(
                f"{path / 'model.safetensors'} does not fit its config.json: {first}"
            ) from None
        if config.tie_embeddings:
            model.unembed.weight = model.embed.weight  # assign replaced the shared Parameter
            missing = [k for k in missing if k != "unembed.weight"]
        if missing or unexpected:
            raise ValueError(
                f"{path / 'model.safetensors'} does not fit its config.json: missing "
                f"{sorted(missing) or 'nothing'}, unexpected {sorted(unexpected) or 'nothing'}"
            )
        return model.eval()

    def num_params(self) -> int:
        """Number of distinct parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())


def _overflows(cache: list[KVCache], tokens: Tensor) -> bool:
    """Whether a chunk of several tokens overflows a sink cache (it is then fed piecewise)."""
    first = cache[0]
    n = tokens.shape[-1]
    return isinstance(first, SinkCache) and n > 1 and first.length + n > first.capacity
