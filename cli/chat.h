/* chat.h: `loom chat MODEL`, a terminal chat against a running server's OpenAI routes
 * (cli/chat.c). */
#pragma once
int chat_main(int argc, char **argv);
