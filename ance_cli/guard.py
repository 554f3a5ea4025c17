"""How the `ance` command fails: a user error (bad data, bad config, a missing file or model) is one red line and
exit status 2, without a traceback (`ance --debug` or ANCE_DEBUG=1 shows it), also in the log records Prefect writes;
a slow embedded Prefect server says what to change; SIGTERM or Ctrl-C ends the command cleanly, within 30 s."""

import contextlib
import errno
import logging
import os
import re
import sys
import threading
import time
from typing import NoReturn

import typer

# Prefect's ephemeral server gets 20 s to start by default; on a loaded 2-core machine that is not enough.
EPHEMERAL_TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
EPHEMERAL_TIMEOUT_DEFAULT = "180"

_FULL = "free space there or write elsewhere"
REFUSED = {errno.ENOSPC: _FULL, errno.EDQUOT: _FULL, errno.EROFS: "write elsewhere",  # what the machine refused,
           errno.EACCES: "check its permissions"}  # as one line: the remedy
DEBUG = "ANCE_DEBUG"  # set (or `ance --debug ...`): user errors show their tracebacks too



STOP_GRACE_SECONDS = 30  # after a stop signal, the most the command takes to end (a second signal: at once)
_stopping: list[threading.Thread] = []
# what the stop line says (`guard`), whether it was printed, and whether the command body has ended
_ending = {"resumes": False, "said": False, "body_ended": False}
_say_once = threading.Lock()
PROJECT_PACKAGES = {"ance_core", "tasks", "flows", "tracking"}  # (not ance_cli: the command's frames stay to the end)


def exit_on_sigterm(signum, frame) -> None:
    """SIGTERM ends the command as an exception, not by the default action: Prefect's own handler (during a flow run)
    marks the run Crashed and passes the signal on to this one, and the interpreter then exits normally, so that its
    exit handlers stop the embedded Prefect server (killed by the default action, the process would leave it running,
    an orphan). Within `STOP_GRACE_SECONDS` (`stop_within`). After the command body has ended (its exit handlers
    stopping the embedded server): the process ends at once (`after_the_body`), not with a traceback from inside
    an exit handler."""
    after_the_body(128 + signum)
    stop_within(128 + signum)
    raise SystemExit(128 + signum)


def after_the_body(code: int) -> None:
    """A stop signal once the command body has ended (`guard`): its work is done or failed and said; what is left is
    the exit handlers (the embedded Prefect server stopping), which an exception raised into them would end with
    "Exception ignored in atexit callback" and a traceback. The children are stopped and the process ends now."""
    if not _ending["body_ended"]:
        return
    typer.secho(f"stopped ({'SIGTERM' if code == 143 else 'Ctrl-C' if code == 130 else f'exit {code}'}) while "
                "exiting, after the command had ended", fg=typer.colors.YELLOW, err=True)
    _stop_now(code)


def interrupt(signum, frame) -> None:
    """Ctrl-C: KeyboardInterrupt, as Python's own handler raises it, within `STOP_GRACE_SECONDS` (`stop_within`);
    a second Ctrl-C ends the process at once."""
    if _stopping:
        _stop_now(128 + signum)
    after_the_body(128 + signum)
    stop_within(128 + signum)
    raise KeyboardInterrupt


def stop_within(code: int) -> None:
    """End the process with `code` within `STOP_GRACE_SECONDS`, its child processes (the embedded Prefect server)
    first, whatever its exit handlers are doing then; sooner when all that is left is Prefect reporting to an
    embedded server that is gone (`_watch`). Ctrl-C at a terminal and a container's stop signal the whole process
    group, so the embedded server stops with the run, and the run's last calls to it (its flow run's crash, its
    events) fail slowly: `ance run` took minutes to exit, printing connection errors and a dump of each event."""
    if _stopping:
        return
    watcher = threading.Thread(target=_watch, args=(code, threading.main_thread().ident), name="ance-stop",
                               daemon=True)  # (daemon threads run while the interpreter's exit handlers do)
    _stopping.append(watcher)
    watcher.start()


def _watch(code: int, main_thread: int | None) -> None:
    """After a stop signal: once the run's own code has unwound (its stage folders, its MLflow runs ended KILLED)
    and the main thread only waits on Prefect's client retrying a server that died with the run, or at the latest
    after `STOP_GRACE_SECONDS`, say so and end the process."""
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if _only_prefect_left(main_thread) and _embedded_server_gone():
            break
    say_stopped(code)
    _stop_now(code)


