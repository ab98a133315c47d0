# shellcheck shell=bash
# The SQL that sets up the development databases and users of deploy/dev/services.env, written
# once: scripts/infra.sh runs it on MariaDB (the single node and the Galera cluster) and on
# PostgreSQL, and docker-compose.yml's containers run it from their init scripts
# (deploy/dev/initdb-*.sh). Source services.env first; these functions only print SQL.

# dev_sql_db_pattern NAME: NAME as a database pattern of GRANT, '_' escaped so that it matches
# only itself ('_' and '%' are wildcards there); a trailing '%' stays a wildcard.
dev_sql_db_pattern() {
  local p="${1//_/\\_}"
  echo "$p"
}

# dev_mysql_sql HOST...: MariaDB/MySQL. The databases DEV_DATABASES, and the users, each for
# every HOST, with only what it uses:
#   admin     `router migrate` and the tests' fixtures: DEV_ADMIN_PRIVILEGES on each of
#             DEV_NAMED_DATABASES and on the grants' test pattern, and GRANT OPTION there,
#             with which `router migrate` grants the application user (on the test
#             databases too, where the tests run `router migrate`); on the test pattern
#             DEV_ADMIN_TEST_PRIVILEGES besides
#   app       the application: nothing on the named databases (`router migrate` grants it
#             its tables, the migrations' grants.txt); DEV_APP_TEST_PRIVILEGES on the
#             throw-away test databases as a whole (tests create tables of their own there)
#   TLS       REQUIRE SSL (refused without TLS); the application user's grants
#   monitor   DEV_MONITOR_PRIVILEGES only
# Each run re-sets the passwords and revokes what the admin, TLS and monitor users have
# before granting the list again; the application user keeps its table grants (`router
# migrate` made them) and loses every global one.
dev_mysql_sql() {
  local d h pat pats=() names test_pat grants_pat
  read -r -a names <<<"$DEV_DATABASES"
  for d in "${names[@]}"; do
    echo "CREATE DATABASE IF NOT EXISTS \`$d\` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;"
  done
  read -r -a names <<<"$DEV_NAMED_DATABASES"
  for d in "${names[@]}"; do pats+=("$(dev_sql_db_pattern "$d")"); done
  test_pat="$(dev_sql_db_pattern "$DEV_TEST_DATABASES")"
  grants_pat="$(dev_sql_db_pattern "$DEV_GRANTS_TEST_DATABASES")"
  for h in "$@"; do
    cat <<SQL
CREATE USER IF NOT EXISTS '$DEV_ADMIN_USER'@'$h' IDENTIFIED BY '$DEV_ADMIN_PASSWORD';
ALTER USER '$DEV_ADMIN_USER'@'$h' IDENTIFIED BY '$DEV_ADMIN_PASSWORD';
REVOKE ALL PRIVILEGES, GRANT OPTION FROM '$DEV_ADMIN_USER'@'$h';
CREATE USER IF NOT EXISTS '$DEV_APP_USER'@'$h' IDENTIFIED BY '$DEV_APP_PASSWORD';
ALTER USER '$DEV_APP_USER'@'$h' IDENTIFIED BY '$DEV_APP_PASSWORD';
REVOKE ALL PRIVILEGES ON *.* FROM '$DEV_APP_USER'@'$h';
CREATE USER IF NOT EXISTS '$DEV_TLS_USER'@'$h' IDENTIFIED BY '$DEV_TLS_PASSWORD' REQUIRE SSL;
ALTER USER '$DEV_TLS_USER'@'$h' IDENTIFIED BY '$DEV_TLS_PASSWORD' REQUIRE SSL;
REVOKE ALL PRIVILEGES, GRANT OPTION FROM '$DEV_TLS_USER'@'$h';
CREATE USER IF NOT EXISTS '$DEV_MONITOR_USER'@'$h' IDENTIFIED BY '$DEV_MONITOR_PASSWORD';
ALTER USER '$DEV_MONITOR_USER'@'$h' IDENTIFIED BY '$DEV_MONITOR_PASSWORD';
REVOKE ALL PRIVILEGES, GRANT OPTION FROM '$DEV_MONITOR_USER'@'$h';
GRANT $DEV_MONITOR_PRIVILEGES ON *.* TO '$DEV_MONITOR_USER'@'$h';
SQL
    for pat in "${pats[@]}" "$grants_pat"; do
      echo "GRANT $DEV_ADMIN_PRIVILEGES ON \`$pat\`.* TO '$DEV_ADMIN_USER'@'$h' WITH GRANT OPTION;"
    done
    cat <<SQL
GRANT $DEV_ADMIN_PRIVILEGES, $DEV_ADMIN_TEST_PRIVILEGES ON \`$test_pat\`.* TO '$DEV_ADMIN_USER'@'$h' WITH GRANT OPTION;
GRANT $DEV_APP_TEST_PRIVILEGES ON \`$test_pat\`.* TO '$DEV_APP_USER'@'$h';
GRANT $DEV_APP_TEST_PRIVILEGES ON \`$test_pat\`.* TO '$DEV_TLS_USER'@'$h';
SQL
  done
}

# dev_pg_sql: PostgreSQL, a psql script. The admin and application roles (created when
# missing; attributes, passwords and the admin's role memberships set on every run), and the
# databases DEV_NAMED_DATABASES, owned by the admin, created when missing.
dev_pg_sql() {
  local d names
  cat <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$DEV_ADMIN_USER') THEN CREATE ROLE $DEV_ADMIN_USER; END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$DEV_APP_USER') THEN CREATE ROLE $DEV_APP_USER; END IF;
END \$\$;
ALTER ROLE $DEV_ADMIN_USER $DEV_PG_ADMIN_ATTRIBUTES PASSWORD '$DEV_ADMIN_PASSWORD';
ALTER ROLE $DEV_APP_USER $DEV_PG_APP_ATTRIBUTES PASSWORD '$DEV_APP_PASSWORD';
GRANT ${DEV_PG_ADMIN_ROLES// /, } TO $DEV_ADMIN_USER;
SQL
  read -r -a names <<<"$DEV_NAMED_DATABASES"
  for d in "${names[@]}"; do
    echo "SELECT 'CREATE DATABASE $d OWNER $DEV_ADMIN_USER' WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = '$d')"
    echo '\gexec'
  done
}
