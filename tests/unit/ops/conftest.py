"""The ops tests reuse the topk_kl test helpers (brute force, case builders, tolerances)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "losses"))
