#!/usr/bin/env bash
# Local demo: migrate, find or start a Redis, run the web server and one Celery worker until
# Ctrl-C, then stop them (and the Redis, if this started it).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
WEB_HOST="${WEB_HOST:-0.0.0.0}"
WEB_PORT="${WEB_PORT:-8000}"

REDIS_URL="$($PY -m ratejobs.devredis ensure)"
export REDIS_URL
echo "Redis: $REDIS_URL"
$PY manage.py migrate --noinput

pids=()
cleanup() {
    trap - EXIT INT TERM
    kill "${pids[@]}" 2>/dev/null || true
    wait || true
    $PY -m ratejobs.devredis stop
}
trap cleanup EXIT
trap 'exit 130' INT TERM

$PY manage.py runserver "$WEB_HOST:$WEB_PORT" &
pids+=($!)
.venv/bin/celery -A project worker --loglevel=info --concurrency=2 &
pids+=($!)
echo "Web: http://$WEB_HOST:$WEB_PORT/admin/ (Ctrl-C stops everything)"
wait -n
