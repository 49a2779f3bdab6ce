/* ChannelShuffle of rows of C contiguous float32 channels (kernels/cpu/shuffle.py):
 * y[r, j*g + i] = x[r, i*(C/g) + j]. Per row a (g, C/g) -> (C/g, g) transpose; with g a
 * constant (2, 3, 4, 8) the compiler turns the interleaving stores into vector shuffles,
 * where NumPy's copies write every g-th float of y (inner loops of stride g). A pure copy:
 * the bits of x. */
#include "native.h"

#define SHUFFLE_ROW(G)                                                                     \
    for (int64_t j = 0; j < cg; j++)                                                       \
        for (int64_t i = 0; i < (G); i++) yr[j * (G) + i] = xr[i * cg + j];

OW_CLONES
static void shuffle_rows(const float *x, float *y, int64_t r0, int64_t r1, int64_t c,
                         int64_t g) {
    const int64_t cg = c / g;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * c;
        float *yr = y + r * c;
        switch (g) {
        case 2: SHUFFLE_ROW(2) break;
        case 3: SHUFFLE_ROW(3) break;
        case 4: SHUFFLE_ROW(4) break;
        case 8: SHUFFLE_ROW(8) break;
        default: SHUFFLE_ROW(g) break;
        }
    }
}

void channel_shuffle_f32(const float *x, float *y, int64_t rows, int64_t c, int64_t g,
                         int n_threads) {
    OW_ROW_BLOCKS(rows, c, n_threads, rows * c, shuffle_rows(x, y, r0, r1, c, g));
}
