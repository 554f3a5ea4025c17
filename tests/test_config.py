import pytest
from pydantic import ValidationError

from ance_core.config import PipelineConfig, TrainConfig, load_config
from ance_core.errors import AnceError


def test_typos_and_bad_values_are_refused():
    with pytest.raises(ValidationError, match="learning_rat"):
        TrainConfig(learning_rat=1e-5)
    with pytest.raises(ValidationError, match="greater than 0"):
        TrainConfig(learning_rate=0)
    with pytest.raises(ValidationError, match="training on the evaluation split"):
        PipelineConfig(data={"train_split": "test"})
    with pytest.raises(ValidationError):
        PipelineConfig().rounds = 3  # frozen


def test_load_config_names_file_and_field(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("rounds: 1\nwarmup:\n  max_steps: 5\n")
    cfg = load_config(good)
    assert cfg.rounds == 1 and cfg.warmup.max_steps == 5 and cfg.ance.max_steps is None
    bad = tmp_path / "bad.yaml"
    bad.write_text("warmup:\n  batch_size: -1\nmodel:\n  pooling: max\n")
    with pytest.raises(AnceError) as err:
        load_config(bad)
    assert "bad.yaml" in str(err.value) and "warmup.batch_size" in str(err.value) and "model.pooling" in str(err.value)
    with pytest.raises(AnceError, match="not valid YAML"):
        (tmp_path / "broken.yaml").write_text("a: [1\n")
        load_config(tmp_path / "broken.yaml")
    with pytest.raises(AnceError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
