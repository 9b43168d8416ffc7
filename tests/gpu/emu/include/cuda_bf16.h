/* the CPU emulation of tests/gpu/emu: see run_emu.sh */
#include "emu.h"
