/* executor.h: `loom executor --backend NAME --device N`, one process per device. Opens the
 * base model on its backend once, keeps adapters in its adapter store (exe_store.h), runs
 * the cycles the scheduler assigns to it and commits every result of a cycle in one
 * transaction. docs/architecture.md, "The executor". */
#pragma once
int exe_main(int argc, char **argv);
