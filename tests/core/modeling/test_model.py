import math

import pytest
import torch
from transformers import AutoTokenizer

from ance_core.errors import AnceWarning
from ance_core.modeling import devices
from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import BiEncoder, load_checkpoint, pool, read_meta, resolve_model_name


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


def test_a_prepared_mask_encodes_as_the_padding_mask_without_reading_the_device(tiny_model):
    """On a GPU the BiEncoder hands BERT a prepared (B, 1, 1, T) mask: the same hidden states on the real tokens as
    the (B, T) padding mask, without transformers' `mask.all()` (a host read of a device value, which made the host
    wait for the GPU at every forward). Checked here on the CPU, where the forward keeps the (B, T) mask."""
    from torch.profiler import profile
    from transformers import AutoModel

    from ance_core.modeling.model import prepared_mask, takes_prepared_mask

    encoder = AutoModel.from_pretrained(tiny_model).eval()
    assert takes_prepared_mask(encoder) and BiEncoder(encoder, "mean").prepared_masks
    ids = torch.randint(5, 50, (4, 12))
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 7:], mask[3, 3:] = 0, 0
    reads = ("aten::item", "aten::_local_scalar_dense")
    with torch.inference_mode():
        with profile() as padding:
            expected = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        with profile() as prepared:
            got = encoder(input_ids=ids, attention_mask=prepared_mask(mask)).last_hidden_state
    assert any(e.key in reads for e in padding.key_averages())  # the read the prepared mask avoids
    assert not any(e.key in reads for e in prepared.key_averages())
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()])
    eager = AutoModel.from_pretrained(tiny_model, attn_implementation="eager")
    assert not takes_prepared_mask(eager)  # eager attention adds a float mask: it keeps the (B, T) one


def test_checkpoint_round_trip(tiny_model, tmp_path):
    """A model saved and loaded again computes exactly what the original did: encoder, head and pooling."""
    from transformers import AutoModel

    from ance_core.modeling.model import ModelMeta, init_model, save_checkpoint

    init_model(ModelConfig(name=str(tiny_model), pooling="cls", query_max_length=16), tmp_path / "init")
    meta = read_meta(tmp_path / "init")
    assert meta.pooling == "cls" and meta.query_max_length == 16
    fresh, _, _ = load_checkpoint(tmp_path / "init")
    assert math.isclose(fresh.norm.weight[0].item(), math.sqrt(1 / (0.05 * fresh.dim)), rel_tol=1e-6)

    original = BiEncoder(AutoModel.from_pretrained(tiny_model), "cls")
    torch.manual_seed(1)
    with torch.no_grad():  # a head unlike the identity init, so that a head that failed to load would show
        for p in (*original.proj.parameters(), *original.norm.parameters()):
            p.add_(torch.randn_like(p))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    save_checkpoint(original, tokenizer, ModelMeta(str(tiny_model), "cls", 16, 48), tmp_path / "saved")
    loaded, loaded_tokenizer, loaded_meta = load_checkpoint(tmp_path / "saved")
    batch = tokenizer(["cell protein", "gene expression in mice"], padding=True, return_tensors="pt")
    inputs = (batch["input_ids"], batch["attention_mask"])
    original.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(original(*inputs), loaded(*inputs))
        assert not torch.allclose(original(*inputs), fresh(*inputs))
    assert loaded_meta == ModelMeta(str(tiny_model), "cls", 16, 48)
    assert loaded_tokenizer(["gene"])["input_ids"] == tokenizer(["gene"])["input_ids"]


def test_minilm_alias_resolves_to_packaged_weights_or_hub_id():
    resolved = resolve_model_name("minilm")
    assert resolved.endswith("model") or resolved == "sentence-transformers/all-MiniLM-L6-v2"
    assert resolve_model_name("roberta-base") == "roberta-base"


def test_attention_dropout_override_applies_to_the_modules_not_the_saved_config(tiny_model, tmp_path):
    import json

    from ance_core.modeling.model import init_model, save_checkpoint

    init_model(ModelConfig(name=str(tiny_model)), tmp_path / "init")
    model, tokenizer, meta = load_checkpoint(tmp_path / "init", attention_dropout=0.0)
    attention = [m for n, m in model.encoder.named_modules() if n.endswith("attention.self.dropout")]
    assert attention and all(m.p == 0.0 for m in attention)
    hidden = [m for n, m in model.encoder.named_modules() if n.endswith("output.dropout")]
    assert hidden and all(m.p == 0.1 for m in hidden)  # only the attention dropout is overridden
    save_checkpoint(model, tokenizer, meta, tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["attention_probs_dropout_prob"] == 0.1


def test_hidden_dropout_override_reaches_every_hidden_dropout_and_not_the_saved_config(tiny_model, tmp_path):
    import json

    from ance_core.modeling.model import init_model, save_checkpoint

    init_model(ModelConfig(name=str(tiny_model)), tmp_path / "init")
    model, tokenizer, meta = load_checkpoint(tmp_path / "init", attention_dropout=0.05, hidden_dropout=0.0)
    dropouts = {n: m.p for n, m in model.encoder.named_modules() if isinstance(m, torch.nn.Dropout)}
    hidden = {n: p for n, p in dropouts.items() if not n.endswith("attention.self.dropout")}
    assert any(n.startswith("embeddings") for n in hidden) and any("attention.output" in n for n in hidden)
    assert set(hidden.values()) == {0.0} and set(dropouts.values()) == {0.0, 0.05}
    save_checkpoint(model, tokenizer, meta, tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert (saved["hidden_dropout_prob"], saved["attention_probs_dropout_prob"]) == (0.1, 0.1)


def test_auto_precision_is_bf16_only_on_a_cpu_that_multiplies_bf16_in_hardware(monkeypatch):
    """Emulated bf16 ran a MiniLM step 25x slower than fp32 on an AVX2-only CPU: `auto` is fp32 there, and an
    explicit bf16 is kept with a warning; on a CPU with AVX512-BF16/AMX `auto` is bf16."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: False)
    assert devices.autocast_dtype("auto", cpu) is None
    assert devices.autocast_dtype("fp32", cpu) is None
    with pytest.warns(AnceWarning, match="without bf16 in hardware"):
        assert devices.autocast_dtype("bf16", cpu) is torch.bfloat16
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: True)
    assert devices.autocast_dtype("auto", cpu) is torch.bfloat16
    assert devices.autocast_dtype("bf16", cpu) is torch.bfloat16
