/* admin.h: operator commands that talk to the database directly. */
#pragma once
int admin_migrate_main(int argc, char **argv);
int admin_tenant_main(int argc, char **argv);
int admin_key_main(int argc, char **argv);
/* Resolves --db, else DATABASE_URL. NULL if neither. */
const char *admin_conninfo(int argc, char **argv);
