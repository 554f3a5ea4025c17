"""What goes into the keys of the training stages (issue 41 items 2, 5 and 9): the train-async trainer's key holds
the run's BM25 when its refreshes mine a BM25 ranking (and only then: the other samplers keep the keys they had),
never the evaluation depth; a stage that accumulates gradients holds the accumulation rule (a step of fewer
micro-batches became their mean), a stage of one micro-batch per step the key it had before."""

from ance_core.artifacts import stage_key
from ance_core.negatives.config import MiningConfig
from ance_core.retrieval.config import BM25Config, EncodeConfig, IndexConfig
from ance_core.training.config import TrainConfig
from tasks.train import ACCUMULATION_RULE, train_config
from tasks.train_async import trainer_config

INPUTS = {"checkpoint": "c" * 16, "negatives": "n" * 16, "data": "d" * 16}


def _trainer_key(mining: MiningConfig, bm25: BM25Config, train: TrainConfig = TrainConfig()) -> str:
    return stage_key("train-async", trainer_config(train, "train", 2, EncodeConfig(), IndexConfig(), mining, None,
                                                   bm25), INPUTS)


def test_the_async_trainers_key_holds_the_runs_bm25_when_its_refreshes_mine_a_bm25_ranking():
    hybrid = MiningConfig(sampler="ance+bm25")
    assert _trainer_key(hybrid, BM25Config(k1=1.2)) != _trainer_key(hybrid, BM25Config())
    assert _trainer_key(hybrid, BM25Config(top_k=100)) == _trainer_key(hybrid, BM25Config())  # an evaluation depth
    dense = MiningConfig(sampler="ance")
    assert _trainer_key(dense, BM25Config(k1=1.2)) == _trainer_key(dense, BM25Config())
    assert "bm25" not in trainer_config(TrainConfig(), "train", 2, EncodeConfig(), IndexConfig(), dense, None,
                                        BM25Config())


def test_accumulating_stages_hold_the_accumulation_rule_and_the_others_keep_their_keys():
    one, two = TrainConfig(), TrainConfig(grad_accumulation=2)
    assert "accumulation" not in train_config(one, "train")
    assert train_config(two, "train")["accumulation"] == ACCUMULATION_RULE
    assert train_config(two, "train", round_=1) == {"train": two, "split": "train", "accumulation": ACCUMULATION_RULE,
                                                    "round": 1}
    async_two = trainer_config(two, "train", 2, EncodeConfig(), IndexConfig(), MiningConfig(), None, BM25Config())
    assert async_two["accumulation"] == ACCUMULATION_RULE
    # the warm-up's key of one micro-batch per step is the key it had before issue 41 (tests/core/test_stage_keys.py
    # pins the train stage's key itself)
    assert train_config(one, "train") == {"train": one, "split": "train"}


def test_the_demo_recipes_training_keys_keep_their_values():
    """The functions build the keys the inline code built (computed before they moved into functions)."""
    from ance_core.pipeline.recipes import recipe_config

    demo, checkpoint = recipe_config("demo"), {"checkpoint": "c" * 16}
    assert stage_key("train", train_config(demo.warmup, "train"), checkpoint) == "d9d1323b76133804"
    trainer = trainer_config(demo.ance, "train", 2, demo.encode, demo.index, demo.mining, None, demo.bm25)
    assert stage_key("train-async", trainer, checkpoint) == "978ae6e9867e2503"


def test_a_local_model_folder_changed_in_place_is_another_starting_model(tiny_model, tmp_path):
    """A model folder whose weights were replaced at the same path kept its `model` stage (keyed by the path alone),
    and every stage after it: the old model's results were handed out for the new one."""
    import shutil

    from ance_core.modeling.config import ModelConfig
    from tasks.model import init_checkpoint, local_model_digest

    folder = shutil.copytree(tiny_model, tmp_path / "base")
    cfg = ModelConfig(name=str(folder))
    first = init_checkpoint.fn(cfg, str(tmp_path / "work"))
    assert init_checkpoint.fn(cfg, str(tmp_path / "work")).path == first.path  # (unchanged: reused)
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-8] + b"\x00" * 8)  # (the last bytes of a weight: another model)
    assert init_checkpoint.fn(cfg, str(tmp_path / "work")).path != first.path
    assert local_model_digest("minilm") is None and local_model_digest("org/some-hub-model") is None
