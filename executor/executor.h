/* executor.h: `loom executor`, one process per device. Loads the base model once,
 * keeps each model's LoRA adapter (weights + AdamW state) in memory, runs the cycles
 * the scheduler assigns to it and commits every result of a cycle in one transaction. */
#pragma once
int exe_main(int argc, char **argv);
