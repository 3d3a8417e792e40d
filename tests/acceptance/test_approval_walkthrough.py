"""The approval walkthrough (``examples/approval_walkthrough.py``) runs end to end as a
subprocess: five contracts park, four are approved and one rejected through their
completion links, the gate passes and each is filed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A deadline against a hang, not a speed goal (it takes seconds on a quiet machine).
DEADLINE = 180


def test_the_approval_walkthrough_passes_the_gate() -> None:
    done = subprocess.run([sys.executable, str(REPO / "examples" / "approval_walkthrough.py")],
                          cwd=REPO, capture_output=True, text=True, timeout=DEADLINE, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "all parked: {'waiting': 5}, gate 0, lease owner (none" in out
    assert out.count("approves") == 4 and "barbara rejects c4: 200" in out
    assert "the gate passed; partition complete" in out and "'c4': 'returned'" in out
    assert "Traceback" not in done.stderr
