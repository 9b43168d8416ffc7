/* status.h: `loom status`, the operator's view in a terminal (cli/status.c). */
#pragma once
int status_main(int argc, char **argv);
