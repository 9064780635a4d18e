"""Operators' view of the prefix cache: admin dashboard, history samples, /metrics, health."""
