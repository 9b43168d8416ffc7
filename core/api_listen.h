/* api_listen.h: one thread per api process with its own PostgreSQL connection that
 * LISTENs (listen_sql: api_main.c starts one for loom_op_done, SQL_LISTEN_OP_DONE of
 * tinker/api_sql.h, and one for the OpenAI routes' progress) and hands each
 * notification's payload to a callback (the event loops' fan-out). NOTIFY is only a wake-up hint: after a reconnect the callback gets
 * NULL, meaning "notifications may have been missed, re-check everything". */
#pragma once
#include <stddef.h>

typedef void (*api_listen_cb)(const char *payload, void *arg);

/* Starts the thread; it reconnects forever. Returns 0 or -1 with err. */
int api_listen_start(const char *conninfo, const char *listen_sql, api_listen_cb cb, void *arg,
                     char *err, size_t errlen);
