"""tools/soak.py, the long mixed-work run, kept working: a quarter-minute of it must pass its own
checks (memory after the warm-up, every error its own, everything saved read back)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parent.parent / "tools" / "soak.py"


def test_a_short_soak_passes(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(SOAK), "--minutes", "0.25", "--seed", "3", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["failures"] == [] and sum(summary["operations"].values()) >= 5
    assert "failures: none" in proc.stdout
