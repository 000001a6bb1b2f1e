"""Puts tests/ on sys.path so that the test modules (CPU and CUDA) import the shared helpers as
`from reference import ...`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
