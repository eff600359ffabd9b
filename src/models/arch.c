/*
 * arch.c - the architecture registry (arch.h): one line per architecture.
 */
#include "models/arch.h"

#include <string.h>

#include "models/model.h"

/* The fuzz targets (tests/fuzz) are built with QW_ARCH_TABLE_ONLY: the parsers need the names and flags, not the
 * binders and forwards (which would bring the whole engine into every fuzz program) */
#ifdef QW_ARCH_TABLE_ONLY
#define IMPL(tensors, forward, mtp) NULL, NULL, NULL
#else
#define IMPL(tensors, forward, mtp) tensors, forward, mtp
#endif

/* The DeltaNet architectures' GGUF layout: zero-centred norms stored as 1 + w */
#define GDN (QW_AF_GDN | QW_AF_QK_NORM | QW_AF_NORM_PLUS_ONE)

static const qw_arch_def archs[QW_ARCH_COUNT] = {
    [QW_ARCH_LLAMA] = {QW_ARCH_LLAMA, "llama", {"llama"}, "llama", IMPL(qw_llama_tensors, qw_llama_forward, NULL),
                       QW_AF_MLP | QW_AF_ROPE_INTERLEAVED | QW_AF_ROPE_FREQS | QW_AF_VOCAB_KEY},
    [QW_ARCH_QWEN3] = {QW_ARCH_QWEN3, "qwen3", {"qwen3"}, "qwen3", IMPL(qw_llama_tensors, qw_llama_forward, NULL),
                       QW_AF_MLP | QW_AF_QK_NORM},
    [QW_ARCH_QWEN35] = {QW_ARCH_QWEN35, "qwen3_5", {"qwen3_5", "qwen3_5_text"}, "qwen35",
                        IMPL(qw_qwen35_tensors, qw_qwen35_forward, qw_qwen35_mtp_forward), QW_AF_MLP | GDN | QW_AF_V_TILED | QW_AF_MROPE},
    [QW_ARCH_QWEN35_MOE] = {QW_ARCH_QWEN35_MOE, "qwen3_5_moe", {"qwen3_5_moe", "qwen3_5_moe_text"}, "qwen35moe",
                            IMPL(qw_qwen35_tensors, qw_qwen35_forward, qw_qwen35_mtp_forward),
                            QW_AF_MOE | QW_AF_TOPK_NORM | GDN | QW_AF_V_TILED | QW_AF_MROPE},
    [QW_ARCH_QWEN3_NEXT] = {QW_ARCH_QWEN3_NEXT, "qwen3_next", {"qwen3_next"}, "qwen3next",
                            IMPL(qw_qwen35_tensors, qw_qwen35_forward, qw_qwen35_mtp_forward), QW_AF_MOE_STEP | GDN | QW_AF_SSM_BA},
    [QW_ARCH_QWEN4EXP] = {QW_ARCH_QWEN4EXP, "qwen4_exp", {"qwen4_exp", "qwen4_exp_text"}, "qwen4exp",
                          IMPL(qw_qwen4exp_tensors, qw_qwen4exp_forward, qw_qwen4exp_mtp_forward),
                          QW_AF_MOE | GDN | QW_AF_QSA | QW_AF_HC | QW_AF_PLE | QW_AF_GATE_ACT | QW_AF_V_TILED |
                              QW_AF_MROPE},
};

const qw_arch_def *qw_arch_get(qw_arch a) {
    QW_ASSERT((unsigned)a < QW_ARCH_COUNT && archs[a].arch == a);
    return &archs[a];
}

const char *qw_arch_name(qw_arch a) { return (unsigned)a < QW_ARCH_COUNT ? archs[a].name : "?"; }

int qw_arch_from_model_type(const char *model_type, qw_arch *a) {
    for (int i = 0; i < QW_ARCH_COUNT; i++)
        for (int k = 0; k < 3 && archs[i].model_types[k]; k++)
            if (!strcmp(model_type, archs[i].model_types[k])) {
                *a = archs[i].arch;
                return 1;
            }
    return 0;
}

int qw_arch_from_gguf(const char *name, qw_arch *a) {
    for (int i = 0; i < QW_ARCH_COUNT; i++)
        if (!strcmp(name, archs[i].gguf)) {
            *a = archs[i].arch;
            return 1;
        }
    return 0;
}

const char *qw_arch_list(char *buf, size_t n, int gguf) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < QW_ARCH_COUNT; i++)
        for (int k = 0; k < (gguf ? 1 : 3); k++) {
            const char *s = gguf ? archs[i].gguf : archs[i].model_types[k];
            if (!s || at >= n) continue;
            int w = snprintf(buf + at, n - at, "%s%s", at ? ", " : "", s);
            if (w > 0) at += (size_t)w;
        }
    return buf;
}
