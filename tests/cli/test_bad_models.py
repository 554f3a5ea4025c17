"""Bad model folders, checkpoint meta files and settings a new user's probe found failing with a traceback, late (after
the data, BM25 and encoding stages) or silently: each is one line, exit status 2, before any work."""

import json
import shutil

import pytest
import torch

from tests.cli.test_cli import _invoke
from tests.tiny import random_head_checkpoint, tiny_pipeline_config, write_beir


def _data(tmp_path):
    return write_beir(tmp_path / "ds", [{"_id": f"d{i}", "text": f"passage {i}"} for i in range(6)],
                      [{"_id": f"q{i}", "text": f"query {i}"} for i in range(4)],
                      {"train": [("q0", "d0", 1), ("q1", "d1", 1)], "test": [("q2", "d2", 1), ("q3", "d3", 1)]})


def _run(tmp_path, tiny_model, *sets: str, model=None):
    """`ance run` on a tiny dataset with `sets`; its work folder must stay without any stage."""
    work = tmp_path / "work"
    config = tiny_pipeline_config(_data(tmp_path), model or tiny_model, work, rounds=1, steps=2)
    (tmp_path / "c.json").write_text(json.dumps(config))
    code, out = _invoke(["run", "--config", str(tmp_path / "c.json"), *(a for s in sets for a in ("--set", s))])
    assert "Traceback" not in out, out
    assert not any(p.is_dir() and p.name not in (".locks", "data") for p in work.glob("*")), sorted(work.glob("*"))
    return code, out


def _wider(folder, tmp_path, name="wider"):
    """A copy of a model folder whose config.json says 64 hidden units over its 32-unit weights."""
    copy = shutil.copytree(folder, tmp_path / name)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(config | {"hidden_size": 64}))
    return copy


def test_weights_that_do_not_fit_config_json_are_one_line_in_every_command(tmp_path, tiny_model):
    """Once a RuntimeError's traceback from transformers (`ignore_mismatched_sizes`), and for `run` after the data and
    BM25 stages and two retries of the model stage."""
    checkpoint = _wider(random_head_checkpoint(tiny_model, tmp_path / "checkpoint"), tmp_path)
    said = "its weights do not fit its config.json"
    ds = _data(tmp_path)
    for args in (["evaluate", "--checkpoint", str(checkpoint), "--dataset", str(ds), "--work-dir",
                  str(tmp_path / "w")],
                 ["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "export")]):
        code, out = _invoke(args)
        assert code == 2 and said in out and "Traceback" not in out, (args[0], out)
    assert not (tmp_path / "export").exists()
    code, out = _run(tmp_path, tiny_model, model=_wider(tiny_model, tmp_path, "wider-model"))
    assert code == 2 and said in out, out


def test_a_model_folder_without_tokenizer_files_is_refused_before_a_starting_checkpoint_is_cached(tmp_path, tiny_model):
    """transformers builds a tokenizer of 5 special tokens from config files alone: the model stage cached a
    starting checkpoint with it, the encoding refused it, and the run failed the same way after the files were
    added (the stage was reused). A folder without weights was refused only after the data and BM25 stages."""
    from ance_core.errors import AnceError
    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import init_model

    bare = shutil.copytree(tiny_model, tmp_path / "bare")
    for path in bare.glob("*"):
        if path.name.startswith(("tokenizer", "vocab", "special_tokens")):
            path.unlink()
    code, out = _run(tmp_path, tiny_model, model=bare)
    assert code == 2 and "its tokenizer knows" in out and "add its tokenizer files" in out, out
    with pytest.raises(AnceError, match="add its tokenizer files"):
        init_model(ModelConfig(name=str(bare)), tmp_path / "start")
    assert not (tmp_path / "start").exists()
    weightless = shutil.copytree(tiny_model, tmp_path / "weightless")
    (weightless / "model.safetensors").unlink()
    code, out = _run(tmp_path, tiny_model, model=weightless)
    assert code == 2 and f"cannot load model '{weightless}'" in out, out


def test_damaged_weights_an_encoder_decoder_and_weights_of_another_architecture_are_one_line(tmp_path, tiny_model):
    """A probe: a model.safetensors cut short (or not safetensors) was SafetensorError's traceback; a T5 folder was
    two tracebacks after the encoding began (its forward wants decoder inputs); the tiny BERT's weights under a
    config.json saying gpt2 trained a random GPT-2 with no word (transformers initialised all its weights)."""
    from transformers import T5Config, T5Model

    cut = shutil.copytree(tiny_model, tmp_path / "cut")
    (cut / "model.safetensors").write_bytes((cut / "model.safetensors").read_bytes()[:300])
    code, out = _run(tmp_path, tiny_model, model=cut)
    assert code == 2 and f"cannot load model '{cut}': its weights file is damaged" in out, out
    t5 = tmp_path / "t5"
    T5Model(T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)).save_pretrained(t5)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model / name).exists():
            shutil.copy(tiny_model / name, t5 / name)
    code, out = _run(tmp_path, tiny_model, model=t5)
    assert code == 2 and "model_type 't5' is an encoder-decoder model; this pipeline trains an encoder" in out, out
    other = shutil.copytree(tiny_model, tmp_path / "gpt2")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": config["hidden_size"], "n_layer": 1,
                                                   "n_head": 2, "vocab_size": config["vocab_size"]}))
    code, out = _run(tmp_path, tiny_model, model=other)
    assert code == 2 and "of its model_type 'gpt2' weights are not in its weights file" in out, out


