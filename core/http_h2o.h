/* http_h2o.h: the one place that includes h2o. Debian's libh2o-evloop is h2o built on its
 * own event loop, but its pkg-config file does not say so, and h2o's headers default to
 * the libuv layout of its structs; every file using h2o must include this instead. */
#pragma once
#ifndef H2O_USE_LIBUV
#define H2O_USE_LIBUV 0
#endif
#include <h2o.h>
#include <h2o/http1.h>
