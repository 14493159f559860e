"""What every layer stands on and no business rule: the connection to Redis, the shared limiter
objects per API, and the database's clock. Services, selectors and the worker import it; it
imports none of them."""
