#!/usr/bin/env bash
# Creates the roles and databases of the compose stack. The postgres image runs the scripts in
# /docker-entrypoint-initdb.d ONCE, when it initialises an empty data volume: changing a password
# here or in the environment later has no effect on an existing volume (use ALTER ROLE).
#
#   role TEMPORAL_DB_USER   owns  temporal, temporal_visibility   (Temporal's stores)
#   role TOOLTRAIL_DB_USER  owns  TOOLTRAIL_DB_NAME               (tooltrail's audit trail)
#
# Each database is closed to PUBLIC, so neither role can connect to the other's databases.
# Temporal's schemas are installed by the temporal service (auto-setup), tooltrail's by the
# migrate service (`tooltrail db upgrade`); this script only creates empty databases.
set -Eeuo pipefail

: "${TEMPORAL_DB_USER:=temporal}"
: "${TEMPORAL_DB_PASSWORD:=temporal}"
: "${TOOLTRAIL_DB_USER:=tooltrail}"
: "${TOOLTRAIL_DB_PASSWORD:=tooltrail}"
: "${TOOLTRAIL_DB_NAME:=tooltrail}"

psql -v ON_ERROR_STOP=1 --no-psqlrc \
    --username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-postgres}" \
    --set=temporal_user="${TEMPORAL_DB_USER}" \
    --set=temporal_password="${TEMPORAL_DB_PASSWORD}" \
    --set=tooltrail_user="${TOOLTRAIL_DB_USER}" \
    --set=tooltrail_password="${TOOLTRAIL_DB_PASSWORD}" \
    --set=tooltrail_db="${TOOLTRAIL_DB_NAME}" <<'EOSQL'
CREATE ROLE :"temporal_user" LOGIN PASSWORD :'temporal_password';
CREATE DATABASE temporal OWNER :"temporal_user";
CREATE DATABASE temporal_visibility OWNER :"temporal_user";

CREATE ROLE :"tooltrail_user" LOGIN PASSWORD :'tooltrail_password';
CREATE DATABASE :"tooltrail_db" OWNER :"tooltrail_user";

REVOKE ALL ON DATABASE temporal, temporal_visibility, :"tooltrail_db" FROM PUBLIC;
EOSQL

echo "tooltrail init: created roles ${TEMPORAL_DB_USER}, ${TOOLTRAIL_DB_USER} and databases" \
    "temporal, temporal_visibility, ${TOOLTRAIL_DB_NAME}"
