"""A trained checkpoint outside the pipeline: `Encoder` for Python code, and `ance export` to a sentence-transformers
model folder with a model card."""
