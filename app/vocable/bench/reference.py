"""The reference side of `vocable bench`: the official PyTorch package, run by a stage group's
script from tools/bench/ in a subprocess, with the Python named by $VOCABLE_REFERENCE_PYTHON, or
this one when it has torch and qwen_tts; without either it is skipped, with the reason given."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from .measure import BenchInput, GroupResult

REFERENCE_PYTHON_ENV = "VOCABLE_REFERENCE_PYTHON"
REFERENCE_TIMEOUT_S = 3600
SYNTHESIS_SCRIPT = "reference_synthesis_timing.py"   # the generation and synthesis groups share its run
TOOLS_DIR = Path(__file__).resolve().parents[3] / "tools" / "bench"   # source checkouts only

_PROBE = ("import importlib.util as u, sys; "
          "sys.exit(0 if u.find_spec('torch') and u.find_spec('qwen_tts') else 3)")


def find_reference_python() -> tuple[str | None, str]:
    """(interpreter, '') or (None, why not)."""
    named = os.environ.get(REFERENCE_PYTHON_ENV)
    if named:
        if not Path(named).is_file():
            return None, f"{REFERENCE_PYTHON_ENV}={named} does not exist"
        try:
            probe = subprocess.run([named, "-c", _PROBE], capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"{REFERENCE_PYTHON_ENV}={named} does not run ({e})"
        if probe.returncode != 0:
            return None, f"{REFERENCE_PYTHON_ENV}={named} lacks torch or qwen_tts"
        return named, ""
    if importlib.util.find_spec("torch") and importlib.util.find_spec("qwen_tts"):
        return sys.executable, ""
    return None, (f"no Python with torch and qwen-tts: set {REFERENCE_PYTHON_ENV} to one "
                  "(qwen-tts 0.1.1, torch, transformers 4.57.3)")


def run_reference(group, python: str, hf_dir: Path, inp: BenchInput) -> GroupResult:
    """The group's reference script in a subprocess. Groups that ask for the same script with the
    same arguments get the result of one run (kept in inp.shared)."""
    script = TOOLS_DIR / group.reference_script
    args = group.reference_args(inp)
    done = inp.shared.setdefault("reference_runs", {})
    key = (group.reference_script, python, str(hf_dir), tuple(args))
    if key not in done:
        done[key] = _run_reference_script(script, python, hf_dir, inp, args)
    return done[key]


def _run_reference_script(script: Path, python: str, hf_dir: Path, inp: BenchInput, args: list[str]) -> GroupResult:
    if not script.is_file():
        return GroupResult(error=f"skipped: {script} not found (the reference scripts live in a source checkout)")
    outputs = inp.work_dir / f"reference-{script.stem}.npz"
    outputs.unlink(missing_ok=True)
    cmd = [python, str(script), "--model-dir", str(hf_dir), "--clip", str(inp.clip_path), "--outputs", str(outputs),
           "--threads", str(inp.threads), "--repeats", str(inp.repeats), *args]
    env = dict(os.environ, OMP_NUM_THREADS=str(inp.threads), MKL_NUM_THREADS=str(inp.threads),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=REFERENCE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return GroupResult(error=f"failed: {script.name} ran past {REFERENCE_TIMEOUT_S} s")
    except OSError as e:
        return GroupResult(error=f"failed: cannot run {python}: {e}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return GroupResult(error=f"failed: {script.name} exited with {proc.returncode}:\n{tail}")
    try:
        report = json.loads(lines[-1])
        with np.load(outputs) as npz:
            outs = {k: npz[k] for k in npz.files}
    except (ValueError, OSError) as e:
        return GroupResult(error=f"failed: unreadable result from {script.name}: {e}")
    return GroupResult(runs_ms={k: list(v) for k, v in report.get("runs_ms", {}).items()}, outputs=outs,
                       extra={k: v for k, v in report.items() if k not in ("runs_ms", "median_ms")})
