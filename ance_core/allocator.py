"""The process's malloc: mimalloc on Linux, preloaded by the `ance` command, in place of glibc's.

glibc's malloc hands the large, short-lived buffers of a transformer's forward and backward (activations, attention
scores, gradients) back to the kernel when they are freed and takes them again at the next batch: every batch then
page-faults its memory in anew (~150,000 minor faults per MiniLM forward of 64 x 256 tokens, a third of a second of
kernel time). mimalloc keeps them. Measured on a 2-core CPU (BENCHMARKS.md, `bench/allocator.py`): the same model
and batches, same results, fewer faults and less time per training step and per encoding batch.

A malloc can only be chosen before the process starts (LD_PRELOAD), so the `ance` command starts itself again under
it (`preload_and_reexec`: one exec, the same process id); its child processes (the temporary Prefect server,
torch.distributed ranks, Ray workers) inherit the setting. Processes that do not start through `ance` (a Prefect
worker's flow runs, a Python session) get it from the environment: `python -m ance_core.allocator` prints the
library's path (the docker images link it), `--ld-preload` the LD_PRELOAD the command would run with (scripts/stack.sh
starts its workers with it). The library is the `cmeel-mimalloc` wheel, a dependency on Linux.

ANCE_ALLOCATOR=system keeps glibc's malloc (a mimalloc in LD_PRELOAD, as the worker images set it, is taken out, the
command started again without it); an LD_PRELOAD that already names a malloc (jemalloc, tcmalloc, mimalloc) is
otherwise left as it is, and other preloads keep their place before mimalloc. Stdlib only: the `ance` console script
(ance_cli/entry.py) calls it before anything heavy is imported.
"""

import os
import sys

CHOICE = "ANCE_ALLOCATOR"  # mimalloc (the default where the library is installed) | system
CHOICES = ("mimalloc", "system")
_STARTED = "ANCE_ALLOCATOR_STARTED"  # set in the environment of the started-again process: never a second exec
_MALLOCS = ("mimalloc", "jemalloc", "tcmalloc")


def mimalloc_library() -> str | None:
    """libmimalloc's path from the cmeel-mimalloc wheel, or None (not Linux, not installed)."""
    if not sys.platform.startswith("linux"):
        return None
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = str(distribution("cmeel-mimalloc").locate_file("cmeel.prefix/lib/libmimalloc.so"))
    except PackageNotFoundError:
        return None
    return path if os.path.isfile(path) else None


def choice(env: os._Environ | dict) -> str:
    """ANCE_ALLOCATOR's value; ValueError naming the variable when it is neither choice."""
    value = env.get(CHOICE, "mimalloc").strip().lower() or "mimalloc"
    if value not in CHOICES:
        raise ValueError(f"{CHOICE}={env.get(CHOICE)!r}: expected one of {', '.join(CHOICES)}")
    return value


def preload_env(env: os._Environ | dict, library: str | None) -> dict | None:
    """The environment to start the command again in, or None to run as it is. Under mimalloc (the default):
    LD_PRELOAD with `library` added last (a preload already there, a sanitizer's runtime say, keeps its place), unless
    it names a malloc already. Under ANCE_ALLOCATOR=system: LD_PRELOAD without mimalloc when it names it (a worker
    image's, an `ance` parent's), so that glibc's malloc is used. Never twice: the started-again process runs as is."""
    if env.get(_STARTED):
        return None
    parts = env.get("LD_PRELOAD", "").replace(" ", ":").split(":")
    parts = [part for part in parts if part]
    if choice(env) == "system":
        kept = [part for part in parts if "libmimalloc" not in os.path.basename(part)]
        return None if kept == parts else dict(env) | {"LD_PRELOAD": ":".join(kept), _STARTED: "1"}
    if library is None or any(name in part for part in parts for name in _MALLOCS):
        return None
    return dict(env) | {"LD_PRELOAD": ":".join([*parts, library]), _STARTED: "1"}


def _planned_env() -> dict | None:
    """`preload_env` for this process; a bad ANCE_ALLOCATOR prints one line and exits with status 2."""
    try:
        return preload_env(os.environ, mimalloc_library())
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def preload_and_reexec() -> None:
    """Start this command again under mimalloc (see the module's doc); return when it stays as it is. A bad
    ANCE_ALLOCATOR prints one line and exits with status 2."""
    env = _planned_env()
    if env is None or hasattr(sys, "ps1") or sys.flags.interactive or sys.orig_argv[1:2] == ["-"]:
        return  # (an interactive session, or a script read from stdin, cannot be started again)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError:  # (an executable that cannot be started again: run on glibc's malloc)
        return


def in_use() -> str:
    """The malloc this process runs on: mimalloc, jemalloc or tcmalloc when one is loaded, else system."""
    try:
        with open("/proc/self/maps") as maps:
            loaded = maps.read()
    except OSError:
        return "system"
    return next((name for name in _MALLOCS if f"lib{name}" in loaded), "system")


if __name__ == "__main__":
    # python -m ance_core.allocator: the library's path (empty: none here); with --ld-preload, the LD_PRELOAD that a
    # process started from this environment should get: the `ance` command's rule (scripts/stack.sh's workers)
    if sys.argv[1:] == ["--ld-preload"]:
        print((_planned_env() or os.environ).get("LD_PRELOAD", ""))
    else:
        print(mimalloc_library() or "")
