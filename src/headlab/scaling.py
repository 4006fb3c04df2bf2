"""Head analysis past one prompt and one process: text files, every head's scores averaged over
many prompts, and the prompts sharded across torch.distributed ranks.

    read_text       a UTF-8 text file as one long input (``headlab heads --text-file``)
    read_prompts    a prompts file: one text per line, or JSONL with a "text" field per line
    prompt_probes   each prompt as a text probe, checked against the model's length
    PromptSums      every head's scores summed over prompts (float64), and its offsets counted
    score_prompts   the sums over one rank's share of the prompts
    process_group   torch.distributed from torchrun's environment (gloo on CPU, NCCL on GPU)
    rank_budget     one rank's memory budget: its share of this machine's GPUs
    all_reduce      the ranks' sums added together
    heads_over_prompts  all of these: the table over a prompts file, from every rank
    prompt_table    the table from one rank's prompts, labels gated by random-weights floors

The table itself, its JSON and CSV, is :class:`headlab.head_table.HeadTable`.

Under ``torchrun --nproc-per-node N`` rank r scores prompts r, r + N, r + 2N, …; a prompt's
scores depend on its tokens alone, whichever rank scores it, and the sums are float64, so N
processes give the one-process means up to the order of the additions.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import Tensor

from headlab import files
from headlab.head_table import HeadTable
from headlab.heads import SCORE_TYPES, HeadScore, analyse
from headlab.heads.baselines import BASELINE_SEEDS, Floors, ScoreRows, floors_from
from headlab.heads.labels import decide
from headlab.heads.report import unused_seed
from headlab.measure import Probe, TokenizerLike, text_probe

MAX_PROMPT_CHARS = 100_000  # longest prompt line read (a 4,096-token prompt is ~20,000 chars)
MAX_PROMPTS_BYTES = 256 * 2**20  # largest prompts file read (thousands of long prompts)
OFFSET_WINDOW = 64  # positional offsets counted per head: −64..64
REDUCE_TIMEOUT = timedelta(hours=24)  # how long the final sum waits for the slowest rank


# --- reading ------------------------------------------------------------------------------------


def read_text(path: str | Path, max_chars: int = MAX_PROMPT_CHARS) -> str:
    """The whole of a UTF-8 text file, for one long input (``heads`` and ``syntax``
    ``--text-file``); a ValueError names the problem (missing, not a regular file, unreadable,
    not UTF-8, empty, over ``max_chars`` characters: :func:`headlab.files.read_text`)."""
    text = files.read_text(path, max_chars, "text file")
    if not text.strip():
        raise ValueError(f"text file {path} is empty; give at least one word")
    return text


def read_prompts(path: str | Path, max_chars: int = MAX_PROMPT_CHARS) -> list[tuple[int, str]]:
    """``(line number, text)`` of every prompt in a file: one text per line, or JSONL (every
    line a JSON object with a "text" string) when the first non-blank line starts with "{".
    Blank lines are skipped. A ValueError with one sentence for a missing or empty file, one
    that is not a regular file, a line that is not UTF-8, not JSON where JSONL is expected, or
    longer than ``max_chars``, or a file over :data:`MAX_PROMPTS_BYTES`. A line is read with a
    bound (at most 4 bytes a character), so a line with no end is never held whole."""
    p = Path(path)
    prompts: list[tuple[int, str]] = []
    jsonl: bool | None = None
    with files.open_regular(p, "prompts file") as f:
        for number, raw in enumerate(_bounded_lines(f, p, 4 * max_chars + 2), start=1):
            if len(raw) > 4 * max_chars + 1 and not raw.endswith(b"\n"):
                raise ValueError(_too_long(p, number, len(raw), max_chars, "bytes or more"))
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise ValueError(
                    f"line {number} of {p} is not UTF-8; save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            jsonl = line.lstrip().startswith("{") if jsonl is None else jsonl
            text = _json_text(line, number, p) if jsonl else line
            if len(text) > max_chars:
                raise ValueError(_too_long(p, number, len(text), max_chars, "characters"))
            prompts.append((number, text))
    if not prompts:
        raise ValueError(
            f"prompts file {p} has no prompts; write one text per line, or JSONL "
            'lines like {"text": "..."}'
        )
    return prompts


def _bounded_lines(f: BinaryIO, p: Path, longest: int) -> Iterator[bytes]:
    """The lines of ``f``, each cut at ``longest`` bytes, stopping with a ValueError once the
    file has given more than :data:`MAX_PROMPTS_BYTES`; read errors as a sentence."""
    total = 0
    while True:
        try:
            raw = f.readline(longest)
        except OSError as e:
            raise ValueError(f"prompts file {p}: cannot read it ({e.strerror or e})") from None
        if not raw:
            return
        total += len(raw)
        if total > MAX_PROMPTS_BYTES:
            raise ValueError(
                f"prompts file {p} is over {MAX_PROMPTS_BYTES:,} bytes; the most headlab reads "
                f"is {MAX_PROMPTS_BYTES:,} bytes: split it into several runs"
            )
        yield raw


def _too_long(p: Path, number: int, size: int, max_chars: int, unit: str) -> str:
    return (
        f"line {number} of {p} is {size:,} {unit}; a prompt may have at most "
        f"{max_chars:,} characters"
    )


def _json_text(line: str, number: int, p: Path) -> str:
    try:
        value = json.loads(line)
    except ValueError:
        value = None
    except RecursionError:  # the decoder recurses once per bracket
        raise ValueError(
            f"line {number} of {p} is nested too deeply to read as JSON; a JSONL line is an "
            'object like {"text": "..."}'
        ) from None
    if not isinstance(value, dict) or not isinstance(value.get("text"), str):
        raise ValueError(
            f'line {number} of {p} is not a JSON object with a "text" string, as '
            "the first line made this a JSONL file"
        )
    return str(value["text"])


def prompt_probes(
    tokenizer: TokenizerLike, prompts: list[tuple[int, str]], max_len: int, source: str = ""
) -> list[Probe]:
    """Each prompt as a text probe; a ValueError names the line of one the model cannot take."""
    probes = []
    for number, text in prompts:
        try:
            probes.append(text_probe(tokenizer, text, max_len))
        except ValueError as exc:
            raise ValueError(
                f"prompt on line {number} of {source or 'the prompts'}: {exc}"
            ) from None
    return probes


# --- summing over prompts -----------------------------------------------------------------------


@dataclass
class PromptSums:
    """Every head's scores summed over prompts, for a model of L layers × h heads.

    Rows are the L·h heads in layer-major order, then the L layers' averaged heads (as in a
    :class:`headlab.heads.HeadReport`). Sums are float64 so that adding in another order (other
    ranks) changes them only in the last bits.
    """

    n_layers: int
    n_heads: int
    sums: dict[str, Tensor] = field(default_factory=dict)  # type → (L·h + L,) float64
    counts: dict[str, int] = field(default_factory=dict)  # type → prompts that had it
    offsets: Tensor | None = None  # (L·h + L, 2W + 1) int64: prompts per offset −W..W
    prompts: int = 0
    tokens: int = 0

    @property
    def rows(self) -> int:
        return self.n_layers * (self.n_heads + 1)

    def add(self, report: Any) -> None:
        """Add one probe's :class:`headlab.heads.HeadReport`."""
        scored = [*report.heads, *report.averaged]
        for kind in scored[0].scores:
            values = torch.tensor([s.scores[kind] for s in scored], dtype=torch.float64)
            self.sums[kind] = (
                self.sums.get(kind, torch.zeros(self.rows, dtype=torch.float64)) + values
            )
            self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.offsets is None:
            self.offsets = torch.zeros(self.rows, 2 * OFFSET_WINDOW + 1, dtype=torch.long)
        for row, s in enumerate(scored):
            if abs(s.offset) <= OFFSET_WINDOW:
                self.offsets[row, s.offset + OFFSET_WINDOW] += 1
        self.prompts += 1
        self.tokens += len(report.ids)

    def score_rows(self) -> ScoreRows:
        """Each score's mean: type → (L, h) for the heads, type → (L, 1) for averaged heads."""
        means = {k: (v / self.counts[k]).float() for k, v in self.sums.items()}
        L, h_all = self.n_layers, self.n_layers * self.n_heads
        return (
            {k: v[:h_all].view(L, -1) for k, v in means.items()},
            {k: v[h_all:].view(L, 1) for k, v in means.items()},
        )

    def table(
        self, floors: Floors | None = None, averaged_floors: Floors | None = None
    ) -> HeadTable:
        """The mean of each score, each head labelled from its means and its most common
        offset (0 when none fell within ±:data:`OFFSET_WINDOW`); with ``floors`` (and the
        averaged heads' ``averaged_floors``, :func:`headlab.heads.baselines.floors_from`) each
        label needs its floor too, and each head carries it
        (:func:`headlab.heads.labels.decide`)."""
        if not self.prompts:
            raise ValueError("no prompts were scored")
        offsets = self.offsets if self.offsets is not None else torch.zeros(self.rows, 1)
        best = offsets.argmax(-1) - OFFSET_WINDOW
        best = torch.where(offsets.sum(-1) > 0, best, 0)
        kinds = sorted(self.sums, key=lambda k: SCORE_TYPES.index(k) if k in SCORE_TYPES else 99)
        means = {k: (self.sums[k] / self.counts[k]).tolist() for k in kinds}
        scored = []
        for row in range(self.rows):
            values = {k: means[k][row] for k in kinds}
            layer, head = _row_head(row, self.n_layers, self.n_heads)
            offset = int(best[row])
            gates = (floors if head >= 0 else averaged_floors) or {}
            d = decide(values, offset, gates.get(layer, {}) if floors is not None else None)
            scored.append(
                HeadScore(
                    layer,
                    head,
                    d.label,
                    values,
                    offset,
                    floor=d.floor,
                    margin=d.margin,
                    below_floor=d.below_floor,
                )
            )
        h_all = self.n_layers * self.n_heads
        return HeadTable(self.prompts, self.tokens, scored[:h_all], scored[h_all:], floors)


