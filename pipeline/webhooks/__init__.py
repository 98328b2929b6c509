"""Webhooks in: the receiver that verifies and stores each delivery, and the inbox (SQLite
file or PostgreSQL table) that keeps it until a sync covers it."""
