"""The Prefect settings a command runs under, when they cannot work: one line, before any work (a probe found an
unwritable PREFECT_HOME hanging for 3 minutes with thousands of lines of tracebacks, then blaming a busy machine, and
an unreachable PREFECT_API_URL a traceback)."""

import os
import subprocess
import sys

import pytest


def _bm25(tiny_scifact, tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ance_cli", "bm25", "--dataset", str(tiny_scifact), "--split", "test",
                           "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | env)


def test_a_prefect_home_that_cannot_be_written_is_one_line(tiny_scifact, tmp_path):
    (tmp_path / "a-file").write_text("")
    home = tmp_path / "a-file" / "prefect"  # (a folder under a file: refused to root too)
    proc = _bm25(tiny_scifact, tmp_path, PREFECT_HOME=str(home))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: PREFECT_HOME {home}: Prefect's temporary server keeps its database there, and it cannot be " \
           "written (Not a directory)" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").glob("bm25*"))


@pytest.mark.parametrize("url, cause", [("http://127.0.0.1:9/api", "Connection refused"), ("not-a-url", "protocol")])
def test_a_prefect_api_url_nothing_answers_is_one_line(tiny_scifact, tmp_path, url, cause):
    proc = _bm25(tiny_scifact, tmp_path, PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=url)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: PREFECT_API_URL {url}: no Prefect server answers there (") and cause in last, last
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_a_full_disk_that_a_library_reports_as_text_is_one_line(capsys):
    """A probe: a full disk while safetensors wrote a checkpoint was `SafetensorError: ... No space left on device (os
    error 28)` with three tracebacks, not the one line an OSError of ENOSPC gets."""
    import typer
    from safetensors import SafetensorError

    from ance_cli.guard import guard

    def body():
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: \"No space "
                              "left on device\" }) (os error 28)")

    with pytest.raises(typer.Exit) as ended:
        guard(body)
    assert ended.value.exit_code == 2
    said = capsys.readouterr().err
    assert said.startswith("error: Error while serializing") and "(ENOSPC); free space there or write elsewhere, and " \
        "run the command again" in said, said

    def other():
        raise SafetensorError("header too large")  # (not what the machine refused: raised as it is)

    with pytest.raises(SafetensorError):
        guard(other)
