"""Does mimalloc pay on this CPU? The encoder's forward (an encoding batch, 64 x 256 tokens) and a training step
(the demo's: 16 queries of 24 tokens and 32 passages of 128, forward, backward and AdamW) under the precision `auto`
picks, in processes on glibc's malloc and on mimalloc (ance_core/allocator.py: what the `ance` command starts under),
alternated glibc, mimalloc, mimalloc, glibc, glibc, mimalloc so that a drift of the machine's speed falls on both.
Prints each process's median seconds and minor page faults per call, then the ratio glibc / mimalloc of the medians'
medians.
    python bench/allocator.py [--model minilm] [--batch 64] [--length 256] [--calls 10] [--processes 6]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from ance_core.allocator import _STARTED, mimalloc_library

# one process's measurement: prints {"forward": [s...], "step": [s...], "faults": {...}} as its last line
MEASURE = """
import json, resource, sys, time
import torch
from transformers import AutoModel
from ance_core.modeling.devices import autocast_dtype
from ance_core.modeling.model import resolve_model_name
from ance_core.allocator import in_use
model_name, calls, size, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
model = AutoModel.from_pretrained(resolve_model_name(model_name))
dtype = autocast_dtype("auto", torch.device("cpu"))
vocab = model.config.vocab_size
def batch(n, length):
    ids = torch.randint(1000 % vocab, vocab - 1, (n, length))
    return ids, torch.ones_like(ids)
passages, queries = batch(size, length), batch(max(1, size // 4), min(24, length))
train_passages = batch(2 * len(queries[0]), max(8, length // 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
def autocast():
    return torch.autocast("cpu", dtype=dtype, enabled=dtype is not None)
def forward():
    with torch.inference_mode(), autocast():
        model(input_ids=passages[0], attention_mask=passages[1])
def step():
    optimizer.zero_grad(set_to_none=True)
    with autocast():
        q = model(input_ids=queries[0], attention_mask=queries[1]).last_hidden_state[:, 0]
        p = model(input_ids=train_passages[0], attention_mask=train_passages[1]).last_hidden_state[:, 0]
    torch.nn.functional.cross_entropy(q.float() @ p.float().T, torch.arange(len(q)) * 2).backward()
    optimizer.step()
out = {"allocator": in_use(), "faults": {}}
for name, fn in (("forward", forward), ("step", step)):
    fn()
    before, times = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    out[name] = times
    out["faults"][name] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls
print(json.dumps(out))
"""


def measure(allocator: str, args: argparse.Namespace, library: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", _STARTED)}
    if allocator == "mimalloc":
        env["LD_PRELOAD"] = library
    proc = subprocess.run([sys.executable, "-c", MEASURE, args.model, str(args.calls), str(args.batch),
                           str(args.length)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(proc.stderr[-3000:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["allocator"] != allocator:
        sys.exit(f"the process ran on {out['allocator']}, not {allocator}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", help="'minilm', a Hugging Face id or a local model folder")
    parser.add_argument("--batch", type=int, default=64, help="texts of the forward (the step: a quarter as queries)")
    parser.add_argument("--length", type=int, default=256, help="tokens of the forward (the step's passages: half)")
    parser.add_argument("--calls", type=int, default=10, help="timed calls of each kind per process")
    parser.add_argument("--processes", type=int, default=6, help="processes in all, alternating the two mallocs")
    args = parser.parse_args()
    library = mimalloc_library()
    if library is None:
        sys.exit("no mimalloc here (the cmeel-mimalloc wheel, Linux only)")
    order = ["system", "mimalloc", "mimalloc", "system", "system", "mimalloc"]
    order = (order * (args.processes // len(order) + 1))[:max(2, args.processes)]
    medians = {allocator: {"forward": [], "step": []} for allocator in ("system", "mimalloc")}
    print(f"{'malloc':9} {'forward s':>10} {'faults':>9} {'step s':>8} {'faults':>8}")
    for allocator in order:
        out = measure(allocator, args, library)
        for kind in ("forward", "step"):
            medians[allocator][kind].append(statistics.median(out[kind]))
        print(f"{allocator:9} {medians[allocator]['forward'][-1]:10.3f} {out['faults']['forward']:9.0f} "
              f"{medians[allocator]['step'][-1]:8.3f} {out['faults']['step']:8.0f}", flush=True)
    ratios = {kind: statistics.median(medians["system"][kind]) / statistics.median(medians["mimalloc"][kind])
              for kind in ("forward", "step")}
    print(f"glibc / mimalloc: forward {ratios['forward']:.2f}x, training step {ratios['step']:.2f}x")
    print(json.dumps({"ratio_forward": round(ratios["forward"], 3), "ratio_step": round(ratios["step"], 3),
                      "medians": medians}))


if __name__ == "__main__":
    main()
