"""The BERT-Siamese model (ANCE eq. 1-3): a shared encoder, pooling, a Linear + LayerNorm head, dot product; its
checkpoints (a Hugging Face folder plus the head and `ance_model.json`), devices and precision."""
