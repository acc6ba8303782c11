"""Importing this module registers every built-in estimator (see registry.py)."""
