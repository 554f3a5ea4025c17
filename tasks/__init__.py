"""One thin Prefect task per pipeline stage: resolve inputs, call ance_core, return a small ArtifactRef."""
