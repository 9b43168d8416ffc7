/* chat.c — `loom chat MODEL`: a terminal chat with a model of a running Loom server, for a
 * quick look at a checkpoint. Each line typed is a user message; the whole conversation
 * goes to POST /v1/chat/completions (docs/protocol.md §18) with stream=true, and the
 * answer is printed as its tokens arrive. /reset forgets the conversation, /quit (or end
 * of input) ends. Works on a pipe too: one user message per line, answers on stdout.
 *
 * HTTP with libcurl (streamed bodies, TLS, proxies: a well-kept library rather than a
 * client of our own); the server-sent events are split here (data: lines). */
#include "cli/chat.h"
#include "common/config.h"
#include "common/strbuf.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const opt_spec CHAT_OPTS[] = {
    {.name = "url", .kind = OPT_STR, .arg = "URL", .def = "http://127.0.0.1:8000", .env = "TINKER_BASE_URL",
     .help = "the server (what `loom up` prints as TINKER_BASE_URL)"},
    {.name = "api-key", .kind = OPT_STR, .arg = "KEY", .env = "TINKER_API_KEY",
     .help = "an API key with the sample scope (what `loom up` prints as TINKER_API_KEY)"},
    {.name = "system", .kind = OPT_STR, .arg = "TEXT", .help = "a system message that opens the conversation"},
    {.name = "max-tokens", .kind = OPT_INT, .arg = "N", .def = "512", .lo = 1, .hi = 1 << 24,
     .help = "the longest answer, in tokens"},
    {.name = "temperature", .kind = OPT_STR, .arg = "X", .def = "0.7", .help = "sampling temperature (0: greedy)"},
    {.name = "seed", .kind = OPT_INT, .arg = "N", .lo = 0, .hi = 1L << 48, .help = "a seed, for answers that repeat"},
    {0}};

static const cfg_cmd CHAT_CMD = {
    .cmd = "loom chat", .synopsis = "MODEL [options]",
    .about = "A terminal chat with MODEL (a base model, a tinker://.../sampler_weights/... checkpoint or an\n"
             "alias; `curl $TINKER_BASE_URL/v1/models` lists them) on a running server. Type a message and\n"
             "press Enter; /reset starts over, /quit (or Ctrl-D) ends.",
    .tables = {CHAT_OPTS}, .min_pos = 1, .max_pos = 1, .pos_name = "MODEL"};

typedef struct {
    strbuf line;       /* the SSE line being received */
    strbuf answer;     /* the assistant's text so far */
    strbuf body;       /* a non-200 answer */
    bool failed;       /* an error event arrived */
} chat_rx;

/* One "data: ..." line of the stream: print the delta, remember the answer. */
static void on_event(chat_rx *rx, const char *data) {
    if (!strcmp(data, "[DONE]")) return;
    json_error_t je;
    json_t *o = json_loads(data, 0, &je);
    const char *err = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
    if (err) {
        fprintf(stderr, "\nloom chat: %s\n", err);
        rx->failed = true;
    }
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    const char *t = json_string_value(json_object_get(json_object_get(c, "delta"), "content"));
    if (t && *t) {
        fputs(t, stdout);
        fflush(stdout);
        sb_puts(&rx->answer, t);
    }
    json_decref(o);
}

static size_t on_data(char *p, size_t size, size_t n, void *arg) {
    chat_rx *rx = arg;
    size_t len = size * n;
    for (size_t i = 0; i < len; i++) {
        if (p[i] != '\n') {
            sb_putc(&rx->line, p[i]);
            continue;
        }
        if (rx->line.len && rx->line.data[rx->line.len - 1] == '\r') rx->line.data[--rx->line.len] = 0;
        if (rx->line.len >= 5 && !memcmp(rx->line.data, "data:", 5))
            on_event(rx, rx->line.data + 5 + (rx->line.len > 5 && rx->line.data[5] == ' '));
        else if (rx->line.len && rx->line.data[0] != ':')
            sb_append(&rx->body, rx->line.data, rx->line.len);
        rx->line.len = 0;
        if (rx->line.data) rx->line.data[0] = 0;
    }
    return len;
}

