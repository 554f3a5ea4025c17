"""AdamW as the training loop builds it: the fused kernel on a CPU as on a GPU, the same update as torch's
per-tensor AdamW to float rounding, weight decay on matrices only."""

import copy

import torch

from ance_core.training.optim import make_optimizer


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.norm = torch.nn.Linear(8, 4), torch.nn.LayerNorm(4)

    def forward(self, x):
        return self.norm(self.linear(x))


def steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, n: int = 5) -> None:
    torch.manual_seed(1)
    for _ in range(n):
        optimizer.zero_grad()
        model(torch.randn(6, 8)).square().mean().backward()
        optimizer.step()


def test_adamw_on_a_cpu_is_fused_and_updates_as_the_per_tensor_one():
    torch.manual_seed(0)
    model = Tiny()
    reference = copy.deepcopy(model)
    optimizer = make_optimizer(model, "adamw", 1e-2, 0.1)
    assert optimizer.defaults["fused"] is True
    groups = [{"params": [reference.linear.weight], "weight_decay": 0.1},
              {"params": [reference.linear.bias, reference.norm.weight, reference.norm.bias], "weight_decay": 0.0}]
    steps(model, optimizer)
    steps(reference, torch.optim.AdamW(groups, lr=1e-2, foreach=False))
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # decay on the matrix only: its group has the weight decay, biases and LayerNorm gains none
    assert [len(g["params"]) for g in optimizer.param_groups] == [1, 3]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


def test_lamb_is_not_fused():
    assert "fused" not in make_optimizer(Tiny(), "lamb", 1e-3, 0.0).defaults
