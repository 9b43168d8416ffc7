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
    char *listen_sql;
    api_listen_cb cb;
    void *arg;
} listener;

static PGconn *listen_connect(listener *l) {
    char err[512];
    PGconn *c = db_connect(l->conninfo, 0, err, sizeof err);
    if (!c) return NULL;   /* db_connect said so, once for the process */
    db_setup_stmt setup[1] = {{l->listen_sql, NULL}};
    if (db_session_setup(c, setup, 1, err, sizeof err) < 0) {
        log_warn("listen: %s failed: %s", l->listen_sql, err);
        db_finish(c);
        return NULL;
    }
    return c;
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
            l->cb(NULL, l->arg); /* anything sent while we were away is re-checked */
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
            l->cb(n->extra, l->arg);
            PQfreemem(n);
        }
    }
    return NULL;
}

int api_listen_start(const char *conninfo, const char *listen_sql, api_listen_cb cb, void *arg,
                     char *err, size_t errlen) {
    listener *l = calloc(1, sizeof *l);
    if (!l) abort();
    l->conninfo = strdup(conninfo);
    l->listen_sql = strdup(listen_sql);
    l->cb = cb;
    l->arg = arg;
    pthread_t tid;
    if (pthread_create(&tid, NULL, listen_main, l) != 0) {
        snprintf(err, errlen, "cannot start the LISTEN thread");
        return -1;
    }
    pthread_detach(tid);
    return 0;
}
