/* none.c - the CUDA backend's functions in a build without it (cuda.h): nothing is available. */
#include "cuda/cuda.h"

#include "core/common.h"

int qw_cuda_available(char *desc, size_t n) {
    if (desc && n) snprintf(desc, n, "this qwenc was built without the CUDA backend (make cuda)");
    return 0;
}

qwenc_status qw_backend_cuda_new(int device, qw_backend **out, char *err, size_t errlen) {
    (void)device;
    *out = NULL;
    return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED,
                  "the cuda backend is not built in: build qwenc with `make cuda` (needs the CUDA toolkit)");
}

void qw_backend_cuda_memory(const qw_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    *free_bytes = *total_bytes = 0;
}

double qw_backend_cuda_read_bandwidth(const qw_backend *be) {
    (void)be;
    return 0;
}

qwenc_status qw_backend_cuda_weights_adopt(qw_backend *be, const void *keys, size_t bytes, char *err, size_t errlen) {
    (void)be, (void)keys, (void)bytes;
    return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "the cuda backend is not built in");
}

void qw_backend_cuda_weights_random(qw_backend *be, const void *key, qw_type type, size_t bytes, uint64_t seed) {
    (void)be, (void)key, (void)type, (void)bytes, (void)seed;
}

void qw_backend_cuda_set_q8_activations(qw_backend *be, int on) { (void)be, (void)on; }
void qw_backend_cuda_set_ple_host(qw_backend *be, int on) { (void)be, (void)on; }
void qw_backend_cuda_set_dr_chunk(qw_backend *be, int min_tok) { (void)be, (void)min_tok; }

qwenc_status qw_backend_cuda_split(qw_backend *be, const int *devices, int n, const double *share, char *err,
                                   size_t errlen) {
    (void)be, (void)devices, (void)n, (void)share;
    return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "the cuda backend is not built in");
}
qwenc_status qw_backend_cuda_split_layers(qw_backend *be, const int *devices, int n, const int *stage, int n_layers,
                                          char *err, size_t errlen) {
    (void)be, (void)devices, (void)n, (void)stage, (void)n_layers;
    return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "the cuda backend is not built in");
}
int qw_backend_cuda_ranks(const qw_backend *be) { return (void)be, 0; }
void qw_backend_cuda_rank_info(const qw_backend *be, int r, int *device, size_t *free_bytes, size_t *total_bytes,
                               size_t *weight_bytes, int *first_layer, int *n_layers) {
    (void)be, (void)r;
    *device = -1, *free_bytes = *total_bytes = *weight_bytes = 0;
    *first_layer = *n_layers = 0;
}
double qw_backend_cuda_exchange_us(qw_backend *be, int n_tok, int H, int k, int n_layers) {
    (void)be, (void)n_tok, (void)H, (void)k, (void)n_layers;
    return 0;
}
