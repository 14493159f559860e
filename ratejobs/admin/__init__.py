"""The Django admin: where operators submit jobs and see what the rate limits did to them."""

from django.contrib import admin

from ratejobs.admin import apis, calls, jobs, signing_keys  # noqa: F401  (their import registers the pages)
from ratejobs.admin.lookups import only_shown_filters_everywhere

# ratejobs comes after django.contrib.auth and rest_framework.authtoken in INSTALLED_APPS, so
# their admins are registered by now.
only_shown_filters_everywhere(admin.site)

# An empty field reads as our own cells' empty figures do ("—"), not Django's "-", which beside
# them looks like a minus sign or a different kind of nothing.
admin.site.empty_value_display = "—"
