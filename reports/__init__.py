"""Compliance reports: the result model, and its renderings."""
