"""A run as a whole: its config (composed of every stage's), the named recipes, the results table with the model
chosen on the dev split, and the run's plots."""
