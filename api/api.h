/* api.h: `loom api`, the HTTP front end speaking the Tinker API (spec/tinker-api.md). */
#pragma once

#include "common/config.h"

/* loom api [--db CONNINFO] [--host H] [--port N] [--threads N] [--db-workers N]
 *          [--secret-file PATH] [--max-body-mb 64] [--tls-cert F --tls-key F] [--path-prefix /x] ...
 * (`loom api --help`; settings also from the config file, common/config.h).
 * Prints "LOOM_API_LISTENING port=<n>" on stdout once it accepts connections. */
int api_main(int argc, char **argv);
/* The api's options that `loom up` takes and passes through. */
extern const opt_spec API_TUNING_OPTS[];
