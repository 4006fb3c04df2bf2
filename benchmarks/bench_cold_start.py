"""Cold start of the command line: seconds from launching ``headlab ...`` to its exit, beside
``python -c "import torch"`` measured in the same run.

Each command is a fresh interpreter (``python -m headlab.cli``, the same code as the ``headlab``
console script, with this checkout's ``src`` first on PYTHONPATH). The commands run interleaved
round by round, so a busy machine slows them all alike, after one untimed warm-up round that
fills the page cache: "cold" is a new process, not a cold disk. Per command it reports the median,
least and most wall seconds and the median CPU seconds (user + system) of its rounds, and the
median as a ratio to the torch import's median. Goals: ``--help`` under 0.3 s, and ``shapes``
under the torch import alone. ``shapes`` answers from the shape table (headlab/shapes/figures.py,
no torch), which the tests hold equal to the traced layer; ``shapes --trace`` runs the real layer
on the meta device, so it imports torch, and nothing else heavy. Two more reference rows show what
that trace steps around: PyTorch computes the meta results of products and softmax in Python, and
the first such call imports torch._dynamo (``mul``'s type promotion) or, through
``torch._check``, torch.fx's symbolic shapes and sympy (``mm``); the trace makes those results
itself (headlab/shapes/report.py). The machine (cores, platform) and its load average at the
start and the end are written with the figures, and the versions it ran on (Python, torch, the
lock: headlab.provenance), since a shared machine's figures mean little without them.

Run: ``python benchmarks/bench_cold_start.py [--rounds 7] [--json PATH]``; writes
``benchmarks/results/cold_start.json`` by default.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from headlab.files import write_json
from headlab.provenance import versions
from record import command, count

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "cold_start.json"
REFERENCE = 'python -c "import torch"'
# torch's Python meta kernels for elementwise products import torch._dynamo on their first call
# (torch/_compile.py); `headlab shapes --trace` avoids that, and this row shows what it avoids
META_OP = "import torch; torch.empty(1, device='meta') * 2"
# a Python meta kernel's torch._check imports symbolic_shapes (sympy); the trace avoids it too
META_MM = "import torch; x = torch.empty(2, 2, device='meta'); x @ x"
HEADLAB = [sys.executable, "-m", "headlab.cli"]
COMMANDS: dict[str, list[str]] = {
    REFERENCE: [sys.executable, "-c", "import torch"],
    f'python -c "{META_OP}"': [sys.executable, "-c", META_OP],
    f'python -c "{META_MM}"': [sys.executable, "-c", META_MM],
    "headlab --help": [*HEADLAB, "--help"],
    "headlab models": [*HEADLAB, "models"],
    "headlab shapes --d-model 512 --heads 8": [
        *HEADLAB,
        "shapes",
        "--d-model",
        "512",
        "--heads",
        "8",
    ],
    "headlab shapes --d-model 512 --heads 8 --trace": [
        *HEADLAB,
        "shapes",
        "--d-model",
        "512",
        "--heads",
        "8",
        "--trace",
    ],
    "headlab heads --model default": [*HEADLAB, "heads", "--model", "default"],
}


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run of ``cmd``; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(rounds: int) -> dict[str, dict[str, list[float]]]:
    """Every command's wall and CPU seconds per round, after one untimed warm-up round."""
    src = str(ROOT / "src")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
    }
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in COMMANDS}
    for cmd in COMMANDS.values():
        run_once(cmd, env)
    for _ in range(rounds):
        for name, cmd in COMMANDS.items():
            wall, cpu = run_once(cmd, env)
            times[name]["wall"].append(wall)
            times[name]["cpu"].append(cpu)
    return times


def summarise(times: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Median, least, most wall seconds, median CPU seconds, and the ratio to the reference."""
    ref = statistics.median(times[REFERENCE]["wall"])
    out = {}
    for name, t in times.items():
        median = statistics.median(t["wall"])
        out[name] = {
            "median_s": median,
            "min_s": min(t["wall"]),
            "max_s": max(t["wall"]),
            "cpu_median_s": statistics.median(t["cpu"]),
            "ratio_to_torch_import": median / ref,
        }
    return out


def table(figures: dict[str, dict[str, float]]) -> dict[str, list]:
    """The docs' table: each command's median, spread and ratio to the torch import."""
    rows = [
        [
            f"`{name}`",
            f"{f['median_s']:.3f}",
            f"{f['min_s']:.3f}–{f['max_s']:.3f}",
            f"{f['ratio_to_torch_import']:.2f}",
        ]
        for name, f in figures.items()
    ]
    return {"columns": ["command", "median (s)", "range (s)", "× torch import"], "rows": rows}


def machine() -> dict[str, object]:
    return {"cores": os.cpu_count(), "platform": platform.platform()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds",
        type=count(5),
        default=7,
        help="timed runs of each command (≥ 5: the medians need them)",
    )
    parser.add_argument("--json", type=Path, default=RESULTS, help="where to write the figures")
    args = parser.parse_args()
    load_start = tuple(round(x, 2) for x in os.getloadavg())
    figures = summarise(measure(args.rounds))
    load_end = tuple(round(x, 2) for x in os.getloadavg())
    info, ran_on = machine(), versions()
    print(
        f"cold start, {args.rounds} interleaved rounds; {info['cores']} cores, Python "
        f"{ran_on['python']}, torch {ran_on['torch']}, lock {ran_on['lock']}"
    )
    print(f"load average (1, 5, 15 min): start {load_start}, end {load_end}")
    w = max(map(len, figures))
    print(f"{'command':<{w}} {'median s':>9} {'min s':>7} {'max s':>7} {'cpu s':>7} {'× torch':>8}")
    for name, f in figures.items():
        print(
            f"{name:<{w}} {f['median_s']:>9.3f} {f['min_s']:>7.3f} {f['max_s']:>7.3f} "
            f"{f['cpu_median_s']:>7.3f} {f['ratio_to_torch_import']:>8.2f}"
        )
    load = {"start": list(load_start), "end": list(load_end)}
    write_json(
        args.json,
        {
            "command": command(),
            "date": datetime.date.today().isoformat(),
            "machine": {**info, "load_average": load},
            "versions": ran_on,
            "rounds": args.rounds,
            "reference": REFERENCE,
            "commands": figures,
            "table": table(figures),
        },
    )
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
