# shellcheck shell=bash
# The postgres container's init script: docker-compose.yml mounts it in
# /docker-entrypoint-initdb.d and deploy/dev in /onceflow-dev, and the image's entrypoint sources
# it once, on an empty data directory. The roles and databases of services.env, by the SQL
# scripts/infra.sh runs (sql.sh).
. /onceflow-dev/services.env
. /onceflow-dev/sql.sh
dev_pg_sql | psql -v ON_ERROR_STOP=1 -X -q --username "${POSTGRES_USER:-postgres}" --dbname postgres