def _only_prefect_left(thread: int | None) -> bool:
    """The thread waits in Prefect's client (a request it retries), with no frame of the project's code below it."""
    frame = sys._current_frames().get(thread)
    in_client = ours = False
    while frame is not None:
        in_client |= frame.f_code.co_name == "_send_with_retry" and "prefect" in frame.f_code.co_filename
        ours |= str(frame.f_globals.get("__name__", "")).split(".")[0] in PROJECT_PACKAGES
        frame = frame.f_back
    return in_client and not ours


def _embedded_server_gone() -> bool | None:
    """Prefect's API is this process's embedded server (no PREFECT_API_URL) and no child process of it is alive;
    None when the API is another server's."""
    import psutil
    from prefect.settings import get_current_settings

    from ance_cli.orphans import watcher_pids

    if get_current_settings().api.url:
        return None
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and child.pid not in watcher_pids():
                return False
    return True


def say_stopped(code: int) -> None:
    """The one line a stopped command ends with (once, whichever thread gets there first)."""
    with _say_once:
        if _ending["said"]:
            return
        _ending["said"] = True
    what = {130: "interrupted (Ctrl-C)", 143: "stopped (SIGTERM)"}.get(code, f"stopped (exit {code})")
    kept = {True: "the stages finished so far are kept in the work folder, and the same command resumes from them (a "
                  "training from its last checkpoint)",
            STAGES: "the stages finished so far are kept in the work folder, and the same command reuses them"}
    typer.secho(f"{what}: {kept.get(_ending['resumes'], 'nothing was kept')}", fg=typer.colors.YELLOW, err=True)


def stop_within_under_prefects_handler() -> None:
    """During a flow run Prefect's own SIGTERM handler runs first: it reports the run crashed, which against a server
    that stopped with it takes minutes, and only then passes the signal on to `exit_on_sigterm`. Its handler (a
    private function Prefect installs by name: skipped if a release renames it) also starts `stop_within`."""
    try:
        from prefect.utilities import engine
    except ImportError:
        return
    prefects = getattr(engine, "_prefect_sigterm_handler", None)
    if prefects is None or getattr(prefects, "stops_within", False):
        return

    def handler(signum: int, *args: object) -> NoReturn:
        stop_within(128 + signum)
        prefects(signum, *args)

    handler.stops_within = True
    engine._prefect_sigterm_handler = handler


def _stop_now(code: int) -> NoReturn:
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def one_line_user_errors() -> None:
    """Log records of an AnceError (a user error: bad data, bad config, a missing model) or of what the machine refused
    (REFUSED: a full disk, a read-only folder; `guard` ends the command with its one line) keep their message and lose
    their traceback, whoever logs them (Prefect's task and flow run loggers log every failure with its traceback):
    the error is one line. Not with ANCE_DEBUG."""
    from ance_core.errors import AnceError

    make = logging.getLogRecordFactory()

    def record(*args, **kwargs):
        made = make(*args, **kwargs)
        error = made.exc_info[1] if made.exc_info else None
        if error is not None and (isinstance(error, AnceError) or _refused(error)) and not os.environ.get(DEBUG):
            made.exc_info, made.exc_text = None, None
        return made

    logging.setLogRecordFactory(record)