@pytest.mark.parametrize("field, value, said", [
    ("passage_max_length", "abc", "passage_max_length 'abc' is not a whole number of at least 1"),
    ("pooling", "bogus", "pooling 'bogus' is not one of mean, cls"),
    ("document_mode", "bogus", "document_mode 'bogus' is not one of firstp, maxp"),
    ("max_passages", 0, "max_passages 0 is not a whole number of at least 1")])
def test_a_hand_edited_meta_file_is_refused_not_used(tmp_path, tiny_model, field, value, said):
    """ance_model.json's passage length "abc" failed late in evaluate (a TypeError in the encoding) and was exported
    as "passages abc"; an unknown pooling was run as mean pooling."""
    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    meta = json.loads((checkpoint / "ance_model.json").read_text())
    (checkpoint / "ance_model.json").write_text(json.dumps(meta | {field: value}))
    for args in (["evaluate", "--checkpoint", str(checkpoint), "--dataset", str(_data(tmp_path)), "--work-dir",
                  str(tmp_path / "w")],
                 ["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "export")]):
        code, out = _invoke(args)
        assert code == 2 and "a damaged checkpoint file" in out and said in out, (args[0], out)
    assert not (tmp_path / "export").exists()


def test_numbers_too_large_for_a_seed_or_a_count_of_rounds_are_refused_by_the_config(tmp_path, tiny_model):
    """rounds 10^20 was an OverflowError's traceback after the flow started; a seed of 10^20 a ValueError's at the
    warm-up's first step, after BM25, the zero-shot evaluation and mining."""
    from ance_core.pipeline.config import PipelineConfig

    for setting, field in (("rounds=99999999999999999999", "rounds"), ("rounds=1001", "rounds"),
                           ("warmup.seed=99999999999999999999", "warmup.seed"),
                           ("mining.seed=9223372036854775808", "mining.seed")):
        code, out = _run(tmp_path, tiny_model, setting)
        assert code == 2 and field in out and "less than or equal" in out, (setting, out)
    for args in (["--tune-set", "seeds=[42,99999999999999999999]"], ["--seed", "42", "--seed", "99999999999999999999"]):
        code, out = _invoke(["tune", *args])
        assert code == 2 and "seed" in out and ("less than or equal" in out or "a whole number from 0 to" in out) \
            and "Traceback" not in out, out
    # seeds that worked stay: torch and numpy take any int64 (and the mining's draws reduce theirs mod 2**64)
    assert PipelineConfig.model_validate({"warmup": {"seed": 2**40}, "mining": {"seed": 2**63 - 1}}).warmup.seed


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there to use")
def test_an_index_on_a_gpu_where_there_is_none_is_refused_before_any_work(tmp_path, tiny_model):
    """index.device gpu failed at the first search, after the corpus was encoded and indexed (in a work folder where
    those stages were cached, it was ignored)."""
    code, out = _run(tmp_path, tiny_model, "index.device=gpu")
    assert code == 2 and "index.device gpu: no GPU here for a flat index" in out, out
    code, out = _run(tmp_path, tiny_model, "index.device=gpu", "index.type=hnsw")
    assert code == 2 and "an hnsw index has no GPU implementation" in out, out
    code, out = _run(tmp_path, tiny_model, "index.device=gpu", "index.type=hnsw", "rounds=0")  # nothing mines: only
    assert code == 2 and "index.device gpu: no GPU here for a flat index" in out, out  # evaluation's flat index


def test_a_relevant_grade_no_judgement_reaches_is_refused(tmp_path, tiny_model):
    """eval.relevant_grade 5 on binary qrels: MRR@10 and recall read 0 for every model, run or file, silently."""
    (tmp_path / "run.trec").write_text("q2 Q0 d2 1 3.0 x\nq3 Q0 d3 1 3.0 x\n")
    code, out = _invoke(["evaluate", "--run", str(tmp_path / "run.trec"), "--dataset", str(_data(tmp_path)),
                         "--work-dir", str(tmp_path / "w"), "--relevant-grade", "5"])
    said = "5: no qrels row of split 'test'"
    assert code == 2 and f"--relevant-grade {said}" in out and "its top grade is 1" in out and "set at most 1" in out
    code, out = _run(tmp_path, tiny_model, "eval.relevant_grade=5")
    assert code == 2 and f"eval.relevant_grade {said}" in out, out
    code, out = _invoke(["evaluate", "--run", str(tmp_path / "run.trec"), "--dataset", str(_data(tmp_path)),
                         "--work-dir", str(tmp_path / "w"), "--relevant-grade", "1", "--json"])
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["mrr_at_10"] == 1.0, out




def test_a_checkpoint_without_config_json_or_with_a_file_it_may_not_read_says_which(tmp_path, tiny_model):
    """No config.json read as transformers' "Should have a `model_type` key"; weights the user may not read as "No such
    file or directory" (transformers' words for a file it could not open). Root reads any file: its run drops the
    capabilities that let it (setpriv)."""
    import os
    import subprocess
    import sys

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    (checkpoint / "model.safetensors").chmod(0)
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    if drop and (not shutil.which("setpriv") or subprocess.run([*drop, "true"], capture_output=True).returncode):
        pytest.skip("root, and no setpriv that can drop the capabilities to read any file")
    proc = subprocess.run([*drop, sys.executable, "-m", "ance_cli", "export", "--checkpoint", str(checkpoint), "--out",
                           str(tmp_path / "export")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "no permission to read model.safetensors" in proc.stderr, proc.stderr
    (checkpoint / "model.safetensors").chmod(0o644)
    (checkpoint / "config.json").unlink()
    code, out = _invoke(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "export")])
    assert code == 2 and "a damaged checkpoint (no config.json)" in out, out


def test_a_start_checkpoint_that_cannot_load_is_named_as_start_checkpoint(tmp_path, tiny_model):
    """A probe: `--set start_checkpoint=/nope` said "cannot load model '/nope'", not which setting named it."""
    code, out = _run(tmp_path, tiny_model, f"start_checkpoint={tmp_path / 'nope'}")
    assert code == 2 and f"error: start_checkpoint: cannot load model '{tmp_path / 'nope'}'" in out, out
