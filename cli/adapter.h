/* adapter.h: `loom adapter ...`, the operator's view of the registry (cli/adapter.c). */
#pragma once
int adapter_cli_main(int argc, char **argv);
