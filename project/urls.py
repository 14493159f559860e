"""URL routes of the project: the admin, and ratejobs' own routes at the root, as a host
project would include them under a prefix of its choice (docs/install.md)."""

from django.contrib import admin
from django.urls import include, path

from ratejobs.login_throttle import ThrottledAdminAuthenticationForm

# The admin's sign-in page says how long a locked username or address must wait; the refusal
# itself is the authentication backend's (settings AUTHENTICATION_BACKENDS), for every way in.
admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("ratejobs.urls")),
]
