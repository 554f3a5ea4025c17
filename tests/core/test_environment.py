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


def test_bm25s_is_imported_without_jax_and_jax_still_imports_after(tmp_path):
    """bm25s imports JAX where it is installed and starts it; JAX's threads make the training loader's forks unsafe
    (JAX warned of a deadlock on the GPU machine). ance_core imports bm25s with JAX kept out, and a later
    `import jax` works. A stand-in `jax` package on the path shows both (JAX is not installed here)."""
    fake = tmp_path / "jax"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "lax.py").write_text("def top_k(values, k):\n    return sorted(values)[-k:]\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}

    def run(script: str) -> str:
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    # the stand-in is what bm25s finds when imported plainly
    assert run("import sys, bm25s; print('jax' in sys.modules, bm25s.selection.JAX_IS_AVAILABLE)") == "True True"
    assert run("import sys; from ance_core.retrieval.bm25 import bm25s; "
               "print('jax' in sys.modules, bm25s.selection.JAX_IS_AVAILABLE); import jax.lax; "
               "print('jax' in sys.modules)") == "False False\nTrue"
