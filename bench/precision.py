"""Does bf16 pay on this CPU? The encoder's forward (encoding) and a forward + backward (a training step) in fp32 and
under bf16 autocast, interleaved A B B A A B after one untimed call of each; prints the best time of each and the ratio
fp32 / bf16, and whether the pipeline's `precision: auto` takes bf16 here (AVX512-BF16 or AMX).
    python bench/precision.py [--model minilm] [--batch 64] [--length 256]
"""

import argparse
import time

import torch
from transformers import AutoModel

from ance_core.modeling.devices import cpu_has_native_bf16
from ance_core.modeling.model import resolve_model_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", help="'minilm', a Hugging Face id or a local model folder")
    parser.add_argument("--batch", type=int, default=64, help="texts of the forward (the step trains half of them)")
    parser.add_argument("--length", type=int, default=256, help="tokens of the forward (the step trains half)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = AutoModel.from_pretrained(resolve_model_name(args.model))
    ids = torch.randint(1000, model.config.vocab_size - 1, (args.batch, args.length))
    mask = torch.ones_like(ids)
    half = (max(1, args.batch // 2), max(8, args.length // 2))

    def forward(bf16: bool) -> None:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model(input_ids=ids, attention_mask=mask)

    def step(bf16: bool) -> None:
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=ids[: half[0], : half[1]], attention_mask=mask[: half[0], : half[1]])
        out.last_hidden_state.float().pow(2).mean().backward()

    print(f"{torch.get_num_threads()} threads; bf16 in hardware (precision auto takes bf16): {cpu_has_native_bf16()}")
    for name, fn, shape in (("forward", forward, (args.batch, args.length)), ("train step", step, half)):
        fn(False)
        fn(True)
        times: dict[bool, list[float]] = {False: [], True: []}
        for bf16 in (False, True, True, False, False, True):
            started = time.perf_counter()
            fn(bf16)
            times[bf16].append(time.perf_counter() - started)
        fp32, bf16 = min(times[False]), min(times[True])
        print(f"{name} {shape[0]} x {shape[1]}: fp32 {fp32:.3f} s, bf16 autocast {bf16:.3f} s, fp32 / bf16 "
              f"{fp32 / bf16:.2f}x")


if __name__ == "__main__":
    main()
