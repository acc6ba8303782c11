"""Database tables (owned by the service backend)."""
