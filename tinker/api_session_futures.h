/* api_session_futures.h: the per-sampling-session futures routes of SDK 0.26+
 * (api_session_futures.c; docs/protocol.md §4.4–§4.6). */
#pragma once
#include "core/api_call.h"

int api_h_retrieve_futures(api_call *c);        /* POST /retrieve_futures (long poll) */
int api_h_cancel_future(api_call *c);           /* POST /cancel_future */
int api_h_join_sampling_session(api_call *c);   /* POST /join_sampling_session */
