"""A command's ending on a terminal: the flow's log has shown its tables and closing lines there, so the command adds
only what is new; redirected, stdout gets the whole summary (tables included) for files and pipes."""

import os
import pty
import subprocess
import sys

import pytest

from ance_cli import app as cli

ASK = "from prefect import flow; import ance_cli.app as a; print('SHOWN', a.shown_by_the_log())"


def _answer(stdout_on_terminal: bool, env: dict | None = None) -> bool:
    """shown_by_the_log() in a fresh process whose stderr is a pseudo-terminal, stdout the same one or a pipe."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-c", ASK], stdin=subprocess.DEVNULL, stderr=follower,
                                stdout=follower if stdout_on_terminal else subprocess.PIPE, env=env)
        piped = proc.communicate(timeout=120)[0] or b""
    finally:
        os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal's other end closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    line = next(ln for ln in (piped + seen).decode().splitlines() if ln.startswith("SHOWN"))
    return line.split()[1] == "True"


def test_the_log_has_shown_the_ending_only_on_the_terminal_it_writes_to():
    assert _answer(True)
    assert not _answer(False)  # `ance run > results.md`: the tables go to the file
    assert not _answer(True, os.environ | {"PREFECT_LOGGING_LEVEL": "WARNING"})  # the log shows no INFO lines
    assert not _answer(True, os.environ | {"PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING"})  # nor there


def test_the_log_has_shown_the_ending_in_a_file_both_streams_go_to(tmp_path):
    """`ance run > log 2>&1`: the log's lines and stdout go to one file, where the tables were written twice."""
    def shown(stdout, stderr) -> bool:
        subprocess.run([sys.executable, "-c", ASK], stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                       timeout=120, check=True)
        return "SHOWN True" in (tmp_path / "out.log").read_text()

    with open(tmp_path / "out.log", "w") as both:
        assert shown(both, both)
    with open(tmp_path / "out.log", "w") as out, open(tmp_path / "err.log", "w") as err:
        assert not shown(out, err)  # `ance run > results.md 2> log`: the tables go to the file


RESULT = {"markdown": "| model | nDCG@10 |\n|---|---|\n| BM25 | 0.5 |", "final_checkpoint": "/w/train/k",
          "report_dir": "/w/reports/d", "plots_dir": "/w/plots/d", "selected": "BM25", "warnings": [],
          "tracking": {"tracking_uri": "sqlite:////w/mlflow.db", "run_id": "abc", "run_url": None, "delivered_late": 0,
                       "undelivered_calls": 0},
          "compression": {"table": "| method | dim |", "files": "/w/compression/c"}}


@pytest.mark.parametrize("shown", [True, False])
def test_a_pipelines_ending_repeats_the_tables_only_where_the_log_did_not_show_them(shown, monkeypatch, capsys):
    monkeypatch.setattr(cli, "shown_by_the_log", lambda: shown)
    cli.print_pipeline(RESULT, as_json=False)
    out = capsys.readouterr().out
    assert ("| BM25 | 0.5 |" in out) is not shown and ("| method | dim |" in out) is not shown
    assert ("MLflow:" in out) is not shown  # the closing lines, which the flow printed too
    # what the flow did not print is always there
    assert "result checkpoint: /w/train/k" in out and "compression table and files: /w/compression/c" in out
