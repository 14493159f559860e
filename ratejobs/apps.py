"""Django app configuration for ratejobs."""

from django.apps import AppConfig


class RatejobsConfig(AppConfig):
    name = "ratejobs"
    verbose_name = "Rate jobs"
