"""Limits and token budgets per key and per user, and usage accounting per reply."""
