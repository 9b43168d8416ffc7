/* api_listen.h: one thread per api process with its own PostgreSQL connection that
 * LISTENs on a few channels (api_main.c: loom_op_done, which wakes parked futures; the
 * OpenAI routes' progress; loom_api_keys, which empties the key cache of api_auth.h) and
 * hands each notification's payload to its channel's callback. One connection for all:
 * PostgreSQL wakes every listening connection of the database on every NOTIFY, whatever
 * its channel. NOTIFY is only a wake-up hint: after a (re)connect every callback gets
 * NULL, meaning "notifications may have been missed, re-check everything". */
#pragma once
#include <stddef.h>

typedef void (*api_listen_cb)(const char *payload, void *arg);

typedef struct {
    const char *channel;   /* a NOTIFY channel (contract/contract.h CHAN_*) */
    api_listen_cb cb;
    void *arg;
} api_listen_chan;

#define API_LISTEN_MAX_CHANNELS 8

/* Starts the thread (the n channels are copied); it reconnects forever. Returns 0 or -1
 * with err. */
int api_listen_start(const char *conninfo, const api_listen_chan *chans, int n, char *err, size_t errlen);
