/* api.h: `loom api`, the HTTP front end speaking the Tinker API (spec/tinker-api.md). */
#pragma once

/* loom api --db CONNINFO [--host H] [--port N] [--threads N] [--db-workers N]
 *          --secret-file PATH [--max-body-mb 64] [--tls-cert F --tls-key F] [--path-prefix /x]
 * Prints "LOOM_API_LISTENING port=<n>" on stdout once it accepts connections. */
int api_main(int argc, char **argv);
