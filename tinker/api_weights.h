/* api_weights.h: checkpoint routes — save_weights, the named save_weights_for_sampler,
 * load_weights, weights_info (docs/protocol.md §7.6, §7.7, §12.2), the checkpoint REST routes of §12.2
 * (list, delete, publish, ttl, archive) and the signed archive download (§12.3, §17.7).
 *
 * Routing: api/api_routes.c registers these handlers. POST /save_weights_for_sampler belongs
 * to the sampling routes; their handler calls api_weights_save_for_sampler_named when
 * the body has a "path" (the named form saves a registry checkpoint). */
#pragma once
#include "model/lora.h"
#include "registry/blobstore.h"
#include "core/api_call.h"
#include <jansson.h>
#include <stdint.h>

/* Adds to obj what an adapter of config lc on the base model whose config.json is
 * config_text holds (docs/protocol.md §7.2): "lora_parameters" and "adapter_bytes" (fp32
 * weights, gradients and AdamW moments of a trainable one). Nothing when the config does
 * not parse. */
void api_adapter_size_json(json_t *obj, const char *config_text, const lora_config *lc);

/* POST /api/v1/save_weights_for_sampler with "path" (named form). */
int api_weights_save_for_sampler_named(api_call *c);

int api_h_save_weights(api_call *c);                /* POST /save_weights */
int api_h_save_weights_external(api_call *c);       /* POST /save_weights_external (§7.9) */
int api_h_load_weights(api_call *c);                /* POST /load_weights */
int api_h_weights_info(api_call *c);                /* POST /weights_info */
int api_h_list_checkpoints(api_call *c);            /* GET /checkpoints */
int api_h_search_checkpoints(api_call *c);          /* POST /checkpoints/search (SDK 0.39) */
/* /training_runs/{run}/checkpoints[/{kind}/{name}[/publish|/ttl|/archive|/external_weights_urls]] */
int api_h_run_checkpoints_get(api_call *c);         /* GET: list, archive */
int api_h_run_checkpoints_post(api_call *c);        /* POST .../publish */
int api_h_run_checkpoints_put(api_call *c);         /* PUT .../ttl */
int api_h_run_checkpoints_delete(api_call *c);      /* DELETE checkpoint, DELETE .../publish */
int api_h_models_checkpoints(api_call *c);          /* GET /models/{run}/checkpoints (old SDKs) */
int api_h_checkpoint_download(api_call *c);         /* GET|HEAD /checkpoint_archives/... (no key) */

/* A signed download URL (valid 2 h, bound to the caller's key) for the archive of a
 * checkpoint the caller may read, in fmt ("tinker", "peft", "peft-nohead"); audited.
 * 0 with *url (malloc'd) and its expiry (ISO 8601, RFC 1123), or -1 with the error
 * answered. The archive route (302) and the web console share it. */
int api_archive_link(api_call *c, const char *tinker_path, const char *fmt, char **url, char exp_iso[32],
                     char exp_http[64]);

/* POST /api/v1/copy_weights (§7.10): api_weights_ext.c. */
int api_h_copy_weights(api_call *c);
