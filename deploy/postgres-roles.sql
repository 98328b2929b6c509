-- Least-privilege PostgreSQL roles for a changewatch deployment (README: "Deploy on several
-- processes"). Run once, as a superuser, with psql (it uses psql variables and \gexec):
--
--   psql -v owner_password="$CHANGEWATCH_DB_PASSWORD" \
--        -v reader_password="$CHANGEWATCH_READER_PASSWORD" -f deploy/postgres-roles.sql
--
-- Neither role is a superuser, so neither can read server files (pg_read_file, COPY ... TO a
-- file), run programs (COPY ... TO PROGRAM), read pg_authid, CHECKPOINT or end another role's
-- sessions, whatever SQL reaches the server.
--   owner  (default changewatch): owns the warehouse schema and Dagster's database; the code
--          server, the daemon and every run connect as it.
--   reader (default changewatch_reader): may only read the warehouse schema, read-only
--          transactions, 60 s per statement, 1 GB of temporary files; for `changewatch sql`.
-- Other names: -v owner=... -v reader=... -v warehouse_db=... -v dagster_db=... -v schema=...
-- Running it again changes nothing but the passwords.

\set ON_ERROR_STOP on
\if :{?owner}
\else
  \set owner changewatch
\endif
\if :{?reader}
\else
  \set reader changewatch_reader
\endif
\if :{?warehouse_db}
\else
  \set warehouse_db changewatch
\endif
\if :{?dagster_db}
\else
  \set dagster_db dagster
\endif
\if :{?schema}
\else
  \set schema warehouse
\endif
\if :{?owner_password}
\else
  \set owner_password ''
\endif
\if :{?reader_password}
\else
  \set reader_password ''
\endif
SELECT :'owner_password' = '' OR :'reader_password' = '' AS no_password \gset
\if :no_password
  -- Stops here, with exit status 3 (ON_ERROR_STOP).
  DO $$ BEGIN RAISE EXCEPTION 'give both roles a password: psql -v owner_password=... -v reader_password=...'; END $$;
\endif

-- The roles: log in, nothing more (these are PostgreSQL's defaults, spelled out).
SELECT format('CREATE ROLE %I', name) FROM (VALUES (:'owner'), (:'reader')) AS r(name)
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = name) \gexec
ALTER ROLE :"owner" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD :'owner_password';
ALTER ROLE :"reader" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD :'reader_password';
-- The reader's session defaults, for any client: `changewatch sql` sets its own timeout too.
ALTER ROLE :"reader" SET default_transaction_read_only = on;
ALTER ROLE :"reader" SET statement_timeout = '60s';
ALTER ROLE :"reader" SET idle_in_transaction_session_timeout = '60s';
-- A runaway query spills to temporary files; only a superuser may set this bound.
ALTER ROLE :"reader" SET temp_file_limit = '1GB';

-- Dagster's runs, event logs and schedules: its own database, which the owner owns.
SELECT format('CREATE DATABASE %I OWNER %I', :'dagster_db', :'owner')
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'dagster_db') \gexec
REVOKE ALL ON DATABASE :"dagster_db" FROM PUBLIC;

-- The warehouse database: the owner connects, creates its schema's objects and temporary
-- tables (a sync stages frames in them); the reader only connects.
SELECT format('CREATE DATABASE %I', :'warehouse_db')
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'warehouse_db') \gexec
REVOKE ALL ON DATABASE :"warehouse_db" FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE :"warehouse_db" TO :"owner";
-- CREATE SCHEMA IF NOT EXISTS (run at every connection) checks this right first.
GRANT CREATE ON DATABASE :"warehouse_db" TO :"owner";
GRANT CONNECT ON DATABASE :"warehouse_db" TO :"reader";

\connect :"warehouse_db"
CREATE SCHEMA IF NOT EXISTS :"schema" AUTHORIZATION :"owner";
REVOKE ALL ON SCHEMA :"schema" FROM PUBLIC;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA :"schema" TO :"reader";
GRANT SELECT ON ALL TABLES IN SCHEMA :"schema" TO :"reader";
-- Tables and views the owner creates later (each new source's table and change log).
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA :"schema" GRANT SELECT ON TABLES TO :"reader";
