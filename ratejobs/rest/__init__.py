"""The REST API (Django REST framework): serializers and thin views over services and selectors."""