def plain_warnings() -> None:
    """An AnceWarning (an unusual row left out, a setting that hurts) is one yellow line, `warning: <message>`, on
    stderr, without Python's `file:line: AnceWarning:` and the source line that warns, once per command; other
    warnings as Python shows them."""
    import warnings

    from ance_core.errors import AnceWarning

    shown = warnings.showwarning
    said: set[str] = set()  # (a command that reads a file twice, e.g. `search --hybrid`'s data stage and its texts,
    # says what is wrong with it once)

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, AnceWarning):
            if str(message) not in said:
                said.add(str(message))
                typer.secho(f"warning: {message}", fg=typer.colors.YELLOW, err=True)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def fail(message: str) -> NoReturn:
    """One red `error:` line on stderr, then exit status 2 (a user error)."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def refuse_twice(sets, options, flag: str = "--set") -> None:
    """Refuse a setting given both by a command's own option and by `flag` (`--set rounds=1` beside `--rounds 2`:
    the --set won, silently, whichever the user meant). `options`: (option name, its value or None when not given,
    the setting's dotted key)."""
    given = {item.partition("=")[0].strip(): item for item in sets or ()}
    for option, value, key in options:
        if value is not None and key in given:
            fail(f"{option} and {flag} {given[key]} both set {key}: give it once")


def stopped(code: int) -> NoReturn:
    """A stop signal (Ctrl-C, SIGTERM) ended the command body, its flow run marked Crashed and its MLflow runs KILLED
    on the way out: the stop line, then exit `code`; at once when the embedded Prefect server died with the run, as it
    does within a few seconds of a signal to the whole group (the exit handlers left would only try to send Prefect's
    last events to it, for the whole `STOP_GRACE_SECONDS`)."""
    say_stopped(code)
    deadline = time.monotonic() + 3  # (a server signalled with the run may take a moment to end)
    while (gone := _embedded_server_gone()) is False and time.monotonic() < deadline:  # None: another server's
        time.sleep(0.2)
    if gone:
        _stop_now(code)
    raise SystemExit(code)


def _body(fn):
    """The command body; once it has ended, a stop signal ends the process at once (`after_the_body`)."""
    try:
        return fn()
    finally:
        _ending["body_ended"] = True


STAGES = "stages"  # `guard`'s `resumes` for a command that builds cached stages and trains nothing (bm25, evaluate)


def guard(fn, resumes: bool | str = False):
    """Run a command body; AnceError and config errors become one red line and exit code 2; a stop signal one line
    (`stopped`; `resumes`: True, the command trains and a re-run resumes it; STAGES, it builds stages a re-run
    reuses (a stop after the data stage said "nothing was kept"); False, it keeps nothing)."""
    from pydantic import ValidationError

    from ance_core.errors import AnceError
    from ance_core.pipeline.loading import format_validation_error

    _ending["resumes"], _ending["body_ended"] = resumes, False
    if resumes is True and (uri := os.environ.get("MLFLOW_TRACKING_URI")):  # (a command that trains, so tracks:
        from tracking.stores import file_store_problem  # said before a server starts, not by the flow's failure)

        if problem := file_store_problem(uri):
            fail(f"MLFLOW_TRACKING_URI '{uri}' {problem}")
    try:
        return _body(fn)
    except KeyboardInterrupt:
        stopped(130)
    except SystemExit as e:
        if _stopping and isinstance(e.code, int) and e.code > 128:  # `exit_on_sigterm`'s, through the flow run
            stopped(e.code)
        raise
    except AnceError as e:
        if os.environ.get(DEBUG):
            import traceback

            traceback.print_exc()
        fail(str(e))
    except ValidationError as e:
        fail(f"invalid config:\n{format_validation_error(e)}")
    except OSError as e:
        if _refused(e) is None:
            raise
        if os.environ.get(DEBUG):
            import traceback

            traceback.print_exc()
        where = e.filename2 or e.filename  # (a copy's destination: where it was written)
        fail(f"{where or 'a file being written'}: {e.strerror} ({errno.errorcode[e.errno]}); {REFUSED[e.errno]}, and "
             "run the command again")
    except RuntimeError as e:
        if str(e).startswith("Failed to reach API at"):  # (PREFECT_API_URL: nothing answers there, or not a URL)
            cause = f" ({' '.join(str(e.__cause__).split())[:200]})" if e.__cause__ else ""
            fail(f"PREFECT_API_URL {os.environ.get('PREFECT_API_URL') or '(from the Prefect profile)'}: no Prefect "
                 f"server answers there{cause}; start one (`make up`) or unset PREFECT_API_URL to run on a temporary "
                 "server")
        if "ephemeral Prefect API server" not in str(e):
            raise
        typer.secho(f"error: Prefect's temporary API server did not answer within "
                    f"{os.environ.get(EPHEMERAL_TIMEOUT)} s (a busy machine starts it slowly). Set "
                    f"{EPHEMERAL_TIMEOUT} higher, or start a server once (`make up`, or `prefect server start`) and "
                    f"set PREFECT_API_URL=http://127.0.0.1:{os.environ.get('PREFECT_PORT', '4200')}/api. Prefect said: "
                    f"{str(e)[:300]}",
                    fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    except Exception as e:  # (an OS error the Rust of safetensors or tokenizers reports as text: `(os error 28)`)
        if (number := _refused(e)) is None:
            raise
        fail(f"{' '.join(str(e).split())[:300]} ({errno.errorcode[number]}); {REFUSED[number]}, and run the command "
             "again")


def _refused(error: BaseException) -> int | None:
    """The errno of what the machine refused (REFUSED): an OSError's, or one that an exception of another kind says in
    its text (a full disk while safetensors writes: `SafetensorError: ... No space left on device (os error 28)`);
    else None."""
    if isinstance(error, OSError):
        number = error.errno
    else:
        match = re.search(r"\(os error (\d+)\)", str(error))
        number = int(match.group(1)) if match else None
    return number if number in REFUSED else None
