/* clock.h: the clocks every part reads, in seconds as a double. clock_mono_s for
 * intervals, deadlines and ages (CLOCK_MONOTONIC never steps back when the wall clock is
 * set); clock_wall_s for times compared with another wall-clock reading (h2o's request
 * timestamps) or shown as a date. */
#pragma once
#include <time.h>

static inline double clock_mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double clock_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
