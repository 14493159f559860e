"""A worker process's machinery: the engine (heartbeats, sweeps and the pool of threads that
sends calls), dispatch (feeding the broker from the database) and reconcile (beat's repairs).
The tasks run it; the services hold the business rules it applies and never import it."""
