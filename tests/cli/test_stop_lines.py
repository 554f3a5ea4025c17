"""The line a stopped command ends with says what it kept (a probe: Ctrl-C after `ance bm25`'s data stage said
"nothing was kept", and the data stage was kept and reused by the next run)."""

import pytest


@pytest.mark.parametrize("resumes, said", [
    (True, "interrupted (Ctrl-C): the stages finished so far are kept in the work folder, and the same command "
           "resumes from them (a training from its last checkpoint)"),
    ("stages", "interrupted (Ctrl-C): the stages finished so far are kept in the work folder, and the same command "
               "reuses them"),
    (False, "interrupted (Ctrl-C): nothing was kept"),
])
def test_the_stop_line_says_what_the_command_kept(resumes, said, capsys, monkeypatch):
    from ance_cli import guard

    monkeypatch.setitem(guard._ending, "said", False)
    monkeypatch.setitem(guard._ending, "resumes", resumes)
    guard.say_stopped(130)
    assert capsys.readouterr().err.strip() == said

