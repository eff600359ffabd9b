/*
 * fuzz_hfconfig.c - fuzz target: a config.json (formats/hfconfig.c, qw_hparams_parse).
 *
 * Properties: the text is either refused with a message naming config.json, or the hyper-parameters are
 * consistent enough for the loader to size its arrays from them: positive sizes, a layer kind and an MoE
 * flag for every layer, PLE layers ascending inside the model.
 */
#include "fuzz_util.h"
#include "formats/hfconfig.h"
#include "models/arch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *txt = fz_strndup(data, size);
    char err[1024] = "";
    qw_hparams hp;
    memset(&hp, 0, sizeof(hp));
    qwenc_status st = qw_hparams_parse(&hp, txt, "fuzz/config.json", err, sizeof(err));
    fz_note("config", st, err);
    if (st) {
        FZ_CHECK_ERR(st, err, "fuzz/config.json");
    } else {
        FZ_CHECK(hp.arch < QW_ARCH_COUNT && strcmp(qw_arch_name(hp.arch), "?") != 0, "arch %d", (int)hp.arch);
        FZ_CHECK(hp.n_layer > 0 && hp.n_embd > 0 && hp.n_vocab > 0 && hp.n_head > 0 && hp.head_dim > 0,
                 "n_layer %d n_embd %d n_vocab %d n_head %d head_dim %d", hp.n_layer, hp.n_embd, hp.n_vocab, hp.n_head,
                 hp.head_dim);
        FZ_CHECK(hp.n_head_kv > 0 && hp.n_head % hp.n_head_kv == 0, "n_head %d n_head_kv %d", hp.n_head, hp.n_head_kv);
        FZ_CHECK(hp.layer_kind && hp.layer_moe, "no per-layer arrays");
        int n_kind[3] = {0};
        for (int i = 0; i < hp.n_layer; i++) {
            FZ_CHECK(hp.layer_kind[i] <= QW_LAYER_QSA, "layer %d kind %d", i, (int)hp.layer_kind[i]);
            n_kind[hp.layer_kind[i]]++;
            FZ_CHECK(hp.layer_moe[i] <= 1, "layer %d moe %d", i, hp.layer_moe[i]);
        }
        for (int i = 0; i < hp.n_ple; i++)
            FZ_CHECK(hp.ple_layers[i] >= 0 && hp.ple_layers[i] < hp.n_layer && (i == 0 || hp.ple_layers[i] > hp.ple_layers[i - 1]),
                     "ple layer %d = %d", i, hp.ple_layers[i]);
        FZ_CHECK(hp.n_rot >= 0 && hp.n_rot <= hp.head_dim, "n_rot %d head_dim %d", hp.n_rot, hp.head_dim);
    }
    qw_hparams_free(&hp);
    free(txt);
    return 0;
}
