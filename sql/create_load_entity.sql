-- PostgreSQL only. The table a first sync bulk loads a source's rows into, on a second
-- connection, before it takes the source table's place (see PostgresWarehouse.bulk_load_aside):
-- the source table's columns, defaults, checks and storage, and no index, so the COPY writes
-- the heap alone and the primary key is built after it from one sort.
CREATE TABLE {stage} (
    LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION
)
