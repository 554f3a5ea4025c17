"""The `ance` command: demo, run, recipes, tune, compare, compress (ance_cli/train_commands.py) and bm25, evaluate,
search, export, gc (ance_cli/use_commands.py), on the app of ance_cli/app.py.

Commands that compute metrics accept --json and then print them as one JSON object on their last line.
User errors (bad data, bad config, missing files) print one line and exit with status 2, without a traceback.
"""

import glob
import os
import sys

from ance_cli import train_commands, use_commands  # noqa: F401  (their commands join the app)
from ance_cli.app import app
from ance_cli.guard import EPHEMERAL_TIMEOUT, EPHEMERAL_TIMEOUT_DEFAULT, one_line_user_errors, plain_warnings
from ance_cli.orphans import servers_die_with_the_command


def main() -> None:  # pragma: no cover
    # (the console script, ance_cli/entry.py, has chosen the malloc before this module was imported)
    # The tokenizer's Rust threads: off on a CPU (they would compete with torch's for the cores, and warn at every
    # fork), on beside a GPU, where tokenizing on one thread starves the device (6x slower on 16 cores: BENCHMARKS.md).
    # An NVIDIA GPU is seen by its device files: importing torch to ask would add 1.5 s to every command's start.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true" if glob.glob("/dev/nvidia[0-9]*") else "false")
    # Prefect's ephemeral server sends a telemetry heartbeat that can hit a locked SQLite file and print a traceback.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault(EPHEMERAL_TIMEOUT, EPHEMERAL_TIMEOUT_DEFAULT)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    servers_die_with_the_command()  # (the embedded Prefect server, even when this process is killed outright)
    one_line_user_errors()
    plain_warnings()
    sys.exit(app())
