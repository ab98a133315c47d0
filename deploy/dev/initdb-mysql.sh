# shellcheck shell=bash
# The mysql container's init script: docker-compose.yml mounts it in /docker-entrypoint-initdb.d
# and deploy/dev in /onceflow-dev, and the image's entrypoint sources it once, on an empty data
# directory, with a server that listens on its socket only. The databases and users of
# services.env, by the SQL scripts/infra.sh runs (sql.sh), for any host ('%': connections from
# the host arrive from the Docker bridge, not from 127.0.0.1).
. /onceflow-dev/services.env
. /onceflow-dev/sql.sh
dev_mysql_sql '%' | MYSQL_PWD="$MYSQL_ROOT_PASSWORD" mysql --protocol=socket -uroot
