"""Paths shared by the docs tests; puts tools/docs (generators, block runner) on sys.path."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TOOLS = ROOT / "tools" / "docs"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))
