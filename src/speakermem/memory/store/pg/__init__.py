"""The PostgreSQL backend (issue 13): the same store API on PostgreSQL + pgvector.

Selected by `StoreConfig.db_url` (SPEAKERMEM_DB_URL=postgresql://...). Importing this
package needs nothing; `memory.store.pg.store` needs psycopg (the 'postgres' extra).
"""
