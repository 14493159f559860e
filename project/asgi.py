"""ASGI entry point for application servers.

Set DJANGO_SETTINGS_MODULE=project.settings.production (the Docker image does): importing this
module first runs the `project` package, whose Celery app defaults to the development settings
when nothing is set.
"""

from django.core.asgi import get_asgi_application

application = get_asgi_application()
