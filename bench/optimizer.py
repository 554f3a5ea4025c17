"""AdamW's update on a CPU: torch's per-tensor loop, its foreach (multi-tensor) path and its fused kernel (what
`make_optimizer` builds, ance_core/training/optim.py), over a model's parameters with random gradients. Each variant
steps `--steps` times after one untimed step, in the order per-tensor, foreach, fused, fused, foreach, per-tensor;
prints the milliseconds per step of each (the mean of its two runs) and the ratio per-tensor / fused.
    python bench/optimizer.py [--model minilm] [--steps 20]
"""

import argparse
import json
import time

import torch
from transformers import AutoModel

from ance_core.modeling.model import resolve_model_name

VARIANTS = {"per-tensor": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", help="'minilm', a Hugging Face id or a local model folder")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    params = list(AutoModel.from_pretrained(resolve_model_name(args.model)).parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    print(f"{sum(p.numel() for p in params):,} parameters in {len(params)} tensors, {torch.get_num_threads()} threads")
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for name in ["per-tensor", "foreach", "fused", "fused", "foreach", "per-tensor"]:
        optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, **VARIANTS[name])
        optimizer.step()
        started = time.perf_counter()
        for _ in range(args.steps):
            optimizer.step()
        times[name].append((time.perf_counter() - started) / args.steps * 1000)
    ms = {name: sum(v) / len(v) for name, v in times.items()}
    for name, value in ms.items():
        print(f"{name:10} {value:8.1f} ms per step")
    ratio = ms["per-tensor"] / ms["fused"]
    print(f"per-tensor / fused: {ratio:.2f}x")
    print(json.dumps({"ms": {k: round(v, 2) for k, v in ms.items()}, "ratio": round(ratio, 3)}))


if __name__ == "__main__":
    main()
