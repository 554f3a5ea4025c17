"""Stage keys are content: what a stage's config holds, not where its class lives. These digests were taken before the
core moved into rooms (issue 27) and must not change unless a stage's config really changes: every existing work
folder's stages would be built again. A change that alters them on purpose updates them here and says so.

Changed on purpose (issue 28): `encode` (float16 shards by default: `encode.dtype`) and `index` (`gpu_float16`, a
placement option, but the whole index section is in the async trainer's key) — every encoding is written again, the
data and BM25 stages are reused (the warm-up trains again: mining's new draws, and the cadence below). The whole
pipeline config also gained `retention` (in no stage key), and `eval` (the compare config's too) its
ignore_identical_ids option (in the evaluate stage's key when on, the default: a new key, other metrics: issue 29).

Also: the checkpoint cadence (`checkpoint_every`, `checkpoint_seconds`) and `loader_workers` left the dump a key is
made of (KEY_DUMP): the warmup and ance sections and the whole configs lost their `"checkpoint_every": 50`, nothing
else (the train stage's key holds the section's repr, which leaves them out too: `repr=False`).

Changed on purpose (issue 30): the demo recipe's `warmup` and `ance` sections (learning_rate 4e-5, chosen on the dev
splits of three collections), so the demo's training stages and everything after them are built again; data, BM25,
the zero-shot model and its encoding are reused. The `full` recipe took the same learning rate (its whole digest).
The run's selection rule (`selection`, issue 40) is in the whole config only when it is not the default `best`: a
recipe search's trials (keyed by it, each recording the run's choice) under one-se are trials of their own.

Changed on purpose (session 20): the demo recipe's `warmup` and `ance` sections (hidden_dropout 0, chosen on SciFact's
dev split under two seeds: RESULTS.md), so the demo's training stages are built again; the `full` recipes keep theirs
(the option is left out of a key at its default, null)."""

import pytest

from ance_core.artifacts import digest_of, stage_key
from ance_core.pipeline.config import CompareConfig
from ance_core.pipeline.recipes import recipe_config
from ance_core.training.config import TrainConfig

SECTIONS = {  # the digest of each section that goes into a stage key, for the demo recipe (`make demo`)
    "data": "ce3fb57841cd524d", "model": "4ca06ee6e527951b", "bm25": "3cfe8408cdc1c0d6",
    "bm25_negatives": "9333e2bd5b904b7a", "warmup": "66836f9274bdfcc7", "encode": "e5077c2ce78425ce",
    "index": "3ed98549b7ea4b49", "mining": "bb46a12fd1ef7bbe", "ance": "27a02e013f21f5d5", "eval": "e421617f18fa7996",
}


def test_the_demo_recipes_stage_configs_keep_their_digests():
    cfg = recipe_config("demo")
    assert {name: digest_of(getattr(cfg, name)) for name in SECTIONS} == SECTIONS


@pytest.mark.parametrize("recipe, whole, one_se", [("full", "569276c7dd7735d1", "0ff8cf29cef74ae3")])
def test_a_whole_pipeline_config_keeps_its_digest(recipe, whole, one_se):
    assert digest_of(recipe_config(recipe)) == whole
    assert digest_of(recipe_config(recipe).model_copy(update={"selection": "one-se"})) == one_se
    assert digest_of(CompareConfig()) == "e36a559dfea60fc3"


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
    assert digest_of(warmup) == SECTIONS["warmup"] == digest_of(two)
    assert TrainConfig.model_validate(two.model_dump(mode="json")).loader_workers == 2


def test_the_checkpoint_cadence_is_in_no_stage_key():
    """When checkpoints are taken does not change what a training stage computes: neither the section's digest nor the
    train stage's key (the section nested in a dict: its repr) depends on it. The config's own dump keeps it (the DDP
    ranks, the Prefect form and the MLflow params read that)."""
    cfg = recipe_config("demo").warmup
    other = cfg.model_copy(update={"checkpoint_every": 7, "checkpoint_seconds": 30})
    assert digest_of(other) == digest_of(cfg) != digest_of(cfg.model_copy(update={"seed": 1}))
    train_key = lambda c: stage_key("train", {"train": c, "split": "train"}, {"checkpoint": "c" * 16})  # noqa: E731
    assert train_key(other) == train_key(cfg) == "d9d1323b76133804"
    assert TrainConfig.model_validate(other.model_dump(mode="json")) == other


