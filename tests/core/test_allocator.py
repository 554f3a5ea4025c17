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
    # another preloaded library is kept, after mimalloc
    assert allocator.preload_env({"LD_PRELOAD": "/y/libfoo.so"}, LIB)["LD_PRELOAD"] == f"{LIB}:/y/libfoo.so"


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
@pytest.mark.parametrize(("extra", "expected"), [({}, "mimalloc"), ({"ANCE_ALLOCATOR": "system"}, "system")])
def test_the_started_again_process_runs_on_mimalloc(extra, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator._STARTED, "ANCE_ALLOCATOR")}
    proc = subprocess.run([sys.executable, "-c", SHOW], capture_output=True, text=True, env=env | extra, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [expected]  # printed once: by the started-again process alone


def test_this_process_names_its_malloc():
    assert allocator.in_use() in ("mimalloc", "jemalloc", "tcmalloc", "system")
