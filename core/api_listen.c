/* api_listen.c: the LISTEN thread (see api_listen.h). */
#include "core/api_listen.h"
#include "common/db.h"
#include "common/log.h"
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *conninfo;
    int n;
    api_listen_chan chans[API_LISTEN_MAX_CHANNELS];   /* channel names strdup'ed */
    char *listen_sql[API_LISTEN_MAX_CHANNELS];        /* "LISTEN <channel>" */
} listener;

static PGconn *listen_connect(listener *l) {
    char err[512];
    PGconn *c = db_connect(l->conninfo, 0, err, sizeof err);
    if (!c) return NULL;   /* db_connect said so, once for the process */
    db_setup_stmt setup[API_LISTEN_MAX_CHANNELS];
    for (int i = 0; i < l->n; i++) setup[i] = (db_setup_stmt){l->listen_sql[i], NULL};
    if (db_session_setup(c, setup, l->n, err, sizeof err) < 0) {
        log_warn("listen: LISTEN failed: %s", err);
        db_finish(c);
        return NULL;
    }
    return c;
}

/* Every channel's callback: NULL, or a notification's payload on its channel. */
static void deliver(listener *l, const char *channel, const char *payload) {
    for (int i = 0; i < l->n; i++)
        if (!channel || !strcmp(channel, l->chans[i].channel)) l->chans[i].cb(payload, l->chans[i].arg);
}

static void *listen_main(void *arg) {
    listener *l = arg;
    PGconn *c = NULL;
    int backoff_ms = 100;
    for (;;) {
        if (!c) {
            c = listen_connect(l);
            if (!c) {
                usleep((useconds_t)backoff_ms * 1000);
                if (backoff_ms < 1000) backoff_ms *= 2;   /* parked futures wait for it: retry every second */
                continue;
            }
            backoff_ms = 100;
            deliver(l, NULL, NULL); /* anything sent while we were away is re-checked */
        }
        struct pollfd p = {.fd = PQsocket(c), .events = POLLIN};
        int rc = poll(&p, 1, 1000);
        if (rc < 0 && errno != EINTR) {
            log_warn("listen: poll: %s", strerror(errno));
            continue;
        }
        if (rc > 0 && !PQconsumeInput(c)) {
            log_msg(db_outage_level(), "listen: connection lost: %s", PQerrorMessage(c));
            db_finish(c);
            c = NULL;
            continue;
        }
        if (rc == 0 && PQstatus(c) != CONNECTION_OK) {
            db_finish(c);
            c = NULL;
            continue;
        }
        PGnotify *n;
        while ((n = PQnotifies(c))) {
            deliver(l, n->relname, n->extra);
            PQfreemem(n);
        }
    }
    return NULL;
}

int api_listen_start(const char *conninfo, const api_listen_chan *chans, int n, char *err, size_t errlen) {
    if (n < 1 || n > API_LISTEN_MAX_CHANNELS) {
        snprintf(err, errlen, "the LISTEN thread takes 1 to %d channels, not %d", API_LISTEN_MAX_CHANNELS, n);
        return -1;
    }
    listener *l = calloc(1, sizeof *l);
    if (!l) abort();
    l->conninfo = strdup(conninfo);
    l->n = n;
    for (int i = 0; i < n; i++) {
        l->chans[i] = chans[i];
        l->chans[i].channel = strdup(chans[i].channel);
        size_t len = strlen(chans[i].channel) + 8;
        l->listen_sql[i] = malloc(len);
        if (!l->chans[i].channel || !l->listen_sql[i]) abort();
        snprintf(l->listen_sql[i], len, "LISTEN %s", chans[i].channel);
    }
    if (!l->conninfo) abort();
    pthread_t tid;
    if (pthread_create(&tid, NULL, listen_main, l) != 0) {
        snprintf(err, errlen, "cannot start the LISTEN thread");
        return -1;
    }
    pthread_detach(tid);
    return 0;
}