def _row_head(row: int, L: int, h: int) -> tuple[int, int]:
    return divmod(row, h) if row < L * h else (row - L * h, -1)


def score_prompts(
    model: Any,
    probes: list[tuple[int, Probe]],
    seed: int | None = None,
    content: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> PromptSums:
    """Sum every head's scores over ``(index, probe)`` pairs (:func:`headlab.heads.analyse`,
    streaming, no pattern kept). ``seed`` changes nothing and is deprecated."""
    unused_seed(seed, "score_prompts")
    sums = PromptSums(int(model.config.n_layers), int(model.config.n_heads))
    for done, (_, probe) in enumerate(probes, start=1):
        sums.add(analyse(model, probe, content=content, keep=()))
        if progress is not None:
            progress(done, len(probes))
    return sums


# --- many processes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks: rank, world size and the device it computes on."""

    rank: int
    world: int
    device: torch.device
    group: Any = None  # the process group of the final sum (None in one process)
    local: int = 0  # this rank's index on its machine (LOCAL_RANK)
    local_world: int = 1  # ranks on this machine (LOCAL_WORLD_SIZE)


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        raise ValueError(
            f"WORLD_SIZE is set but {name} is not an integer; start the ranks with "
            "torchrun, which sets RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"
        ) from None


@contextlib.contextmanager
def _stderr_to_file() -> Iterator[None]:
    """Send the C++ layer's stderr (c10d's connection logs) to a temporary file meanwhile."""
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def process_group(device: torch.device, timeout_s: float = 60.0) -> Iterator[Ranks]:
    """The ranks torchrun started (its WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT), joined
    with gloo (CPU, MPS) or NCCL (CUDA: rank i uses cuda:LOCAL_RANK); one process without them.

    Ranks that do not all connect within ``timeout_s`` seconds raise a ValueError saying so;
    the final sum then waits up to :data:`REDUCE_TIMEOUT` for the slowest rank.
    """
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        yield Ranks(0, 1, device)
        return
    rank, local = _env_int("RANK"), _env_int("LOCAL_RANK")
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    try:
        with _stderr_to_file():
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
            group = dist.new_group(backend=backend, timeout=REDUCE_TIMEOUT)
    except (RuntimeError, ValueError) as exc:  # DistError, DistNetworkError, DistStoreError
        raise ValueError(
            f"rank {rank} of {world} could not reach the other ranks at {where} within "
            f"{timeout_s:g} s ({type(exc).__name__}); start every rank with the same "
            "MASTER_ADDR and MASTER_PORT on a network they all reach, or raise --dist-timeout"
        ) from None
    try:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or world)
        yield Ranks(rank, world, device, group, local, local_world)
    finally:
        dist.destroy_process_group()


