"""What every layer stands on and no business rule: the connection to Redis, the shared limiter
objects per API, the database's clock, the worker processes' heartbeats and the messages that
wake the dispatcher. Services, selectors and the worker import it; it imports none of them."""
