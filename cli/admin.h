/* admin.h: operator commands that talk to the database directly. */
#pragma once
int admin_migrate_main(int argc, char **argv);
int admin_tenant_main(int argc, char **argv);
int admin_key_main(int argc, char **argv);
int admin_pg_main(int argc, char **argv);
int admin_config_main(int argc, char **argv);
/* `loom executor drain|undrain`, else `loom executor` itself (pool.c). */
int pool_executor_main(int argc, char **argv);
/* `loom usage`, and `loom tenant set-limits` (usage.c). */
int usage_main(int argc, char **argv);
#include "common/config.h"
extern const cfg_cmd TENANT_SET_LIMITS;
int tenant_set_limits(const cfg *o);
