"""URL routes of the project."""

from django.contrib import admin
from django.urls import include, path

from ratejobs.health import health_view
from ratejobs.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("ratejobs.api.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("healthz", health_view, name="health"),
]
