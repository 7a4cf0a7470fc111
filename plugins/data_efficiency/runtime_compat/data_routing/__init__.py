"""Upstream path of random-LTD."""
