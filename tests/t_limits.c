/*
 * t_limits.c - headers that claim more than their file holds: safetensors shapes, offsets and header lengths,
 * tokenizer.json ids. Each must be refused with a message that names the file (and the tensor or field), before
 * anything of the claimed size is allocated; the fuzz targets of tests/fuzz found the first of them. (GGUF's are
 * in t_gguf.c, chat template limits in t_template.c.)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/safetensors.h"
#include "qwenc.h"
#include "test_util.h"

static char tmpdir[600];

/* A safetensors file of one header (padded to 8 bytes) and data_bytes zero bytes. */
static void write_st(const char *path, const char *header, uint64_t claimed_len, size_t data_bytes) {
    FILE *f = fopen(path, "wb");
    size_t hl = strlen(header), pad = (8 - hl % 8) % 8;
    uint64_t len = claimed_len ? claimed_len : hl + pad;
    fwrite(&len, 8, 1, f);
    fwrite(header, 1, hl, f);
    for (size_t i = 0; i < pad + data_bytes; i++) fputc(i < pad ? ' ' : 0, f);
    fclose(f);
}

static void expect_st_error(const char *label, const char *header, uint64_t claimed_len, size_t data_bytes,
                            const char *want1, const char *want2) {
    char path[700];
    snprintf(path, sizeof(path), "%s/model.safetensors", tmpdir);
    write_st(path, header, claimed_len, data_bytes);
    qw_weightset ws;
    memset(&ws, 0, sizeof(ws));
    char err[1024] = "";
    qwenc_status st = qw_weightset_add_file(&ws, path, err, sizeof(err));
    CHECK(st == QWENC_ERR_FORMAT && strstr(err, path) && strstr(err, want1) && (!want2 || strstr(err, want2)),
          "%s: status %d, message '%s' (expected '%s' and '%s')", label, (int)st, err, want1, want2 ? want2 : "");
    qw_weightset_free(&ws);
    remove(path);
}

static void test_safetensors(void) {
    expect_st_error("header length of 2^63", "{}", 1ull << 63, 0, "header length 9223372036854775808", "exceeds");
    expect_st_error("header length of 2^64 - 1", "{}", UINT64_MAX, 0, "exceeds the file size", NULL);
    expect_st_error("shape entry 1e300", "{\"w\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0, 4]}}", 0,
                    4, "tensor 'w'", "shape entry 0 is not a size");
    expect_st_error("negative shape entry", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -2], \"data_offsets\": [0, 4]}}",
                    0, 4, "tensor 'w'", "shape entry 1 is not a size");
    expect_st_error("shape of 2^120 elements",
                    "{\"w\": {\"dtype\": \"F32\", \"shape\": [1099511627776, 1099511627776, 1099511627776], "
                    "\"data_offsets\": [0, 4]}}",
                    0, 4, "tensor 'w'", "overflows");
    expect_st_error("shape of an unknown dtype overflowing",
                    "{\"w\": {\"dtype\": \"X9\", \"shape\": [4294967296, 4294967296, 4294967296], \"data_offsets\": [0, 4]}}",
                    0, 4, "tensor 'w'", "overflows");
    expect_st_error("shape of 2^62 elements over 8 bytes",
                    "{\"w\": {\"dtype\": \"F32\", \"shape\": [2147483648, 2147483648], \"data_offsets\": [0, 8]}}", 0, 8,
                    "tensor 'w'", "data_offsets span 8");
    expect_st_error("data offset 1e30", "{\"w\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 1e30]}}", 0, 8,
                    "tensor 'w'", "bad data_offsets");
    expect_st_error("data offset 2^40", "{\"w\": {\"dtype\": \"U8\", \"shape\": [1099511627776], "
                    "\"data_offsets\": [0, 1099511627776]}}", 0, 8, "tensor 'w'", "extends past the end");
    expect_st_error("fractional data offset", "{\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0.5, 1.5]}}",
                    0, 8, "tensor 'w'", "bad data_offsets");
    /* a shard index that names no tensor */
    char path[700], err[1024] = "";
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", tmpdir);
    FILE *f = fopen(path, "wb");
    fputs("{\"metadata\": {}, \"weight_map\": {}}", f);
    fclose(f);
    qw_weightset ws;
    qwenc_status st = qw_weightset_open_dir(&ws, tmpdir, err, sizeof(err));
    CHECK(st == QWENC_ERR_FORMAT && strstr(err, path) && strstr(err, "empty"), "empty weight_map: status %d, '%s'", (int)st,
          err);
    qw_weightset_free(&ws);
    remove(path);
}

/* A tokenizer directory holding tokenizer.json = json; the error of loading it must name the file and want. */
static void expect_tok_error(const char *label, const char *json, const char *want) {
    char path[700];
    snprintf(path, sizeof(path), "%s/tokenizer.json", tmpdir);
    FILE *f = fopen(path, "wb");
    fputs(json, f);
    fclose(f);
    qwenc_tokenizer *t = NULL;
    char err[1024] = "";
    qwenc_status st = qwenc_tokenizer_load(tmpdir, &t, err, sizeof(err));
    CHECK(st == QWENC_ERR_FORMAT && !t && strstr(err, path) && strstr(err, want),
          "%s: status %d, message '%s' (expected '%s')", label, (int)st, err, want);
    qwenc_tokenizer_free(t);
    remove(path);
}

static void test_tokenizer_json(void) {
    /* ids index dense arrays: one id of 10^9 would be gigabytes for a 60-byte file */
    expect_tok_error("vocabulary id 10^9", "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1000000000}, \"merges\": []}}",
                     "far beyond the 2 tokens");
    expect_tok_error("added token id 10^9",
                     "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": [{\"id\": 1000000000, "
                     "\"content\": \"<s>\", \"special\": true}]}",
                     "far beyond the 2 tokens");
    expect_tok_error("post-processor id outside the vocabulary",
                     "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"post_processor\": {\"type\": "
                     "\"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {}}], "
                     "\"special_tokens\": {\"<s>\": {\"ids\": [1e12]}}}}",
                     "not a token id");
    expect_tok_error("added token of invalid UTF-8",
                     "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": [{\"id\": 1, "
                     "\"content\": \"\xff\", \"special\": false}]}",
                     "not valid UTF-8");
    /* a replacement inserted into the text must be valid UTF-8: the regexes run on it unchecked (an invalid
     * Metaspace replacement made PCRE2's JIT read outside the text) */
    expect_tok_error("Metaspace replacement of invalid UTF-8",
                     "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Sequence\", "
                     "\"pretokenizers\": [{\"type\": \"Metaspace\", \"replacement\": \"\xe2\xff\"}, {\"type\": \"Digits\"}]}}",
                     "pre_tokenizer.pretokenizers[0]: a replacement string is not valid UTF-8");
    expect_tok_error("Prepend of invalid UTF-8",
                     "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": {\"type\": \"Prepend\", "
                     "\"prepend\": \"\xc3\"}}",
                     "normalizer: a replacement string is not valid UTF-8");
}

int main(void) {
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/qwenc_t_limits_XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir)) {
        printf("cannot create a directory under %s\n0 passed, 1 failed\n", t && *t ? t : "/tmp");
        return 1;
    }
    test_safetensors();
    test_tokenizer_json();
    rmdir(tmpdir);
    return test_summary();
}
