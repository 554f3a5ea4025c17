"""How the `ance` command fails: a user error (bad data, bad config, a missing file or model) is one red line and
exit status 2, without a traceback (`ance --debug` or ANCE_DEBUG=1 shows it), also in the log records Prefect writes;
a slow embedded Prefect server says what to change; SIGTERM ends the command cleanly."""

import logging
import os
from typing import NoReturn

import typer

# Prefect's ephemeral server gets 20 s to start by default; on a loaded 2-core machine that is not enough.
EPHEMERAL_TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
EPHEMERAL_TIMEOUT_DEFAULT = "180"

DEBUG = "ANCE_DEBUG"  # set (or `ance --debug ...`): user errors show their tracebacks too



def exit_on_sigterm(signum, frame) -> None:
    """SIGTERM ends the command as an exception, not by the default action: Prefect's own handler (during a flow run)
    marks the run Crashed and passes the signal on to this one, and the interpreter then exits normally, so that its
    exit handlers stop the embedded Prefect server (killed by the default action, the process would leave it running,
    an orphan)."""
    raise SystemExit(128 + signum)


def one_line_user_errors() -> None:
    """Log records of an AnceError (a user error: bad data, bad config, a missing model) keep their message and lose
    their traceback, whoever logs them (Prefect's task and flow run loggers log every failure with its traceback):
    the error is one line. Not with ANCE_DEBUG."""
    from ance_core.errors import AnceError

    make = logging.getLogRecordFactory()

    def record(*args, **kwargs):
        made = make(*args, **kwargs)
        if made.exc_info and isinstance(made.exc_info[1], AnceError) and not os.environ.get(DEBUG):
            made.exc_info, made.exc_text = None, None
        return made

    logging.setLogRecordFactory(record)


def plain_warnings() -> None:
    """An AnceWarning (an unusual row left out, a setting that hurts) is one yellow line, `warning: <message>`, on
    stderr, without Python's `file:line: AnceWarning:` and the source line that warns; other warnings as Python shows
    them."""
    import warnings

    from ance_core.errors import AnceWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, AnceWarning):
            typer.secho(f"warning: {message}", fg=typer.colors.YELLOW, err=True)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def fail(message: str) -> NoReturn:
    """One red `error:` line on stderr, then exit status 2 (a user error)."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def guard(fn):
    """Run a command body; AnceError and config errors become one red line and exit code 2."""
    from pydantic import ValidationError

    from ance_core.errors import AnceError
    from ance_core.pipeline.config import format_validation_error

    try:
        return fn()
    except AnceError as e:
        if os.environ.get(DEBUG):
            import traceback

            traceback.print_exc()
        fail(str(e))
    except ValidationError as e:
        fail(f"invalid config:\n{format_validation_error(e)}")
    except RuntimeError as e:
        if "ephemeral Prefect API server" not in str(e):
            raise
        typer.secho(f"error: Prefect's temporary API server did not answer within "
                    f"{os.environ.get(EPHEMERAL_TIMEOUT)} s (a busy machine starts it slowly). Set "
                    f"{EPHEMERAL_TIMEOUT} higher, or start a server once (`make up`, or `prefect server start`) and "
                    f"set PREFECT_API_URL=http://127.0.0.1:4200/api. Prefect said: {str(e)[:300]}",
                    fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
