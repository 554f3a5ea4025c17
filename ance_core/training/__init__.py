"""The trainer of ANCE Fig. 2: the NLL loss (eq. 5), optimizers and schedules, the resumable training loop and its
state, and training on N processes (torch.distributed)."""
