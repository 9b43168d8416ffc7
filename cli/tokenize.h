/* tokenize.h: `loom tokenize`, a model directory's tokenizer and chat template from the
 * command line (cli/tokenize.c). */
#pragma once
int tokenize_main(int argc, char **argv);
