"""Hard negatives: the sampler registry (ANCE, SimANS, BM25, ...), mining from a ranking (ANCE eq. 10), the async
trainer's refreshed negatives and their staleness, and the statistics of what a model trained on."""
