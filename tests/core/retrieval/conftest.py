"""Fixtures of the retrieval tests."""

import pytest

from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model, load_checkpoint


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model, tmp_path_factory):
    """A fresh checkpoint of the tiny BERT at 32 passage tokens, loaded: (model, tokenizer)."""
    out = tmp_path_factory.mktemp("ckpt")
    init_model(ModelConfig(name=str(tiny_model), passage_max_length=32), out)
    model, tokenizer, _ = load_checkpoint(out)
    return model, tokenizer
