"""The SQLite backend: one file, FTS5 and sqlite-vec (the default store)."""
