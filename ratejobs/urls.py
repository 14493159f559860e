"""ratejobs' routes, to include under any prefix (docs/install.md): the REST API, the overview
(an admin page: behind the admin's sign-in), /metrics and /healthz. The models' own admin pages
come with the admin site the project already has."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from ratejobs.admin.overview import overview_data_view, overview_view
from ratejobs.health import health_view
from ratejobs.metrics import metrics_view

urlpatterns = [
    # The prefix itself leads to the console (Django's "View site" link points here too).
    path(
        "",
        RedirectView.as_view(pattern_name="ratejobs_overview", http_method_names=["get", "head"]),
        name="ratejobs_home",
    ),
    path("overview/", admin.site.admin_view(overview_view), name="ratejobs_overview"),
    path(
        "overview/data/",
        admin.site.admin_view(overview_data_view),
        name="ratejobs_overview_data",
    ),
    path("api/", include("ratejobs.rest.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("healthz", health_view, name="health"),
]
