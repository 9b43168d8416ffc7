/* the CPU emulation of tests/gpu/emu: see run_emu.sh (__half, as lcu_elementwise.cu reads it) */
#include "emu.h"
struct __half { unsigned short __x; };
static inline float __half2float(__half h)
{
    unsigned s = h.__x >> 15, e = (h.__x >> 10) & 31, m = h.__x & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
