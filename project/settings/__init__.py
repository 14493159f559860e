"""Settings per environment: base (development defaults), test and production."""
