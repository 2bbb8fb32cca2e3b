"""`vocable bench` on two revisions in one run: a change measured before and after, side by side.

The base revision is built into a wheel once (kept in ~/.cache/vocable/compare/REV) and
installed into its own venv that borrows every other package from the checkout's .venv, with its
own bench model cache there (its converter may differ); the working tree runs from .venv itself. The two then take turns, ROUNDS times each, so that a
machine that gets busier or cooler in between skews both alike. The table gives each stage's
median over the rounds (each round's figure is already the bench's median of its repeats) and
the ratio after / before: below 1 is faster now.

Usage: .venv/bin/python tools/bench/compare.py [--base REV] [--rounds 3] [-- BENCH ARGS...]
       (default bench args: --no-reference --no-long-text --types q8_0,q4_k --frames 50)
Output: progress on stderr; the table, then one JSON line with every round's figures, on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vocable" / "compare"
DEFAULT_BENCH_ARGS = ["--no-reference", "--no-long-text", "--types", "q8_0,q4_k", "--frames", "50"]


def say(text: str) -> None:
    print(f"[compare] {text}", file=sys.stderr, flush=True)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def base_python(rev: str) -> Path:
    """A Python that runs revision `rev` of Vocable: a venv holding its wheel, built once."""
    commit = git("rev-parse", "--verify", rev + "^{commit}")
    home = CACHE / commit[:12]
    python = home / "venv" / "bin" / "python"
    if python.exists():
        return python
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        say(f"building {rev} ({commit[:12]}) into a wheel: a few minutes")
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(Path(tmp) / "dist"),
                        str(src)], check=True)
        wheel = next((Path(tmp) / "dist").glob("vocable-*.whl"))
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home / "venv")], check=True)
        # the checkout's packages, as a plain path: its editable vocable's import hook is not loaded
        site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   check=True, capture_output=True, text=True).stdout.strip())
        (site / "vocable-compare-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                       check=True)
    return python


def run_bench(python: Path, bench_args: list[str]) -> dict:
    """One `vocable bench` run; its report (the last line it prints)."""
    out = subprocess.run([str(python), "-m", "vocable", "bench", *bench_args], cwd=REPO, stdout=subprocess.PIPE,
                         text=True)
    if out.returncode != 0:
        raise SystemExit(f"vocable bench failed ({python}): exit status {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def stage_figures(report: dict) -> dict[str, float]:
    """'group: label' -> our median ms, for every stage the run timed."""
    return {f"{s['group']}: {s['label']}": s["vocable_ms"] for s in report["stages"] if s.get("vocable_ms")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="the revision to compare the working tree with (default HEAD)")
    ap.add_argument("--rounds", type=int, default=3, help="turns each side takes (default 3)")
    ap.add_argument("bench_args", nargs="*", help="arguments for `vocable bench` (after --)")
    args = ap.parse_args()
    bench_args = args.bench_args or DEFAULT_BENCH_ARGS
    sides = {"before": base_python(args.base), "after": Path(sys.executable)}
    # each side converts the bench model with its own converter into its own cache, or the two
    # would redo each other's conversions every round
    side_args = {name: list(bench_args) for name in sides}
    if "--cache-dir" not in bench_args:
        side_args["before"] += ["--cache-dir", str(sides["before"].parents[2] / "bench")]
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    cpu = ""
    for r in range(args.rounds):
        for name, python in sides.items():
            say(f"round {r + 1} of {args.rounds}: {name}")
            report = run_bench(python, side_args[name])
            cpu = report.get("cpu", cpu)
            rounds[name].append(stage_figures(report))
    keys = [k for k in rounds["after"][0] if all(k in run for side in rounds.values() for run in side)]
    print(f"{cpu}, {args.rounds} rounds each, bench args: {' '.join(bench_args)}")
    print(f"{'stage':<56} {'before ms':>10} {'after ms':>10} {'after/before':>13}")
    rows = []
    for key in keys:
        before = statistics.median(run[key] for run in rounds["before"])
        after = statistics.median(run[key] for run in rounds["after"])
        rows.append({"stage": key, "before_ms": before, "after_ms": after, "ratio": round(after / before, 3)})
        print(f"{key[:56]:<56} {before:>10.1f} {after:>10.1f} {after / before:>13.3f}")
    print(json.dumps({"base": git("rev-parse", args.base), "cpu": cpu, "bench_args": bench_args, "rows": rows,
                      "rounds": rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
