"""Embedding compression (ConAE, paper 002): the ConAE encoders and decoder and their losses, and the PCA and
truncation baselines, as projectors a checkpoint can carry."""
