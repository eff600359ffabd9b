/*
 * tok_gguf.h - writing a Hugging Face tokenizer into a GGUF file as llama.cpp's tokenizer.* keys (tok_gguf.c;
 * reading goes through qwenc_tokenizer_load, which takes a .gguf as well as a directory).
 */
#ifndef QW_TOK_GGUF_H
#define QW_TOK_GGUF_H

#include "formats/gguf.h"
#include "qwenc.h"

/* Write dir's tokenizer (tokenizer.json, tokenizer_config.json, config.json, chat_template.jinja) into w:
 * tokenizer.ggml.model "gpt2", .pre, .tokens and .token_type padded to n_vocab ids (0: the tokenizer's own
 * count), .merges, the special ids, add_bos/add_eos_token, tokenizer.chat_template. *written = 0 and
 * QWENC_OK when dir has no tokenizer.json; a tokenizer llama.cpp cannot run the same way is an error saying
 * why (QWENC_ERR_UNSUPPORTED), and nothing is written. */
qwenc_status qw_tok_gguf_write(qw_gguf_writer *w, const char *dir, int n_vocab, int *written, char *err,
                               size_t errlen);
/* The same for tokenizer t, already loaded from dir (whose config files give the special ids). */
qwenc_status qw_tok_gguf_put(qw_gguf_writer *w, const qwenc_tokenizer *t, const char *dir, int n_vocab, char *err,
                             size_t errlen);

#endif
