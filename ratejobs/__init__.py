"""ratejobs: large batches of outbound HTTP calls against rate-limited third-party APIs."""
