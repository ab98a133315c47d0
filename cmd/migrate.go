package onceflowcmd

import (
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/dbx"
)

func (a *app) migrateCmd() *cobra.Command {
	var reset, status bool
	var adminDSN string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "apply the framework's schema migrations, then each plugin's (privileged DSN: db.admin_dsn)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			dsn := a.cfg.DB.AdminDSN
			if adminDSN != "" {
				dsn = adminDSN
			}
			c, err := a.openDB(ctx, dsn, true)
			if err != nil {
				return err
			}
			c.MaxOpenConns = 2
			if err := dbx.EnsureDatabase(ctx, *c); err != nil {
				return err
			}
			db, err := dbx.Open(ctx, *c)
			if err != nil {
				return err
			}
			defer db.Close()
			sets := migrationSets(a.plugins)
			if status {
				lines, err := migrations.Status(ctx, db, sets...)
				if err != nil {
					return err
				}
				for _, l := range lines {
					printf("%s\n", l)
				}
				return nil
			}
			if reset {
				if err := migrations.Reset(ctx, db, sets...); err != nil {
					return err
				}
				printf("migrate: schema dropped\n")
			}
			if err := migrations.Up(ctx, db, sets...); err != nil {
				return err
			}
			printf("migrate: schema up to date (%s)\n", dbx.MaskDSN(dsn))
			return nil
		},
	}
	cmd.Flags().BoolVar(&reset, "reset", false, "roll every migration back first, the plugins' before the framework's (drops the tables: destroys data)")
	cmd.Flags().BoolVar(&status, "status", false, "list applied and pending migrations")
	cmd.Flags().StringVar(&adminDSN, "admin-dsn", "", "privileged DSN (overrides db.admin_dsn)")
	return cmd
}
