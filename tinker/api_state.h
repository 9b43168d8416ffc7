/* api_state.h: what the api process holds for all its routes, set up once by `loom api`
 * (api/api_main.c) before it serves, and only read after that: the server secret that
 * signs links (archive downloads, adapter uploads), the registry blob store, and the
 * base models' tokenizers (the OpenAI routes', the console's playground). */
#pragma once
#include "core/api_call.h"
#include "registry/blobstore.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include <stddef.h>
#include <stdint.h>

/* Once, before serving: the server secret signs download and upload links; blob_dir (may
 * be NULL: archives then answer 503) is the registry blob store. 0, or -1 with err. */
int api_state_init(const unsigned char secret[32], const char *blob_dir, char *err, size_t errlen);
/* The registry blob store (NULL without --blob-dir) and the server secret that signs links
 * (NULL before api_state_init). */
blobstore *api_blobs(void);
const unsigned char *api_link_secret(void);

/* A base model's tokenizer and chat template, as the api reads them from the directory the
 * executor registered (base_models.path). Loaded on first use, once per base model, and
 * kept: both are read-only after loading, so worker threads and event loops share them. */
typedef struct {
    char name[256];
    tokenizer *tok;
    chat_template *chat;   /* NULL: the model has none */
    /* Where an answer to a chat-template prompt ends: the token the template writes after
     * an assistant's message (ChatML's <|im_end|>, Llama 3's <|eot_id|>) and the
     * template's eos_token, when they are tokens of the vocabulary. */
    int32_t turn_end[2];
    int n_turn_end;
} api_tokenizer;

/* The entry for base_model, loading it on first use. NULL with the error answered (404
 * for a base model not served here, 503 when its tokenizer cannot be read). */
const api_tokenizer *api_tokenizer_for(api_call *c, const char *base_model);
