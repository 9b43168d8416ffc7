/* up.h: `loom up`, the one-machine deployment: embedded PostgreSQL, api, scheduler and
 * one CPU executor as supervised child processes. */
#pragma once
int up_main(int argc, char **argv);
