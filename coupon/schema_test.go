package coupon_test

import (
	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/migrations"
)

// couponSchema is the plugin's migrations, applied by testenv.DB after the framework's.
var couponSchema = migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations}