def rank_max_memory(budget: dict[int | str, Any], ranks: Ranks, gpus: int) -> dict[int | str, Any]:
    """The share of a machine's ``gpus`` GPUs that one rank's copy of a device-mapped model may
    use: local rank r of k gets GPUs r·g … r·g + g − 1, g = gpus // k (the CPU and disk
    budgets as given). ``budget`` holds every device's size (accelerate's ``get_max_memory``
    with the user's sizes over it). A ValueError when there are fewer GPUs than ranks."""
    if ranks.world == 1 or gpus == 0:
        return budget
    if gpus < ranks.local_world:
        raise ValueError(
            f"{ranks.local_world} ranks on this machine but {gpus} GPUs: each rank's copy of the "
            f"model needs at least one; start at most {gpus} (--nproc-per-node {gpus})"
        )
    per = gpus // ranks.local_world
    mine = set(range(ranks.local * per, (ranks.local + 1) * per))
    return {k: v for k, v in budget.items() if not isinstance(k, int) or k in mine}


def rank_budget(given: dict[int | str, Any] | None, ranks: Ranks) -> dict[int | str, Any]:
    """``max_memory`` for one rank's device-mapped copy of a model: every device's size
    (accelerate's ``get_max_memory``, the ``given`` sizes over it), narrowed to this rank's
    share of the machine's GPUs (:func:`rank_max_memory`). A ValueError without accelerate."""
    try:
        from accelerate.utils import get_max_memory
    except ImportError:
        raise ValueError("--device-map needs accelerate: pip install -e '.[big]'") from None
    full = {**get_max_memory(), **get_max_memory(given)} if given else get_max_memory()
    return rank_max_memory(full, ranks, torch.cuda.device_count())


