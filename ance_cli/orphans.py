"""The embedded Prefect server ends with the command that started it, even when that command is killed outright.

Without PREFECT_API_URL, Prefect runs its API as a uvicorn child process of the command (its "temporary server") and
stops it from an exit handler. SIGTERM and Ctrl-C run that handler (ance_cli/guard.py), and a signal to the whole
process group reaches the server itself; SIGKILL to the command alone (the kernel's OOM killer, `kill -9 <pid>`)
runs nothing, and the server was left serving, an orphan holding its memory and port for good. So each server the
command starts gets a watcher: a small child process that stops the server once the command is gone (SIGTERM, then
SIGKILL after `GRACE_SECONDS`) and ends by itself once the server has stopped. Linux only (it reads /proc); its
signals go through a pidfd where the kernel has them (5.3+), so a pid the server freed and another process took
is never signalled.
"""

import importlib.abc
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

NAME = "ance-server-watcher"  # its first argument: what `ps` shows of it
POLL_SECONDS = 1.0
GRACE_SECONDS = 10

# (run by `python -S -c`: nothing imported beyond what the interpreter has; stop signals are the command's to handle)
WATCHER = """
import os, signal, sys, time
command, server, poll, grace = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)

def born(pid):  # the process's start time: a pid reused by another process is not it
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else fields[19]

server_born = born(server)
try:  # a handle on the process itself (Linux 5.3+): a signal through it never reaches a process that reused the pid
    handle = os.pidfd_open(server)
except (AttributeError, OSError):
    handle = None
while server_born is not None and born(server) == server_born:
    if os.getppid() != command:  # the command is gone: this watcher was handed to another parent
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
            try:
                if handle is None:
                    os.kill(server, sig)
                else:
                    signal.pidfd_send_signal(handle, sig)
            except OSError:
                sys.exit()
            end = time.monotonic() + wait
            while born(server) == server_born and time.monotonic() < end:
                time.sleep(0.1)
            if born(server) != server_born:
                sys.exit()
        sys.exit()
    time.sleep(poll)
"""

_watchers: dict[int, subprocess.Popen] = {}  # server pid -> its watcher (kept: reaped when it ends)


def watch(server_pid: int) -> None:
    """Start the watcher of the server process `server_pid` (once per server)."""
    if server_pid in _watchers or not os.path.isdir(f"/proc/{server_pid}"):
        return
    _watchers[server_pid] = subprocess.Popen(  # (no environment: it is no process of the run's Prefect home)
        [sys.executable, "-S", "-c", WATCHER, NAME, str(os.getpid()), str(server_pid), str(POLL_SECONDS),
         str(GRACE_SECONDS)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=True, env={})


def watcher_pids() -> set[int]:
    """This process's watchers (child processes that are not the run's: ance_cli/guard.py waits on the server only)."""
    return {w.pid for w in _watchers.values()}


def servers_die_with_the_command() -> None:
    """Every temporary Prefect server this process starts gets its watcher (`watch`), started with the server. The
    server's module (FastAPI, the database layer: 3 s) is patched when Prefect first imports it, not imported here."""
    if not os.path.isdir("/proc/self") or any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        return
    if SERVER_MODULE in sys.modules:
        _patch(sys.modules[SERVER_MODULE])
    else:
        sys.meta_path.insert(0, _PatchOnImport())


SERVER_MODULE = "prefect.server.api.server"


def _patch(module) -> None:
    """The server class's process start (each start: another port's after a port in use), watched from its birth."""
    run = module.SubprocessASGIServer._run_uvicorn_command

    def run_watched(self, *args, **kwargs):
        writable_prefect_home()
        process = run(self, *args, **kwargs)
        watch(process.pid)
        return process

    module.SubprocessASGIServer._run_uvicorn_command = run_watched


def writable_prefect_home() -> None:
    """Refuse to start a temporary Prefect server whose database folder (PREFECT_HOME) cannot be written: the server
    failed on every request, printing thousands of lines of tracebacks, until the start-up timeout (3 minutes) ended
    the command with the advice for a busy machine."""
    import tempfile

    from prefect.settings import get_current_settings

    from ance_core.errors import AnceError

    if any(os.environ.get(f"PREFECT_{part}_DATABASE_CONNECTION_URL") for part in ("API", "SERVER")):
        return  # (its database is elsewhere)
    home = Path(get_current_settings().home).expanduser()
    try:
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=home):
            pass
    except OSError as e:
        raise AnceError(f"PREFECT_HOME {home}: Prefect's temporary server keeps its database there, and it cannot be "
                        f"written ({e.strerror}); set PREFECT_HOME to a folder you can write, or PREFECT_API_URL to a "
                        "running server") from None


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when the server's module is imported, the spec of the finders after it, its loader's
    module patched once loaded."""

    def find_spec(self, name, path, target=None):
        if name != SERVER_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_and_patch(module):
                load(module)
                _patch(module)

            spec.loader.exec_module = exec_and_patch
        return spec
