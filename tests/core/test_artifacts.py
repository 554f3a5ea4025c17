import json
import os

import pytest

from ance_core.artifacts import atomic_folder, is_complete, read_manifest, run_stage


def test_complete_stage_is_reused_without_rebuilding(tmp_path):
    calls = []

    def build(out):
        calls.append(out)
        (out / "x.txt").write_text("1")
        return {"rows": 1}

    first = run_stage(tmp_path, "s", {"a": 1}, {"in": "d1"}, build)
    again = run_stage(tmp_path, "s", {"a": 1}, {"in": "d1"}, build)
    assert first.path == again.path and len(calls) == 1 and again.cached and not first.cached
    assert read_manifest(first.path)["summary"] == {"rows": 1}
    other = run_stage(tmp_path, "s", {"a": 2}, {"in": "d1"}, build)  # a config change is another folder
    assert other.digest != first.digest and len(calls) == 2
    assert run_stage(tmp_path, "s", {"a": 1}, {"in": "d2"}, build).digest != first.digest  # so is an input


def test_failed_build_leaves_nothing_visible(tmp_path):
    def broken(out):
        (out / "half.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        run_stage(tmp_path, "s", {}, {}, broken)
    assert not any((tmp_path / "s").iterdir())  # no final folder, no partial folder


def test_resumable_build_keeps_its_partial_folder_for_the_next_attempt(tmp_path):
    attempts = []

    def flaky(out):
        attempts.append(sorted(p.name for p in out.iterdir()))
        (out / f"checkpoint-{len(attempts)}").mkdir()
        if len(attempts) == 1:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        run_stage(tmp_path, "train", {}, {}, flaky, resumable=True)
    ref = run_stage(tmp_path, "train", {}, {}, flaky, resumable=True)
    assert attempts == [[], ["checkpoint-1"]]  # the second attempt saw the first one's checkpoint
    assert is_complete(ref.path) and json.loads((tmp_path / "train" / ref.digest / "manifest.json").read_text())
    assert not list((tmp_path / "train").glob(".partial-*"))


def test_atomic_folder_appears_whole_on_success_and_replaces_an_older_one(tmp_path):
    final = tmp_path / "results" / "abc"
    with atomic_folder(final) as tmp:
        assert tmp.parent == final.parent and tmp.name.startswith(".partial-abc-") and not any(tmp.iterdir())
        (tmp / "a.txt").write_text("1")
        assert not final.exists()  # nothing visible until the block ends
        (tmp / "b.txt").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["a.txt", "b.txt"]
    with atomic_folder(final) as tmp:  # again: the new folder replaces the old one whole
        (tmp / "c.txt").write_text("3")
        assert (final / "a.txt").read_text() == "1"  # the old one stays readable meanwhile
    assert sorted(p.name for p in final.iterdir()) == ["c.txt"]
    assert sorted(p.name for p in final.parent.iterdir()) == ["abc"]  # no temporary or set-aside folder left


def test_atomic_folder_leaves_nothing_new_when_the_block_fails(tmp_path):
    final = tmp_path / "abc"
    with pytest.raises(RuntimeError), atomic_folder(final) as tmp:
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("disk full")
    assert not any(tmp_path.iterdir())  # no final folder, no partial folder
    final.mkdir()
    (final / "old.txt").write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic_folder(final) as tmp:
        (tmp / "new.txt").write_text("new")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["abc"] and [p.name for p in final.iterdir()] == ["old.txt"]


def test_shards_are_ordered_by_number_and_ids_split_on_newlines_alone(tmp_path):
    from ance_core.artifacts import EMBEDDINGS, id_lines, shard_paths

    for k in (100000, 9, 10001, 99999):
        (tmp_path / EMBEDDINGS.format(k)).write_bytes(b"")
    assert [p.name for p in shard_paths(tmp_path)] == ["emb_00009.npy", "emb_10001.npy", "emb_99999.npy",
                                                       "emb_100000.npy"]
    (tmp_path / "ids").write_text("a\nb\x1cc\nd\u2028e\n\n", encoding="utf-8")
    assert id_lines(tmp_path / "ids") == ["a", "b\x1cc", "d\u2028e", ""]
    (tmp_path / "none").write_text("")
    assert id_lines(tmp_path / "none") == []


def test_a_replaced_file_gets_the_mode_a_new_file_would_get(tmp_path):
    """Written through mkstemp (mode 0600), TREC runs and logs were readable by their owner alone."""
    import os

    from ance_core.artifacts import write_text

    old = os.umask(0o022)
    try:
        write_text(tmp_path / "run.trec", "q Q0 d 1 1.0 t\n")
        os.umask(0o027)
        write_text(tmp_path / "log.jsonl", "{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "run.trec").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "log.jsonl").stat().st_mode & 0o777 == 0o640


def test_atomic_folder_onto_a_link_replaces_the_folder_it_names_and_keeps_the_link(tmp_path):
    """`ance export --out models/current --force`, current -> v3: the rename onto the link failed (NotADirectoryError,
    a traceback)."""
    (tmp_path / "v3").mkdir()
    (tmp_path / "v3" / "old.txt").write_text("old")
    (tmp_path / "current").symlink_to("v3")
    with atomic_folder(tmp_path / "current") as tmp:
        (tmp / "new.txt").write_text("new")
    assert (tmp_path / "current").is_symlink() and os.readlink(tmp_path / "current") == "v3"
    assert sorted(p.name for p in (tmp_path / "v3").iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "v3"]  # (no .partial- or .old- folder left)


def test_only_a_damaged_file_is_said_to_be_a_damaged_stage(tmp_path):
    """A stage file missing or cut short is one line naming its folder; no permission or no memory is no damage, and
    is not said to be (its advice, to remove the folder, would delete good data; a review)."""
    import pytest

    from ance_core.errors import AnceError, damaged_stage

    for error in (FileNotFoundError("corpus.parquet"), ValueError("Parquet file size is 5 bytes")):
        with pytest.raises(AnceError, match=f"{tmp_path}: a damaged stage folder .*remove it and run again"):
            with damaged_stage(tmp_path):
                raise error
    for error in (PermissionError(13, "Permission denied"), OSError(12, "Cannot allocate memory")):
        with pytest.raises(type(error)), damaged_stage(tmp_path):
            raise error


def test_a_work_folder_made_by_a_refused_command_goes_unless_another_builds_in_it(tmp_path):
    """A refused command removes the work folder it made (its locks, empty stage folders), but not while another
    command started beside it holds a stage lock there: that one's build would lose its folder."""
    from filelock import FileLock

    from ance_core.work_folder import made_work_dir

    with pytest.raises(ValueError), made_work_dir(tmp_path / "alone") as folder:
        (folder / ".locks").mkdir()
        (folder / ".locks" / "data-abc.lock").touch()
        raise ValueError("refused")
    assert not (tmp_path / "alone").exists()
    building = FileLock(tmp_path / "busy" / ".locks" / "data-abc.lock")  # (another command's, building there)
    with pytest.raises(ValueError), made_work_dir(tmp_path / "busy") as folder:
        (folder / ".locks").mkdir()
        building.acquire()
        raise ValueError("refused")
    assert (tmp_path / "busy" / ".locks").is_dir()
    building.release()


def test_weights_in_a_stage_or_an_export_are_readable_as_its_other_files(tmp_path):
    """A probe: safetensors' save_file (and transformers' save_pretrained through it) writes its files 0600, so a
    work folder or an export shared with another user or a serving container could not be read past its JSON
    files. A stage folder and an atomic folder give such files the mode open() gives (the umask's)."""
    from pathlib import Path

    import torch
    from safetensors.torch import save_file

    from ance_core.artifacts import new_file_mode

    private = tmp_path / "private.safetensors"  # a user's own file, hard-linked into a stage (the compress stage
    save_file({"w": torch.zeros(2)}, private)  # links its teacher's files): its mode is the user's (a review)

    def build(out):
        save_file({"w": torch.zeros(2)}, out / "model.safetensors")
        (out / "kept.key").write_text("k")
        (out / "kept.key").chmod(0o400)  # (a mode a writer chose: left as it is)
        os.link(private, out / "teacher.safetensors")

    folder = run_stage(tmp_path / "work", "stage", {"a": 1}, {}, build)
    with atomic_folder(tmp_path / "export") as out:
        save_file({"w": torch.zeros(2)}, out / "head.safetensors")
    for path in (Path(folder.path) / "model.safetensors", tmp_path / "export" / "head.safetensors"):
        assert os.stat(path).st_mode & 0o777 == new_file_mode(), path
    assert os.stat(Path(folder.path) / "kept.key").st_mode & 0o777 == 0o400
    assert os.stat(private).st_mode & 0o777 == 0o600


def test_a_file_written_through_a_link_keeps_the_link_and_a_device_is_refused(tmp_path):
    """A probe: `ance search --trec link.trec` replaced the link with a file (its target kept the old run), and
    `--trec /dev/full` replaced the device node with a text file (as root, /dev/stdout would have gone the same way)."""
    import stat

    from ance_core.artifacts import write_text
    from ance_core.errors import AnceError

    (tmp_path / "target.trec").write_text("old")
    (tmp_path / "link.trec").symlink_to(tmp_path / "target.trec")
    write_text(tmp_path / "link.trec", "new")
    assert (tmp_path / "link.trec").is_symlink() and (tmp_path / "target.trec").read_text() == "new"
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(AnceError, match=r"pipe: not a regular file \(a folder, a device or a pipe\)"):
        write_text(tmp_path / "pipe", "x")
    assert stat.S_ISFIFO(os.stat(tmp_path / "pipe").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.trec", "pipe", "target.trec"]
    (tmp_path / "a").symlink_to(tmp_path / "b")  # a loop of links, a link into a folder that is not there: one line
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x.trec")
    for link, said in (("a", "a symbolic link that cannot be followed"), ("dangling", "in a folder that does not")):
        with pytest.raises(AnceError, match=said):
            write_text(tmp_path / link, "x")


@pytest.mark.parametrize("content", ["", "{\"stage\": \"bm25\", \"ke", "[]"])
def test_a_stage_folder_whose_manifest_is_cut_short_is_built_again(tmp_path, content):
    """A crash before the manifest reached the disk leaves it empty: the folder counted as complete and every later
    run failed on it with a JSON traceback (a command given it too)."""
    from ance_core.errors import DamagedStage

    def build(out):
        (out / "x.txt").write_text("built")
        return {"n": 1}

    first = run_stage(tmp_path, "demo", {"a": 1}, {}, build)
    (tmp_path / "demo" / first.digest / "manifest.json").write_text(content)
    assert not is_complete(first.path)
    with pytest.raises(DamagedStage, match=r"a damaged stage folder \(its manifest.json cannot be read: cut short by "
                       "a crash, or an interrupted copy\\); remove it"):
        read_manifest(first.path)
    again = run_stage(tmp_path, "demo", {"a": 1}, {}, build)
    assert again.path == first.path and not again.cached and read_manifest(again.path)["summary"] == {"n": 1}
