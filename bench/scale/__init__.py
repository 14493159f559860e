"""Several hosts on one machine (`make scale`): network namespaces on a bridge for a services
host (PostgreSQL, Redis, the sandbox API), two worker hosts and a web host, one job per row
submitted through the REST API; prints one markdown table, exits 1 when a row fails.

    python -m bench.scale [--calls N] [--only ROW[,ROW...]]
    python -m bench.scale --clean   # the rjs-* namespaces an interrupted run left

Needs root (ip netns), PostgreSQL's binaries and a C compiler (for the skewed clocks). Only
namespaces named rjs-* and addresses of 198.18.0.0/24 are made, all removed at the end; the
root namespace gets no link, address or route. A row passes when no request was answered 429,
the sandbox saw the calls at 0.95 of its limit or more, no call arrived twice and every call
has exactly one result, succeeded. docs/scaling.md describes the rows and the last table.
"""
