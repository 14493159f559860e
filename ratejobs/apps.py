"""Django app configuration for ratejobs."""

from django.apps import AppConfig


class RatejobsConfig(AppConfig):
    name = "ratejobs"
    verbose_name = "Rate jobs"

    def __init__(self, app_name: str, app_module: object) -> None:
        super().__init__(app_name, app_module)
        # Before any model or admin module is imported: some read the settings as they load.
        from ratejobs import conf

        conf.install()

    def ready(self) -> None:
        from ratejobs import checks  # noqa: F401  (registers the system checks)
        from ratejobs.worker import signals

        signals.connect()