def all_reduce(sums: PromptSums, ranks: Ranks) -> PromptSums:
    """Every rank's sums added together (the same result on every rank); ``sums`` itself in
    one process. A rank with no prompts contributes zeros."""
    if ranks.world == 1:
        return sums
    import torch.distributed as dist

    kinds_by_rank: list[Any] = [None] * ranks.world
    dist.all_gather_object(kinds_by_rank, sorted(sums.sums), group=ranks.group)
    kinds = sorted({k for ks in kinds_by_rank for k in ks})
    on = ranks.device if ranks.device.type == "cuda" else torch.device("cpu")
    zeros = torch.zeros(sums.rows, dtype=torch.float64)
    flat = torch.stack([sums.sums.get(k, zeros) for k in kinds]).to(on)  # (T, rows)
    counts = torch.tensor([sums.counts.get(k, 0) for k in kinds] + [sums.prompts, sums.tokens])
    offsets = sums.offsets
    if offsets is None:
        offsets = torch.zeros(sums.rows, 2 * OFFSET_WINDOW + 1, dtype=torch.long)
    counts, offsets = counts.to(on), offsets.to(on)
    for t in (flat, counts, offsets):
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=ranks.group)
    n = [int(c) for c in counts.cpu()]
    total = PromptSums(
        sums.n_layers, sums.n_heads, offsets=offsets.cpu(), prompts=n[-2], tokens=n[-1]
    )
    for kind, row, count in zip(kinds, flat.cpu(), n, strict=False):
        if count:
            total.sums[kind], total.counts[kind] = row, count
    return total