/* Sends the conversation; prints and returns the answer (malloc'd), or NULL. */
static char *ask(const cfg *o, CURL *curl, json_t *messages, double temperature) {
    const char *model = o->pos[0];
    json_t *req = json_pack("{s:s, s:O, s:b, s:I, s:f}", "model", model, "messages", messages, "stream", 1,
                            "max_tokens", (json_int_t)cfg_int(o, "max-tokens"), "temperature", temperature);
    if (cfg_str(o, "seed")) json_object_set_new(req, "seed", json_integer(cfg_int(o, "seed")));
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    char url[4200], auth[600];
    snprintf(url, sizeof url, "%s/v1/chat/completions", cfg_str(o, "url"));
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", cfg_str(o, "api-key") ? cfg_str(o, "api-key") : "");
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, auth);
    chat_rx rx = {0};
    sb_init(&rx.line, 256);
    sb_init(&rx.answer, 256);
    sb_init(&rx.body, 256);
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &rx);
    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    free(body);
    if (rx.line.len) on_data("\n", 1, 1, &rx);   /* a body without a final newline */
    char *answer = NULL;
    if (rc != CURLE_OK) {
        fprintf(stderr, "loom chat: %s: %s\n", url, curl_easy_strerror(rc));
    } else if (status != 200) {
        json_error_t je;
        json_t *e = json_loadb(rx.body.data ? rx.body.data : "", rx.body.len, 0, &je);
        const char *msg = json_string_value(json_object_get(json_object_get(e, "error"), "message"));
        fprintf(stderr, "loom chat: HTTP %ld: %s\n", status, msg ? msg : rx.body.data ? rx.body.data : "");
        json_decref(e);
    } else if (!rx.failed) {
        fputc('\n', stdout);
        answer = sb_steal(&rx.answer, NULL);
        if (!answer) answer = strdup("");
    }
    sb_free(&rx.line);
    sb_free(&rx.answer);
    sb_free(&rx.body);
    return answer;
}

int chat_main(int argc, char **argv) {
    cfg o;
    int rc;
    if (!cfg_parse(&CHAT_CMD, argc, argv, &o, &rc)) return rc;
    char *end;
    double temp = strtod(cfg_str(&o, "temperature"), &end);
    if (*end || !(temp >= 0)) return cfg_usage_error(&CHAT_CMD, "--temperature must be a number >= 0");
    if (!cfg_str(&o, "api-key"))
        return cfg_usage_error(&CHAT_CMD, "give an API key: --api-key KEY or TINKER_API_KEY (`loom up` prints one)");
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *curl = curl_easy_init();
    json_t *messages = json_array();
    if (cfg_str(&o, "system"))
        json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "system", "content", cfg_str(&o, "system")));
    bool tty = isatty(0);
    if (tty) printf("loom chat with %s at %s; /reset starts over, /quit ends\n", o.pos[0], cfg_str(&o, "url"));
    char *line = NULL;
    size_t cap = 0;
    int status = 0;
    for (;;) {
        if (tty) fputs("\nyou> ", stdout), fflush(stdout);
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!n) continue;
        if (!strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(messages);
            if (cfg_str(&o, "system"))
                json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "system", "content", cfg_str(&o, "system")));
            if (tty) puts("(a new conversation)");
            continue;
        }
        json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "user", "content", line));
        if (tty) fputs("\nassistant> ", stdout), fflush(stdout);
        char *answer = ask(&o, curl, messages, temp);
        if (!answer) {
            json_array_remove(messages, json_array_size(messages) - 1);   /* try again with the next line */
            status = 1;
            if (!tty) break;
            continue;
        }
        json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "assistant", "content", answer));
        free(answer);
    }
    free(line);
    json_decref(messages);
    curl_easy_cleanup(curl);
    curl_global_cleanup();
    return status;
}
