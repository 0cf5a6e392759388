"""Serving the app: the model registry, hosting limits, and the session every request goes through."""
