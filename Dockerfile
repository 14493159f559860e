# The ratejobs image: web (gunicorn), Celery worker, beat, Flower and the sandbox all run it,
# with different commands (docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Requirements first: code changes then rebuild only the layers below.
COPY requirements.txt ./
RUN pip install -r requirements.txt

COPY manage.py ./
COPY project ./project
COPY ratejobs ./ratejobs
# The sandbox API, for the demo profile of docker-compose.yml (`python -m sandbox`).
COPY sandbox ./sandbox

# Static files are collected into the image and served by whitenoise; the key is a
# placeholder that exists only for this build step.
RUN DJANGO_SETTINGS_MODULE=project.settings.production \
    DJANGO_SECRET_KEY=collectstatic-only DJANGO_ALLOWED_HOSTS=localhost \
    python manage.py collectstatic --noinput

RUN useradd --system --uid 10001 --home-dir /app ratejobs
USER ratejobs

ENV DJANGO_SETTINGS_MODULE=project.settings.production
EXPOSE 8000
# Threads (gthread): a download read slowly holds a thread, not a whole worker process, so three
# slow clients do not stop everyone else (docs/benchmarks.md, "slow downloads"); docker-compose.yml
# runs the same command.
CMD ["gunicorn", "project.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--worker-class", "gthread", "--threads", "4", "--timeout", "600", "--access-logfile", "-"]
