"""The encoder's forward alone, on fixed full batches (no tokenizing, no padding, no host copies): the ceiling that
corpus encoding (bench/gpu.py) is held against. BERT-base-shaped random weights (or MiniLM-L6's shape), each
precision mode timed over --iters batches of --batch x --length tokens after a warm-up:

- autocast: float32 weights under bf16 autocast (what encoding does: `encode_texts` with precision auto);
- bf16: the weights cast to bfloat16 (no autocast);
each with an all-ones attention mask (the SDPA path with a mask) and without one.

    python bench/forward_ceiling.py [--shape bert-base|minilm] [--batch 256] [--length 128] [--json FILE]
"""

import argparse
import json
import time

import torch
from transformers import BertConfig, BertModel

SHAPES = {"bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
          "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="bert-base")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = BertConfig(**SHAPES[args.shape])
    model = BertModel(config, add_pooling_layer=False).to(device).eval()
    dense = sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)
    tokens = args.batch * args.length
    flops = 2 * dense * tokens + 4 * config.num_hidden_layers * config.hidden_size * args.length * tokens
    ids = torch.randint(1000, 20000, (args.batch, args.length), device=device)
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "shape": args.shape,
              "attention": model.config._attn_implementation, "batch": args.batch, "length": args.length}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for precision in ("autocast", "bf16"):
        if precision == "bf16":
            model = model.to(torch.bfloat16)
        for masked in (True, False):
            mask = torch.ones_like(ids) if masked else None

            @torch.inference_mode()
            def forward(model=model, mask=mask, precision=precision):
                with torch.autocast(device, torch.bfloat16, enabled=precision == "autocast"):
                    return model(input_ids=ids, attention_mask=mask).last_hidden_state

            for _ in range(3):
                forward()
            sync()
            started = time.perf_counter()
            for _ in range(args.iters):
                forward()
            sync()
            seconds = (time.perf_counter() - started) / args.iters
            name = f"{precision}{'_mask' if masked else ''}"
            report[name] = {"ms_per_batch": round(seconds * 1e3, 2), "tflops": round(flops / seconds / 1e12, 1),
                            "mfu": round(flops / seconds / (args.peak_tflops * 1e12), 3)}
            print(name, json.dumps(report[name]), flush=True)
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
