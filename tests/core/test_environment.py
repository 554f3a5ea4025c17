"""What importing ance_core sets in the process's environment, before any library reads it."""

import os
import subprocess
import sys


def _imported_env(**env: str) -> dict:
    script = ("import os, ance_core; "
              "print(os.environ.get('JAX_PLATFORMS'), os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))")
    clean = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    out = subprocess.run([sys.executable, "-c", script], env={**clean, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    return {"JAX_PLATFORMS": out[0], "XLA_PYTHON_CLIENT_PREALLOCATE": out[1]}


def test_jax_is_kept_off_the_gpu_unless_the_user_says_otherwise():
    """JAX (which bm25s imports where installed) would take 75% of a GPU's memory when it starts a backend: torch's
    encoding then ran out of memory on an H200. Importing ance_core keeps JAX on the CPU, without preallocation;
    a user's own setting wins."""
    assert _imported_env() == {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert _imported_env(JAX_PLATFORMS="cuda")["JAX_PLATFORMS"] == "cuda"
