"""The rest of verl 0.9.1's estimator registry (filled in below)."""
