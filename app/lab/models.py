"""Lab result cache table (owned by the lambda lab)."""
