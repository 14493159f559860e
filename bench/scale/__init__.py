"""Several hosts on one machine (`make scale`): network namespaces on a bridge for a services
host (PostgreSQL, Redis, the sandbox API), two worker hosts and a web host, one job per row
submitted through the REST API; prints one markdown table, exits 1 when a row fails.

    python -m bench.scale [--calls N] [--only ROW[,ROW...]]
    python -m bench.scale --clean   # the rjs-* namespaces an interrupted run left

Needs root (ip netns), PostgreSQL's binaries, a C compiler (for the skewed clocks), redis-cli
(the Cluster row) and pgbouncer (its rows). Only namespaces named rjs-* and addresses of
198.18.0.0/24 are made, all removed at the end; the root namespace gets no link, address or
route. A row passes when every call has exactly one result, succeeded, the sandbox acted on no
call twice (a fault's row may repeat a request, answered again by its Idempotency-Key), no
request was answered 429 (a fault's row notes them), the web's cache never failed and, in a
row without a fault or a not_before, the sandbox saw the calls at 0.95 of its limit or more.
docs/scaling.md describes the rows and the last table.
"""
