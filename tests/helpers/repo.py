"""Where the repository's folders are, for every test."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / 'configs'
