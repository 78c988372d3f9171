import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # helpers.py, wherever the suite is installed
