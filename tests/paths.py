"""Where the tests find the paper's math data: ``$SPPO_RL_MATH_DATA``, else ``../shared/data/math`` beside
the repository. ``FIXTURES`` holds 24 evenly spaced rows of each of the six files, shipped with the
tests, so the loader and verifier checks run everywhere; the full files are checked where present."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "math"
MATH_DATA = Path(os.environ.get("SPPO_RL_MATH_DATA", REPO.parent / "shared" / "data" / "math"))
