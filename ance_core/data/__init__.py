"""The collection: BEIR and MS MARCO loaders with their validation, the parquet tables the stages read, and the dev
split carved from the training queries (with the grades that count as training positives)."""
