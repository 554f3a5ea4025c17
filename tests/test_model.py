import math

import torch
from transformers import AutoTokenizer

from ance_core.config import ModelConfig
from ance_core.model import BiEncoder, load_checkpoint, pool, read_meta, resolve_model_name


def test_pooling_mean_ignores_padding_and_cls_takes_first():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])  # (B=1, T=3, h=2)
    mask = torch.tensor([[1, 1, 0]])
    assert torch.allclose(pool(hidden, mask, "mean"), torch.tensor([[2.0, 3.0]]))
    assert torch.allclose(pool(hidden, mask, "cls"), torch.tensor([[1.0, 2.0]]))


def test_fresh_head_scores_centred_cosine_over_temperature(tiny_model):
    from transformers import AutoModel

    model = BiEncoder(AutoModel.from_pretrained(tiny_model), "mean")
    model.init_head(temperature=0.05)
    x = torch.randn(4, model.dim)
    z = model.norm(model.proj(x))
    c = x - x.mean(1, keepdim=True)
    corr = (c @ c.T) / (c.norm(dim=1, keepdim=True) * c.norm(dim=1))
    assert torch.allclose(z @ z.T, corr / 0.05, atol=1e-2)  # LayerNorm eps makes it approximate


def test_checkpoint_round_trip(tiny_model, tmp_path):
    from ance_core.model import init_model

    init_model(ModelConfig(name=str(tiny_model), pooling="cls", query_max_length=16), tmp_path)
    meta = read_meta(tmp_path)
    assert meta.pooling == "cls" and meta.query_max_length == 16
    model, tokenizer, _ = load_checkpoint(tmp_path)
    again, _, _ = load_checkpoint(tmp_path)
    batch = tokenizer(["cell protein", "gene"], padding=True, return_tensors="pt")
    inputs = (batch["input_ids"], batch["attention_mask"])
    model.eval(), again.eval()
    with torch.no_grad():
        assert torch.equal(model(*inputs), again(*inputs))
    assert math.isclose(model.norm.weight[0].item(), math.sqrt(1 / (0.05 * model.dim)), rel_tol=1e-6)
    assert isinstance(tokenizer, type(AutoTokenizer.from_pretrained(tiny_model)))


def test_minilm_alias_resolves_to_packaged_weights_or_hub_id():
    resolved = resolve_model_name("minilm")
    assert resolved.endswith("model") or resolved == "sentence-transformers/all-MiniLM-L6-v2"
    assert resolve_model_name("roberta-base") == "roberta-base"
