"""A model soup (Wortsman et al. 2022): the uniform average of the weights of several checkpoints trained from the
same start (e.g. one recipe under several seeds), written as a checkpoint of its own, which `ance evaluate
--checkpoint` scores like any other.

    python bench/soup.py <checkpoint> <checkpoint> [...] --out soup/   # then: ance evaluate --checkpoint soup/

The checkpoints must share their architecture and meta (same base model, pooling, lengths, prefixes); the first
one's tokenizer and meta are kept.
"""

import argparse
from pathlib import Path

import torch

from ance_core.modeling.model import load_checkpoint, save_checkpoint


def soup(checkpoints: list[Path], out: Path) -> None:
    model, tokenizer, meta = load_checkpoint(checkpoints[0])
    total = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    for path in checkpoints[1:]:
        other, _, other_meta = load_checkpoint(path)
        if other_meta != meta:
            raise SystemExit(f"{path}: its meta differs from {checkpoints[0]}'s ({other_meta} vs {meta})")
        for k, v in other.state_dict().items():
            total[k] += v.detach().float()
    state = model.state_dict()
    model.load_state_dict({k: (v / len(checkpoints)).to(state[k].dtype) for k, v in total.items()})
    save_checkpoint(model, tokenizer, meta, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if len(args.checkpoints) < 2:
        parser.error("a soup needs two checkpoints or more")
    torch.manual_seed(0)
    soup(args.checkpoints, args.out)
    print(f"{len(args.checkpoints)} checkpoints averaged into {args.out}")


if __name__ == "__main__":
    main()
