"""Stage keys are content: what a stage's config holds, not where its class lives. These digests were taken before the
core moved into rooms (issue 27) and must not change unless a stage's config really changes: every existing work
folder's stages would be built again. A change that alters them on purpose updates them here and says so.

Changed on purpose (issue 28): `encode` (float16 shards by default: `encode.dtype`) and `index` (`gpu_float16`, a
placement option, but the whole index section is in the async trainer's key) — every encoding is written again, the
data, BM25 and warm-up stages are reused. The whole pipeline config also gained `retention` (in no stage key), and
`eval` (the compare config's too) its ignore_identical_ids option (in the evaluate stage's key when on, the default:
a new key, other metrics: issue 29)."""

import pytest

from ance_core.artifacts import digest_of, stage_key
from ance_core.pipeline.config import CompareConfig
from ance_core.pipeline.recipes import recipe_config

SECTIONS = {  # the digest of each section that goes into a stage key, for the demo recipe (`make demo`)
    "data": "ce3fb57841cd524d", "model": "4ca06ee6e527951b", "bm25": "3cfe8408cdc1c0d6",
    "bm25_negatives": "9333e2bd5b904b7a", "warmup": "d958ded3c05bad92", "encode": "e5077c2ce78425ce",
    "index": "3ed98549b7ea4b49", "mining": "bb46a12fd1ef7bbe", "ance": "165311e4cf800293", "eval": "e421617f18fa7996",
}


def test_the_demo_recipes_stage_configs_keep_their_digests():
    cfg = recipe_config("demo")
    assert {name: digest_of(getattr(cfg, name)) for name in SECTIONS} == SECTIONS


@pytest.mark.parametrize("recipe, whole", [("full", "e6af8fadc3dbd93c")])
def test_a_whole_pipeline_config_keeps_its_digest(recipe, whole):
    assert digest_of(recipe_config(recipe)) == whole
    assert digest_of(CompareConfig()) == "066e4a634921c59e"


def test_stage_keys_of_the_demo_keep_their_values():
    cfg = recipe_config("demo")
    assert stage_key("model", cfg.model, {}) == "42b34282931b6ba9"
    assert stage_key("encode", cfg.encode, {"checkpoint": "c" * 16, "data": "d" * 16}) == "c2dc4bdea06b813a"
    bm25 = {"bm25": cfg.bm25, "split": "test", "top_k": 1000}
    assert stage_key("bm25", bm25, {"data": "d" * 16}) == "64ad129c4c407584"


def test_loader_workers_are_in_no_training_key_and_survive_a_dump():
    """loader_workers changes how batches are built, not what is trained: neither the stage folder's key (taken over
    the config's repr inside a dict) nor the section's dump (the task cache key) moves with it at its default, and the
    stage folder's key not at any value; a set value survives a dump (the DDP ranks' spec, Prefect parameters)."""
    from ance_core.training.config import TrainConfig

    warmup = recipe_config("demo").warmup
    two = warmup.model_copy(update={"loader_workers": 2})
    key = lambda c: stage_key("train", {"train": c, "split": "train"}, {"checkpoint": "c" * 16})  # noqa: E731
    assert key(two) == key(warmup)
    assert digest_of(warmup) == SECTIONS["warmup"] and "loader_workers" not in warmup.model_dump()
    assert TrainConfig.model_validate(two.model_dump(mode="json")).loader_workers == 2
