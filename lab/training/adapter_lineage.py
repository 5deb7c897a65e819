"""Writes the shipped adapter's held-out curve (assets/adapters/smollm2-135m-skipdecode/
heldout_curve.json, the Results tab's training figure) from the committed logs of the three runs
that made it, each continuing the previous one's adapter:

    python lab/training/adapter_lineage.py

1. rank 64 on the 28k make-data set (GPU, batch 64): assets/study/gpu-2026-11-23, run long-r64;
2. continued with trimmed targets and on-policy sequences (GPU, batch 64): assets/study/
   gpu-2026-11-23b, arm c;
3. continued with the unlikelihood loss on looping targets (CPU, batch 8): assets/study/
   cpu-2026-11-23b, run cpu-gc-ul.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from model.training.heldout import Stage, lineage_curve  # noqa: E402

STUDY = ROOT / "assets" / "study"
STAGES = (  # (label, batch size, log file, its section header, what the run changed)
    ("run 1", 64, STUDY / "gpu-2026-11-23" / "heldout-logs.txt", "== long-r64",
     "LoRA rank 64 on the 28k make-data sequences (H100, batch 64, 9 min)"),
    ("run 2", 64, STUDY / "gpu-2026-11-23b" / "heldout-logs.txt", "## arm c",
     "targets cut where they loop, plus SkipDecode's own on-policy text (H100, batch 64, 11 min)"),
    ("run 3", 8, STUDY / "cpu-2026-11-23b" / "heldout-curves.txt", "== runs/cpu-gc-ul",
     "unlikelihood on the tokens that repeat (2-core CPU, batch 8, 96 min): less teacher-forced "
     "agreement, text without loops"),
)


def section(path: Path, header: str) -> str:
    """The lines after ``header`` up to the next section header ("== " or "## ")."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header)) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(("== ", "## "))), len(lines))
    return "\n".join(lines[start:end])


def main() -> None:
    curve = lineage_curve([Stage(name, batch, section(path, header), note) for name, batch, path, header, note in STAGES])
    target = ROOT / "assets" / "adapters" / "smollm2-135m-skipdecode" / "heldout_curve.json"
    target.write_text(json.dumps(curve, indent=1) + "\n")
    print(f"{target.relative_to(ROOT)}: {len(curve)} rows, {curve[-1]['sequences']:,} sequences")


if __name__ == "__main__":
    main()
