"""The `ance` command's malloc (ance_core/allocator.py): when it starts itself again under mimalloc, and that the
started-again process really runs on it."""

import os
import subprocess
import sys

import pytest

from ance_core import allocator

LIB = "/x/libmimalloc.so"


def test_the_environment_to_start_again_in():
    env = allocator.preload_env({"PATH": "/bin"}, LIB)
    assert env["LD_PRELOAD"] == LIB and env["PATH"] == "/bin" and env[allocator._STARTED] == "1"
    # another preloaded library keeps its place, before mimalloc (a sanitizer's runtime must come first)
    assert allocator.preload_env({"LD_PRELOAD": "/y/libasan.so.8"}, LIB)["LD_PRELOAD"] == f"/y/libasan.so.8:{LIB}"
    assert allocator.preload_env({"LD_PRELOAD": "/y/a.so /y/b.so"}, LIB)["LD_PRELOAD"] == f"/y/a.so:/y/b.so:{LIB}"


def test_system_takes_a_preloaded_mimalloc_out():
    """ANCE_ALLOCATOR=system in a worker image (ENV LD_PRELOAD names mimalloc) or under an `ance` parent: it was
    ignored, and the command ran on mimalloc."""
    env = allocator.preload_env({"ANCE_ALLOCATOR": "system", "LD_PRELOAD": f"/y/libz.so:{LIB}"}, LIB)
    assert env["LD_PRELOAD"] == "/y/libz.so" and env[allocator._STARTED] == "1"
    env = allocator.preload_env({"ANCE_ALLOCATOR": "system", "LD_PRELOAD": "/usr/local/lib/libmimalloc.so"}, None)
    assert env["LD_PRELOAD"] == ""


@pytest.mark.parametrize("env", [
    {"ANCE_ALLOCATOR": "system"},  # the user's choice
    {"ANCE_ALLOCATOR": " System "},
    {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"},  # a malloc the user preloads already
    {"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"},
    {allocator._STARTED: "1"},  # started again already (or a child of such a process): never twice
])
def test_no_second_start_where_it_would_change_nothing_or_override_the_user(env):
    assert allocator.preload_env(env, LIB) is None


def test_no_library_no_start():
    assert allocator.preload_env({}, None) is None


def test_a_bad_choice_is_one_line_naming_the_variable():
    with pytest.raises(ValueError, match=r"ANCE_ALLOCATOR='jemaloc': expected one of mimalloc, system"):
        allocator.preload_env({"ANCE_ALLOCATOR": "jemaloc"}, LIB)
    proc = subprocess.run([sys.executable, "-m", "ance_cli", "--help"], capture_output=True, text=True,
                          env=os.environ | {"ANCE_ALLOCATOR": "jemaloc"}, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: ANCE_ALLOCATOR='jemaloc': expected one of mimalloc, system"]


SHOW = "from ance_core.allocator import in_use, preload_and_reexec; preload_and_reexec(); print(in_use(), flush=True)"


@pytest.mark.skipif(allocator.mimalloc_library() is None, reason="no cmeel-mimalloc wheel here (not Linux)")
@pytest.mark.parametrize(("extra", "expected"), [
    ({}, "mimalloc"), ({"ANCE_ALLOCATOR": "system"}, "system"),
    ({"ANCE_ALLOCATOR": "system", "LD_PRELOAD": allocator.mimalloc_library() or ""}, "system"),
    ({"ANCE_ALLOCATOR": "mimalloc", "LD_PRELOAD": allocator.mimalloc_library() or ""}, "mimalloc"),
])
def test_the_started_again_process_runs_on_the_chosen_malloc(extra, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator._STARTED, "ANCE_ALLOCATOR")}
    proc = subprocess.run([sys.executable, "-c", SHOW], capture_output=True, text=True, env=env | extra, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [expected]  # printed once: by the started-again process alone


@pytest.mark.skipif(allocator.mimalloc_library() is None, reason="no cmeel-mimalloc wheel here (not Linux)")
def test_the_ld_preload_a_worker_is_started_with():
    """scripts/stack.sh starts its workers with `python -m ance_core.allocator --ld-preload`."""
    library, clean = allocator.mimalloc_library(), {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

    def planned(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ance_core.allocator", "--ld-preload"], capture_output=True,
                              text=True, env=clean | extra, timeout=120)

    assert planned().stdout.strip() == library
    assert planned(LD_PRELOAD="/y/libz.so").stdout.strip() == f"/y/libz.so:{library}"
    assert planned(ANCE_ALLOCATOR="system", LD_PRELOAD=library).stdout.strip() == ""
    bad = planned(ANCE_ALLOCATOR="tcmalloc")
    assert bad.returncode == 2 and bad.stdout == "" and "ANCE_ALLOCATOR='tcmalloc'" in bad.stderr