def test_every_stage_has_a_rule_and_each_rule_is_pinned():
    """Every stage the code builds (each name given to run_stage or stage_key) has a rule in STAGE_RULES, and the
    table and a key per stage are pinned here: a change that alters a stage's output bumps its rule (its key moves,
    its old folders are not handed out as new ones), and this test is updated with it, on purpose (issue 41)."""
    import re
    from pathlib import Path

    from ance_core.artifacts import STAGE_RULES

    root = Path(__file__).resolve().parents[2]
    built = set()
    for folder in ("ance_core", "tasks", "flows", "tracking", "ance_cli"):
        for path in (root / folder).rglob("*.py"):
            built |= set(re.findall(r"(?:run_stage|stage_key)\([^,()]+, *\"([a-z0-9-]+)\"", path.read_text()))
    assert built == set(STAGE_RULES)
    # bumped: data and corpus (what messy collections load as: ids trimmed, UTF-16 files, half surrogate pairs);
    # fusion and fuse (RRF without BM25's score-0 filler rows); compress (PCA no longer centres the queries); mine
    # (BM25's filler rows are no candidates, a query's own id no negative); data again (own dev queries not trained);
    # evaluate, fusion and fuse (ties in trec_eval's order for every metric, a query's own id out before fusing, BM25
    # scored on its matches, hits of one score normalised to 1); data and corpus again (an id holding whitespace is a
    # bad row, UTF-16 without a byte-order mark is read as UTF-16); train and train-async (AdamW fused on a CPU too);
    # fusion and fuse again (a convex combination scales BM25's matches only); data again (4-column qrels rows whose
    # second column is no TREC iteration are bad rows); data and corpus again (a number as a query's text is its
    # digits, TSV files with pandas' row numbers and corpora without a text field are refused)
    assert STAGE_RULES == dict.fromkeys(sorted(STAGE_RULES), 0) | {"data": 5, "corpus": 3, "fusion": 3, "fuse": 3,
                                                                   "compress": 1, "mine": 1, "evaluate": 1, "train": 1,
                                                                   "train-async": 1}
    keys = {name: stage_key(name, {"probe": 1}, {"input": "d" * 16}) for name in sorted(STAGE_RULES)}
    assert digest_of(keys) == "22084faade68517b"


def _stage_configs():
    import ance_core.pipeline.config  # noqa: F401  (every room's configs imported)
    from ance_core.stage_config import StageConfig

    found, todo = [], [StageConfig]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def test_every_unsaid_value_is_its_fields_default_and_a_saved_config_loads_as_it_was():
    """UNSAID fields leave every dump at their value: that value must be the field's default, or a config saved and
    loaded again (a deployment's parameters, a search's recipe.yaml) would silently take another value. A field whose
    default changed goes in KEY_UNSAID (out of the key only). Every config's defaults round-trip."""
    configs = _stage_configs()
    assert len(configs) >= 10
    for cls in configs:
        try:
            default = cls()
        except Exception:  # noqa: BLE001  (a config with required fields)
            continue
        for name, value in cls.UNSAID.items():
            assert cls.model_fields[name].get_default(call_default_factory=True) == value, f"{cls.__name__}.{name}"
        assert cls.model_validate(default.model_dump(mode="json")) == default, cls.__name__


def test_the_registrys_name_for_a_collection_is_in_no_key():
    """`data.name` names the registered model; nothing a stage builds depends on it, so a search's trials and the
    whole config's keys (which hold the config's repr inside a dict) stay with it set."""
    from ance_core.data.config import DataConfig

    cfg = recipe_config("full")
    named = cfg.model_copy(update={"data": DataConfig(dataset=cfg.data.dataset, name="scifact-2026")})
    assert named.data.collection == "scifact-2026" and cfg.data.collection == "scifact"
    for stage in ("trial", "tune", "reports"):
        assert stage_key(stage, {"pipeline": named}, {"data": "d" * 16}) == stage_key(stage, {"pipeline": cfg},
                                                                                       {"data": "d" * 16})
    assert digest_of(named) == digest_of(cfg) and digest_of(named.data) == digest_of(cfg.data)


def test_a_whole_simans_trial_has_a_key_of_its_own_since_simans_centres_on_the_pairs_positive(monkeypatch):
    """SimANS centres each pair on its own positive since session 29 (the mine stage's key says so): a recipe search's
    cached trial of a recipe whose rounds mine with it trained on the old negatives, and was reused as if it were the
    new code's (found by a review). Warm-up trials and other samplers keep their keys."""
    import flows.trial as trial

    seen = []
    monkeypatch.setattr(trial, "run_stage", lambda work_dir, stage, config, inputs, build: seen.append(config))
    demo = recipe_config("demo")
    assert demo.mining.sampler == "simans"
    for config in (demo, demo.model_copy(update={"warmup_only": True}),
                   demo.model_copy(update={"mining": demo.mining.model_copy(update={"sampler": "ance"})})):
        trial.trial.fn(config, "d" * 16)
    assert [c.get("simans_centre") for c in seen] == ["own positive", None, None]
