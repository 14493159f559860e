"""URL routes of the project."""

from django.contrib import admin
from django.urls import include, path

from ratejobs.admin.overview import overview_data_view, overview_view
from ratejobs.health import health_view
from ratejobs.login_throttle import ThrottledAdminAuthenticationForm
from ratejobs.metrics import metrics_view

# The admin's sign-in page says how long a locked username or address must wait; the refusal
# itself is the authentication backend's (settings AUTHENTICATION_BACKENDS), for every way in.
admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    # The overview is no model's page: routed ahead of the admin's own, behind its login.
    path(
        "admin/ratejobs/overview/",
        admin.site.admin_view(overview_view),
        name="ratejobs_overview",
    ),
    path(
        "admin/ratejobs/overview/data/",
        admin.site.admin_view(overview_data_view),
        name="ratejobs_overview_data",
    ),
    path("admin/", admin.site.urls),
    path("api/", include("ratejobs.rest.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("healthz", health_view, name="health"),
]
