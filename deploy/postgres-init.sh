#!/bin/sh
# The postgres image runs this once, on an empty data volume (/docker-entrypoint-initdb.d):
# the least-privilege roles of deploy/postgres-roles.sql, their passwords from the environment.
set -eu
psql -X -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v owner_password="$CHANGEWATCH_DB_PASSWORD" \
  -v reader_password="$CHANGEWATCH_READER_PASSWORD" \
  -f /opt/changewatch/postgres-roles.sql
