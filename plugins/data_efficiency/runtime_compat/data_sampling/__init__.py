"""Upstream path of the data-sampling modules."""
