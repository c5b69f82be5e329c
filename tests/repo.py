"""Where the repository's folders are, for every test (``tests/`` is on the tests' import path)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / 'configs'