def heads_over_prompts(
    model_name: str,
    prompts_path: str | Path,
    seed: int | None = None,
    content: bool = True,
    load: dict[str, Any] | None = None,
    timeout_s: float = 60.0,
    progress: Callable[[int, int, Ranks], None] | None = None,
    floors: bool = True,
) -> tuple[HeadTable, Ranks]:
    """Every head's scores averaged over a prompts file (:func:`read_prompts`), the prompts
    shared out among the ranks torchrun started (:func:`process_group`; one process without it).

    ``load`` holds :func:`headlab.zoo.load`'s keywords (default: the CPU).
    With a ``device`` each rank computes on its own one; with a ``device_map`` each rank spreads
    its copy over its share of this machine's GPUs (:func:`rank_budget`). Rank r of N scores
    prompts r, r + N, …; every rank returns the same table, summed over all ranks, and its
    :class:`Ranks` (the process group is closed by then). ``progress(done, total, ranks)`` is
    called before this rank's first prompt (done 0) and after each, over every pass. With
    ``floors`` (the default) the labels are gated as one probe's are (:func:`prompt_table`: 3
    more passes over the prompts); without, thresholds alone. A ValueError says what is
    wrong: the file, the model, a prompt, or ranks that cannot reach each other. ``seed``
    changes nothing and is deprecated (a prompt's scores depend on its tokens alone).
    """
    from headlab import zoo

    unused_seed(seed, "heads_over_prompts")
    lines = read_prompts(prompts_path)
    load = dict(load or {})
    with process_group(load.get("device") or torch.device("cpu"), timeout_s) as ranks:
        if "device_map" not in load:
            load["device"] = ranks.device
        elif ranks.world > 1:
            load["max_memory"] = rank_budget(load.get("max_memory"), ranks)
        model, tokenizer = zoo.load(model_name, **load)
        probes = prompt_probes(tokenizer, lines, model.config.max_len, str(prompts_path))
        mine = list(enumerate(probes))[ranks.rank :: ranks.world]
        table = prompt_table(model, mine, ranks, content=content, floors=floors, progress=progress)
    return table, ranks


def prompt_table(
    model: Any,
    mine: list[tuple[int, Probe]],
    ranks: Ranks,
    seed: int | None = None,
    content: bool = True,
    floors: bool = True,
    progress: Callable[[int, int, Ranks], None] | None = None,
) -> HeadTable:
    """The table of :func:`heads_over_prompts` from this rank's ``(index, probe)`` pairs. With
    ``floors`` each label also needs its layer's floor: the same means for ``model``'s
    architecture with random weights (each of :data:`BASELINE_SEEDS`, the same prompts through
    :func:`score_prompts` and :func:`all_reduce`), mean + K_SD · sd over the random heads and
    seeds (:func:`headlab.heads.baselines.floors_from`): 3 more passes over the prompts.
    ``seed`` changes nothing and is deprecated."""
    unused_seed(seed, "prompt_table")
    passes = 1 + (len(BASELINE_SEEDS) if floors else 0)
    done_passes = [0]

    def pass_over(m: Any) -> PromptSums:
        start, total = done_passes[0] * len(mine), passes * len(mine)
        step = None if progress is None else (lambda done, _: progress(start + done, total, ranks))
        sums = all_reduce(score_prompts(m, mine, content=content, progress=step), ranks)
        done_passes[0] += 1
        return sums

    if progress is not None:
        progress(0, passes * len(mine), ranks)
    total = pass_over(model)
    if not floors:
        return total.table()
    return total.table(*floors_from(model, lambda m: pass_over(m).score_rows()))
