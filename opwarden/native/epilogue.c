/* GEMM epilogues applied in place over a row-major float32 output: y = act(y + bias). */
#include "native.h"

#include <math.h>

enum { ACT_NONE, ACT_RELU, ACT_GELU };

void bias_act_f32(float *y, const float *bias, int64_t rows, int64_t cols, int act,
                  int n_threads) {
    /* Large outputs split by rows; a single row (a decode step) splits by columns. */
    const int64_t chunk = rows > 1 ? 1 : 1024;
    const int64_t n_chunks = rows > 1 ? rows : (cols + chunk - 1) / chunk;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n_threads > 1 && rows * cols >= 32768)
#endif
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t r = rows > 1 ? c : 0;
        int64_t j0 = rows > 1 ? 0 : c * chunk;
        int64_t j1 = rows > 1 ? cols : (j0 + chunk < cols ? j0 + chunk : cols);
        float *row = y + r * cols;
        if (act == ACT_RELU) {
            for (int64_t j = j0; j < j1; j++) {
                float v = row[j] + (bias ? bias[j] : 0.0f);
                row[j] = v > 0.0f ? v : 0.0f;
            }
        } else if (act == ACT_GELU) {
            for (int64_t j = j0; j < j1; j++) {
                float v = row[j] + (bias ? bias[j] : 0.0f);
                row[j] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
            }
        } else {
            for (int64_t j = j0; j < j1; j++) row[j] += bias ? bias[j] : 0.0f;
        }
    }
    (void)n_threads;
}
